"""Driving the engine's cascade for a front: summary providers, progress, cancellation,
notifications.

The engine's cascade (and background preparation, and a replay) is a generator that yields
`SummaryNeeded`; `drive` is the one loop that answers each with the session's provider for
every caller. A cancelled request (`$/cancelRequest`) closes the generator before its final
commit, so nothing is written. One cascade runs per session at a time.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import tempfile
import time
from collections.abc import Callable
from typing import Any, TypeVar

from ..context.engine import Engine, RenderParams
from ..context.errors import InvalidContent, Stopped
from ..context.policy import policy_from_config
from ..context.render.request import Rendered
from ..context.replay import ReplayOptions, ReplayReport, replay
from ..context.stores import FileStore
from ..context.summarizer.driver import drive as drive_sync
from ..context.summarizer.driver import drive_async
from ..context.summarizer.types import Answer, Steps, SummaryFailure, SummaryNeeded
from ..context.tiers.base import Outcome, TierEvent
from ..context.tiers.reactive import Overflow, parse_overflow
from ..context.tiers.rolling_summary import TIER
from ..protocol.types import CompactResult, ProviderError, ReplayParams
from .app import App, settle
from .stoppable import Stop, run_stoppable

log = logging.getLogger("compactd.daemon")
T = TypeVar("T")
STOP_POLL_SECONDS = 0.2  # how soon a replay waiting on a summary hears it was cancelled


async def drive(
    app: App,
    session_id: str,
    steps: Steps[T],
    *,
    provider: str | None,
    token: str | None = None,
    title: str = "compactd: compacting",
    describe: Callable[[SummaryNeeded, int], str] = lambda need, n: (
        f"{need.tier}: summary call {n}"
    ),
) -> T:
    """Run `steps` to its end, answering each summary request with `provider` and reporting
    it as `$/progress` on the client's `token`."""
    calls = 0
    async with app.front.progress(token, title) as report:

        async def answer(need: SummaryNeeded) -> Answer:
            nonlocal calls
            calls += 1
            report(describe(need, calls))
            return await answer_one(app, session_id, provider, need)

        return await drive_async(steps, answer)


async def cascade(
    app: App,
    session_id: str,
    steps: Steps[Outcome],
    token: str | None,
    *,
    manual: bool = False,
    dry_run: bool = False,
) -> Outcome:
    """One cascade, under the session's lock. Every change it wrote is notified, and every
    compaction that did nothing after all (a summary that failed or gained nothing; with
    `manual`, the /compact's summary whatever it did), with `applied: false`. A preview
    (`dry_run`) wrote nothing and notifies nothing."""
    provider = app.engine.provider_for(app.engine.session(session_id))
    async with app.registry.lock(session_id):
        outcome = await drive(app, session_id, steps, provider=provider, token=token)
    for event in outcome.events:
        if dry_run:
            break
        wrote = event.applied and event.record_ids
        if wrote or event.details.get("attempted") or (manual and event.tier == TIER):
            app.notify_compacted(session_id, event)
    if outcome.record_ids:
        settle()  # what the compaction left is long-lived: out of the collector's full passes
    return outcome


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
    dry_run: bool = False,
) -> tuple[Rendered, list[TierEvent]]:
    """The cascade for one render; `overflow` (given with the render) takes precedence over
    `reported` (what `context/reportUsage` kept for this render). A `dry_run` writes
    nothing."""
    parsed = parse_overflow(overflow.status, overflow.message) if overflow else reported
    if overflow is not None and parsed is None:
        raise InvalidContent(
            f"overflow: a {overflow.status} error that is not a prompt-too-long report "
            "(HTTP 413, or 400 'prompt is too long: N tokens > M maximum')",
            field="overflow",
        )
    steps = app.engine.cascade(session_id, params, overflow=parsed, dry_run=dry_run)
    outcome = await cascade(app, session_id, steps, token, dry_run=dry_run)
    return outcome.rendered, outcome.events


async def compact(
    app: App, session_id: str, params: RenderParams, instructions: str | None, token: str | None
) -> CompactResult:
    """`/compact`: Tier 4 now. A provider failure, no gain or nothing to summarize is a result
    (`applied: false`, both token counts, the reason, and for a failure its kind), not an
    error; nothing is written then. A cancellation is still an error (−32800)."""
    steps = app.engine.cascade(session_id, params, manual=True, instructions=instructions)
    outcome = await cascade(app, session_id, steps, token, manual=True)
    summary = next((e for e in outcome.events if e.tier == TIER), None)
    applied = bool(summary and summary.applied)
    return CompactResult(
        applied=applied,
        tokens_before=outcome.tokens_before,
        tokens_after=outcome.rendered.total,
        reason=summary.reason if summary else "nothing to summarize",
        provider=app.engine.provider_for(app.engine.session(session_id)),
        covered_turns=summary.details.get("coveredTurns", 0) if applied and summary else 0,
        failure=summary.details.get("failure") if summary else None,
    )


async def prepare_summary(app: App, session_id: str, params: RenderParams) -> bool:
    """Background preparation of the Tier 4 summary while the session is idle: the result
    stays in memory and the next cascade commits it only for an identical source range. It
    holds no lock — renders, appends and compactions go on meanwhile; what it prepared is kept
    only if its range is still current when it is done."""
    steps = app.engine.prepare(session_id, params)
    if steps is None:
        return False
    provider = app.engine.provider_for(app.engine.session(session_id))
    prepared = await drive(app, session_id, steps, provider=provider)
    if not prepared:
        log.info("no background summary prepared for %s", session_id)
    return prepared


async def replay_transcript(app: App, p: ReplayParams) -> dict[str, Any]:
    """`session/replay`: the replay runs in a scratch store of its own (the user's sessions
    are not touched), answering summary requests with the chosen provider."""
    from ..context.importers import load_transcript

    policy_from_config(p.config)  # a misspelled knob fails before minutes of replay
    # read in a worker thread, as an import is: the loop keeps answering meanwhile
    sessions = await asyncio.to_thread(load_transcript, p.path, app.engine.limits.max_import_bytes)
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

            with tempfile.TemporaryDirectory(prefix="compactd-replay-") as scratch:
                store = FileStore(scratch)
                engine = Engine(store, defaults=app.engine.defaults, summary_provider=provider)
                work = replay(engine, sessions[p.index], options, stopped)
                return drive_sync(work, answer_here)

        result = await run_stoppable(run)
    return result.to_json()
