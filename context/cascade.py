"""The cascade (DESIGN §4, spec §1 and §5): the order of the tiers and the gates between them.

Budget Reduction happens in every render. Then Tiers 1 → 2 → 3 → 4, each only when its own
condition (`due`) holds, re-measuring after each and advancing only while the request is
over its threshold; Tier 5 (a provider's overflow report) re-enters with a tighter target.
What each tier does is in `compactd.context.tiers`; this file says only when.

A generator, so the engine stays pure: an LLM tier yields `SummaryNeeded` and the driver
answers. Tiers propose drafts; nothing is written until the end, in one commit, so a cancelled
or failed run writes nothing. A tier that frees nothing says why and the cascade moves on or
stops — it never loops.
"""

from __future__ import annotations

from typing import Any

from .errors import CannotFit
from .render.request import RequestSpec
from .session import Session
from .summarizer.types import Steps
from .tiers import collapse, microcompact, reactive, rolling_summary, snip
from .tiers.base import Outcome, Run
from .tiers.reactive import Overflow
from .visibility import ViewOptions

Drive = Steps[Outcome]


def run_cascade(
    engine: Any,
    session: Session,
    view: ViewOptions,
    spec: RequestSpec,
    *,
    summary_provider: str | None = None,
    overflow: Overflow | None = None,
    manual: bool = False,
    instructions: str | None = None,
    commit: bool = True,
) -> Drive:
    """Run the cascade; returns the final render and the events of every tier. Without
    `commit` (a preview) the drafts are rendered and reported but never written."""
    run = Run(engine, session, view, spec, engine.policy(session), summary_provider)
    before = run.total
    if overflow is not None:  # Tier 5: the provider said the last request was too long
        reactive.apply(run, overflow)
    if manual:  # /compact jumps straight to Tier 4
        yield from rolling_summary.apply(run, manual=True, instructions=instructions)
    else:
        yield from _automatic(run)
    if run.total > run.limit:
        raise _cannot_fit(run)
    if overflow is not None:  # what goes out must not be the request the provider refused
        reactive.verify(run)
    return run.outcome(before, run.commit() if commit else [])


def _automatic(run: Run) -> Steps[None]:
    # once over the threshold, every tier that runs frees down to the target (headroom: the
    # next compaction is many requests away, and a change is not repeated request after
    # request, each one re-writing the cache)
    pressed = run.total > run.threshold
    if microcompact.due(run):
        microcompact.apply(run)
    if pressed and snip.due(run):
        snip.apply(run)
    if pressed and collapse.due(run):  # Tier 3 before the full summary
        yield from collapse.apply(run)
    # …and a run that changed the prefix under it (a warm clear) may bring the summary along
    # when the summary pays for its call (`rolling_summary.buys_runway`): one rewrite for both
    if (pressed or run.pending) and rolling_summary.due(run) and not collapse.holds_headroom(run):
        # a snip of this very run is still a draft: let the summary see those turns whole
        # instead of only their user requests; snip again if the summary was not enough
        withdrawn = run.withdraw(snip.TIER) if run.provider is not None else False
        if withdrawn:
            run.note(
                snip.TIER,
                "withdrawn: the rolling summary is tried first, so the turns "
                "this snip would have dropped reach the summarizer whole",
            )
        yield from rolling_summary.apply(run)
        if withdrawn and snip.due(run):
            snip.apply(run)
    if microcompact.last_resort_due(run):
        microcompact.last_resort(run)
    if microcompact.newest_inputs_due(run):
        microcompact.shorten_newest_inputs(run)
    if microcompact.headroom_only(run):  # a forced clear that nothing else needed
        microcompact.keep_if_paid(run)


def _cannot_fit(run: Run) -> CannotFit:
    reasons = [e.reason for e in run.events if not e.applied]
    budget = run.rendered.budget
    why_limit = (
        f"window {budget.window:,} − output reserve {budget.output_reserve:,}"
        if run.limit == budget.limit
        else f"the provider's overflow report, less a {run.policy.reactive_margin:.0%} margin"
    )
    return CannotFit(
        f"the request needs {run.total:,} tokens but only {run.limit:,} fit "
        f"({why_limit}); nothing more can be removed: "
        + ("; ".join(reasons) or "every remaining turn is protected"),
        tokens=run.total,
        limit=run.limit,
        events=run.events,
    )
