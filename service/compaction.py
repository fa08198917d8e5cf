"""Driving the engine's cascade for a front: summary providers, progress, cancellation,
notifications.

The engine's cascade (and background preparation, and a replay) is a generator that yields
`SummaryNeeded`; `drive` is the one loop that answers each with the session's provider for
every caller. Each stretch of the generator between two summary requests (rendering, trying
tiers, the final commit) runs off the loop in the session's turn (`work.py`); the provider is
awaited on the loop, outside the turn, so the session's other requests go on meanwhile. A
cancelled request (`$/cancelRequest`) closes the generator before its final commit, so
nothing is written. One cascade runs per session at a time.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import time
from collections.abc import Callable
from typing import Any, TypeVar

import attrs

from ..context.engine import Engine, RenderParams
from ..context.errors import InvalidContent, Stopped
from ..context.policy import policy_from_config
from ..context.render.request import Rendered
from ..context.replay import ReplayOptions, ReplayReport, replay
from ..context.session import Session
from ..context.stores import FileStore
from ..context.summarizer.driver import drive as drive_sync
from ..context.summarizer.types import Answer, Steps, SummaryFailure, SummaryNeeded
from ..context.tiers.base import Outcome, TierEvent
from ..context.tiers.reactive import Overflow, parse_overflow
from ..context.tiers.rolling_summary import TIER
from ..protocol.types import CompactResult, ProviderError, ReplayParams
from .app import App, settle
from .scratch import scratch
from .stoppable import Stop, run_stoppable

log = logging.getLogger("compactd.daemon")
T = TypeVar("T")
STOP_POLL_SECONDS = 0.2  # how soon a replay waiting on a summary hears it was cancelled


@attrs.frozen
class _Done:
    """The generator's return value, carried out of a worker (a StopIteration cannot be)."""

    value: Any


Start = Callable[[], tuple[str | None, Steps[T]]]
"""What a drive begins with, in the session's turn: the summary provider to answer with, and
the steps (a cascade, a preparation)."""


async def drive(
    app: App,
    session_id: str,
    start: Start[T],
    *,
    token: str | None = None,
    title: str = "compactd: compacting",
    describe: Callable[[SummaryNeeded, int], str] = lambda need, n: (
        f"{need.tier}: summary call {n}"
    ),
) -> T:
    """Run the steps `start()` makes to their end, each stretch in the worker in the
    session's turn (one hop for a cascade that needs no summary), answering each summary
    request with the provider `start` named and reporting it as `$/progress` on the client's
    `token`."""
    calls = 0
    steps: Steps[T] | None = None
    provider: str | None = None

    def advance(reply: Answer | None) -> SummaryNeeded | _Done:
        nonlocal steps, provider
        try:
            if steps is None:
                provider, steps = start()
                return next(steps)
            return steps.send(reply)
        except StopIteration as stop:
            return _Done(stop.value)

    async with app.front.progress(token, title) as report:
        need: SummaryNeeded | _Done | None = None
        try:
            need = await app.work.run(session_id, lambda: advance(None))
            while not isinstance(need, _Done):
                calls += 1
                report(describe(need, calls))
                reply = await answer_one(app, session_id, provider, need)
                need = await app.work.run(session_id, lambda reply=reply: advance(reply))
            return need.value  # type: ignore[no-any-return]
        finally:
            if steps is not None and not isinstance(need, _Done):
                # left early: closed where it ran, in its turn, so nothing is written
                await app.work.run(session_id, steps.close)


async def cascade(
    app: App,
    session_id: str,
    make: Callable[[Session], Steps[Outcome]],
    token: str | None,
    *,
    touch: bool = False,
    manual: bool = False,
    dry_run: bool = False,
) -> tuple[Outcome, str | None]:
    """One cascade, under the session's lock. Every change it wrote is notified, and every
    compaction that did nothing after all (a summary that failed or gained nothing; with
    `manual`, the /compact's summary whatever it did), with `applied: false`. A preview
    (`dry_run`) wrote nothing and notifies nothing. `touch`: the client's activity is kept in
    the same stretch as the cascade's end (`App.touch`). Returns the outcome and the summary
    provider it was given."""
    provider: str | None = None

    def start() -> tuple[str | None, Steps[Outcome]]:
        nonlocal provider
        session = app.session(session_id)  # loaded, caught up, and in use

        def steps() -> Steps[Outcome]:
            outcome = yield from make(session)
            if touch:
                app.touch(session)
            return outcome

        provider = app.engine.provider_for(session)
        return provider, steps()

    async with app.registry.lock(session_id):
        outcome = await drive(app, session_id, start, token=token)
    for event in outcome.events:
        if dry_run:
            break
        wrote = event.applied and event.record_ids
        if wrote or event.details.get("attempted") or (manual and event.tier == TIER):
            app.notify_compacted(session_id, event)
    if outcome.record_ids:
        settle()  # what the compaction left is long-lived: out of the collector's full passes
    return outcome, provider


async def answer_one(
    app: App, session_id: str, provider_name: str | None, need: SummaryNeeded
) -> Answer:
    if provider_name is None:
        return SummaryFailure("unavailable", "no summary provider is configured")
    deadline = need.request.deadline
    remaining = None if deadline is None else deadline - time.time()
    if remaining is not None and remaining <= 0:
        return SummaryFailure("timeout", "the summary ran past its time bound")
    try:
        provider = app.provider(provider_name, session_id)
        # the whole summary's time bound: this call stops waiting when it runs out
        return await asyncio.wait_for(provider.summarize(need.request), remaining)
    except TimeoutError:
        return SummaryFailure(
            "timeout", "the summary ran past its time bound (summaryTimeBoundSeconds)"
        )
    except SummaryFailure as failure:
        return failure


