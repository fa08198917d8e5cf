"""Driving the engine's cascade from the daemon: summary providers, progress, cancellation,
notifications.

The engine's cascade is a generator that yields `SummaryNeeded`; here each one is answered by
the session's provider. A cancelled request (`$/cancelRequest`) closes the generator before
its final commit, so nothing is written. One cascade runs per session at a time.
"""

from __future__ import annotations

import contextlib
import logging
import tempfile
from collections.abc import AsyncIterator
from typing import Any

from lsprotocol.types import WorkDoneProgressBegin, WorkDoneProgressEnd, WorkDoneProgressReport

from ..context.cascade import Drive, Outcome, SummaryNeeded
from ..context.engine import Engine, RenderParams
from ..context.errors import InvalidContent, ProviderFailure
from ..context.reactive import Overflow, parse_overflow
from ..context.render.request import Rendered
from ..context.replay import ReplayOptions, replay
from ..context.store import Store
from ..context.summarize import SummaryFailure, SummaryResult
from ..protocol.types import CompactResult, ProviderError, ReplayParams
from .app import App

log = logging.getLogger("compactd.daemon")


async def drive(app: App, session_id: str, gen: Drive, token: str | None) -> Outcome:
    """Run a cascade, answering its summary requests with the session's provider."""
    session = app.engine.session(session_id)
    provider_name = app.engine.provider_for(session)
    calls = 0
    async with (
        app.registry.lock(session_id),
        progress(app, token, "compactd: compacting") as report,
    ):
        try:
            need = next(gen)
            while True:
                calls += 1
                report(f"{need.tier}: summary call {calls}")
                answer = await answer_one(app, session_id, provider_name, need)
                need = gen.send(answer)
        except StopIteration as stop:
            outcome: Outcome = stop.value
        except BaseException:
            gen.close()
            raise
    for event in outcome.events:
        if event["applied"]:
            app.notify_compacted(session_id, event)
    return outcome


async def answer_one(
    app: App, session_id: str, provider_name: str | None, need: SummaryNeeded
) -> SummaryResult | SummaryFailure:
    if provider_name is None:
        return SummaryFailure("unavailable", "no summary provider is configured")
    try:
        provider = app.provider(provider_name, session_id)
        return await provider.summarize(need.request)
    except SummaryFailure as failure:
        return failure


@contextlib.asynccontextmanager
async def progress(app: App, token: str | None, title: str) -> AsyncIterator[Any]:
    """`$/progress` for a client-chosen work-done token (nothing without one)."""
    if token is None:
        yield lambda message: None
        return
    wdp = app.server.work_done_progress
    wdp.begin(token, WorkDoneProgressBegin(title=title, cancellable=True, percentage=0))

    def report(message: str) -> None:
        wdp.report(token, WorkDoneProgressReport(message=message))

    try:
        yield report
    finally:
        wdp.end(token, WorkDoneProgressEnd(message="done"))
        wdp.tokens.pop(token, None)  # pygls never forgets a token otherwise


async def render_with_cascade(
    app: App,
    session_id: str,
    params: RenderParams,
    overflow: ProviderError | None,
    reported: Overflow | None,
    token: str | None,
) -> tuple[Rendered, list[dict[str, Any]]]:
    """The cascade for one render; `overflow` (given with the render) takes precedence over
    `reported` (what `context/reportUsage` kept for this render)."""
    parsed = parse_overflow(overflow.status, overflow.message) if overflow else reported
    if overflow is not None and parsed is None:
        raise InvalidContent(
            f"overflow: a {overflow.status} error that is not a prompt-too-long report "
            "(HTTP 413, or 400 'prompt is too long: N tokens > M maximum')",
            field="overflow",
        )
    gen = app.engine.cascade(session_id, params, overflow=parsed)
    outcome = await drive(app, session_id, gen, token)
    return outcome.rendered, outcome.events


async def compact(
    app: App, session_id: str, params: RenderParams, instructions: str | None, token: str | None
) -> CompactResult:
    """`/compact`: Tier 4 now. A failure or no gain is a result (applied=false) with the
    reason, not an error; nothing is written then."""
    gen = app.engine.cascade(session_id, params, manual=True, instructions=instructions)
    outcome = await drive(app, session_id, gen, token)
    summary = next((e for e in outcome.events if e["tier"] == "summary"), None)
    applied = bool(summary and summary["applied"])
    if summary is not None and not applied and summary["details"].get("failed"):
        raise ProviderFailure(summary["reason"], tier="summary")
    return CompactResult(
        applied=applied,
        tokens_before=outcome.tokens_before,
        tokens_after=outcome.rendered.total,
        reason=summary["reason"] if summary else "nothing to summarize",
        provider=app.engine.provider_for(app.engine.session(session_id)),
        covered_turns=summary["details"].get("coveredTurns", 0) if applied and summary else 0,
    )


async def prepare_summary(app: App, session_id: str, params: RenderParams) -> bool:
    """Background preparation of the Tier 4 summary while the session is idle: the result
    stays in memory and the next cascade commits it only for an identical source range."""
    gen = app.engine.prepare(session_id, params)
    if gen is None:
        return False
    name = app.engine.provider_for(app.engine.session(session_id))
    async with app.registry.lock(session_id):
        try:
            need = next(gen)
            while True:
                answer = await answer_one(app, session_id, name, need)
                if isinstance(answer, SummaryFailure):
                    log.info("background summary for %s failed: %s", session_id, answer)
                    gen.close()
                    return False
                need = gen.send(answer)
        except StopIteration as stop:
            return bool(stop.value)
        except BaseException:
            gen.close()
            raise


async def replay_transcript(app: App, p: ReplayParams) -> dict[str, Any]:
    """`session/replay`: the replay runs in a scratch store of its own (the user's sessions
    are not touched), answering summary requests with the chosen provider."""
    from ..context.importers import load_transcript

    sessions = load_transcript(p.path)
    if not 0 <= p.index < len(sessions):
        raise InvalidContent(
            f"the transcript holds {len(sessions)} session(s); index {p.index} does not exist",
            field="index",
        )
    provider = p.summary_provider or app.engine.summary_provider
    options = ReplayOptions(
        window=p.window,
        reserve=p.reserve,
        ttl=p.ttl,
        config=dict(p.config or {}),
        baseline=p.baseline,
    )
    with tempfile.TemporaryDirectory(prefix="compactd-replay-") as scratch:
        engine = Engine(Store(scratch), defaults=app.engine.defaults, summary_provider=provider)
        gen = replay(engine, sessions[p.index], options)
        async with progress(app, p.work_done_token, "compactd: replaying") as report:
            try:
                need = next(gen)
                while True:
                    report(f"{need.tier} summary")
                    need = gen.send(await answer_one(app, "replay", provider, need))
            except StopIteration as stop:
                result = stop.value
            except BaseException:
                gen.close()
                raise
    return result.to_json()