async def render_with_cascade(
    app: App,
    session_id: str,
    params: RenderParams,
    overflow: ProviderError | None,
    reported: Overflow | None,
    token: str | None,
    *,
    touch: bool = False,
    dry_run: bool = False,
) -> tuple[Rendered, list[TierEvent]]:
    """The cascade for one render; `overflow` (given with the render) takes precedence over
    `reported` (what `context/reportUsage` kept for this render). `touch`: see `cascade`. A
    `dry_run` writes nothing."""
    parsed = parse_overflow(overflow.status, overflow.message) if overflow else reported
    if overflow is not None and parsed is None:
        raise InvalidContent(
            f"overflow: a {overflow.status} error that is not a prompt-too-long report "
            "(HTTP 413, or 400 'prompt is too long: N tokens > M maximum')",
            field="overflow",
        )
    outcome, _provider = await cascade(
        app,
        session_id,
        lambda session: app.engine.cascade(session.id, params, overflow=parsed, dry_run=dry_run),
        token,
        touch=touch,
        dry_run=dry_run,
    )
    return outcome.rendered, outcome.events


async def compact(
    app: App, session_id: str, params: RenderParams, instructions: str | None, token: str | None
) -> CompactResult:
    """`/compact`: Tier 4 now. A provider failure, no gain or nothing to summarize is a result
    (`applied: false`, both token counts, the reason, and for a failure its kind), not an
    error; nothing is written then. A cancellation is still an error (−32800)."""
    outcome, provider = await cascade(
        app,
        session_id,
        lambda session: app.engine.cascade(
            session.id, params, manual=True, instructions=instructions
        ),
        token,
        manual=True,
    )
    summary = next((e for e in outcome.events if e.tier == TIER), None)
    applied = bool(summary and summary.applied)
    return CompactResult(
        applied=applied,
        tokens_before=outcome.tokens_before,
        tokens_after=outcome.rendered.total,
        reason=summary.reason if summary else "nothing to summarize",
        provider=provider,
        covered_turns=summary.details.get("coveredTurns", 0) if applied and summary else 0,
        failure=summary.details.get("failure") if summary else None,
    )


async def prepare_summary(app: App, session_id: str, params: RenderParams) -> bool:
    """Background preparation of the Tier 4 summary while the session is idle: the result
    stays in memory and the next cascade commits it only for an identical source range. It
    holds no lock — renders, appends and compactions go on meanwhile; what it prepared is kept
    only if its range is still current when it is done."""

    def start() -> tuple[str | None, Steps[bool]]:
        # the engine's session, not the registry's: preparing is no use, so it never keeps
        # an idle session from being evicted
        session = app.engine.session(session_id)
        steps = app.engine.prepare(session_id, params)
        return app.engine.provider_for(session), steps if steps is not None else _nothing()

    prepared = await drive(app, session_id, start)
    if not prepared:
        log.info("no background summary prepared for %s", session_id)
    return prepared


def _nothing() -> Steps[bool]:
    """Steps that ask for no summary and prepare nothing."""
    return False
    yield  # a generator


async def replay_transcript(app: App, p: ReplayParams) -> dict[str, Any]:
    """`session/replay`: the replay runs in a scratch store of its own (the user's sessions
    are not touched), answering summary requests with the chosen provider."""
    from ..context.importers import load_transcript

    policy_from_config(p.config)  # a misspelled knob fails before minutes of replay
    # read in a worker thread, as an import is: the loop keeps answering meanwhile
    max_bytes = app.engine.limits.max_import_bytes
    sessions = await app.work.run(None, lambda: load_transcript(p.path, max_bytes))
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
        model=p.model,
        system_tokens=p.system_tokens,
        ratio=p.ratio,
        write_price=p.write_price,
    )
    loop = asyncio.get_running_loop()
    async with app.front.progress(p.work_done_token, "compactd: replaying") as report:

        async def answer(need: SummaryNeeded) -> Answer:
            report(f"{need.tier} summary")
            return await answer_one(app, "replay", provider, need)

        def run(stopped: Stop) -> ReplayReport:
            """In a worker thread (the loop goes on answering, and hears a cancel): the
            summaries are asked on the loop, a cancel is seen before each step."""

            def answer_here(need: SummaryNeeded) -> Answer:
                pending = asyncio.run_coroutine_threadsafe(answer(need), loop)
                while True:
                    try:
                        return pending.result(timeout=STOP_POLL_SECONDS)
                    except concurrent.futures.TimeoutError:
                        if stopped():
                            pending.cancel()
                            raise Stopped("the replay was stopped") from None

            # under the data dir, so one a killed daemon leaves is swept at the next start
            with scratch(app.settings.data_dir, "replay") as folder:
                store = FileStore(folder)
                engine = Engine(store, defaults=app.engine.defaults, summary_provider=provider)
                work = replay(engine, sessions[p.index], options, stopped)
                return drive_sync(work, answer_here)

        result = await run_stoppable(run)
    return result.to_json()
