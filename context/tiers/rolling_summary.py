"""Tier 4 — the rolling summary (spec "Current rolling-summary constraints", DESIGN §5).

- The replaceable range is a prefix of whole top-level turns, priced with its visible
  subcalls. The latest `summary_keep_turns` (2) complete turns and the active turn stay; if
  that still leaves the request over budget, only the latest turn stays. A turn holding a
  running function is never replaced; a collapse segment is never split.
- The input starts at the range's first message and holds the prior summary that applies to
  this branch, every original user request (also of snipped turns) and every visible tool
  result as rendered. The record's `covers` and the input describe the same range.
- A range longer than one summarizer call is summarized in budgeted chunks that fold a
  rolling summary (`compactd.context.summarizer`).
- After generation the replacement is tried in memory and kept only if the request gets
  strictly smaller; otherwise (or on failure, cancellation, an empty summary) nothing is
  written. One rolling summary is in force per branch: the newest applicable one, which folds
  the previous one in. HEAD never moves.
- The marker keeps every user request of the range verbatim and the latest assistant text
  (the checkpoint rules), whatever the provider wrote.
"""

from __future__ import annotations

from typing import Any

from ..graph import Graph, Path
from ..projection import SUMMARY, Projection
from ..render.conversation import Conversation
from ..summarizer.generate import Limits, generate
from ..summarizer.input import Range, SummaryInput, build_input
from ..summarizer.instructions import checkpoint_system
from ..summarizer.types import Steps, SummaryFailure, SummaryResult
from ..turns import plan_cuts, turn_node_ids, turns_of
from .base import Run, TierEvent

TIER = "summary"


# ---- choosing the range ---------------------------------------------------------------------


def select_replaceable_range(
    graph: Graph, path: Path, proj: Projection, keep_complete: int
) -> Range | None:
    """The prefix of whole turns a summary may replace, keeping the active turn and the
    latest `keep_complete` complete turns (and anything after a running function)."""
    turns = turns_of(path)
    if not turns:
        return None
    plan = plan_cuts(graph, path, keep_first_turn=False, keep_complete=keep_complete, turns=turns)
    boundary = min(plan.protected) if plan.protected else len(turns)
    # never split a collapse segment
    for rec in {id(r): r for r in proj.collapsed.values()}.values():
        indexes = [t.index for t in turns if t.start_id in rec.data.get("turns", [])]
        if indexes and min(indexes) < boundary <= max(indexes):
            boundary = min(indexes)
    chosen = turns[:boundary]
    if not chosen:
        return None
    new = [t for t in chosen if t.start_id not in proj.summary_turns]
    covers: list[str] = []
    for turn in chosen:
        covers.extend(turn_node_ids(graph, path, turn))
    return Range(chosen, new, covers)


def range_cost(conv: Conversation, rng: Range, proj: Projection) -> int:
    """Tokens the range costs in the current request (its turns, markers and prior summary)."""
    indexes = {t.index for t in rng.turns}
    return sum(m.tokens for m in conv.messages if m.turn in indexes)


def summary_budget(run: Run) -> int:
    """How long the summary may be: `summaryMaxTokens` (the spec's 2,000–5,000), but never
    more than a tenth of what the request may hold — a 5K summary would crowd a 32K window."""
    return max(500, min(run.policy.summary_max_tokens, run.limit // 10))


def generate_checkpoint(
    run: Run, inp: SummaryInput, instructions: str | None
) -> Steps[tuple[str, dict[str, Any]]]:
    """The rolling summary of `inp`, written the one way Tier 4 and background preparation
    both use (same prompt, budget and model, so a prepared one is what Tier 4 would write)."""
    return (
        yield from generate(
            inp,
            purpose="rolling",
            system=checkpoint_system(instructions),
            max_output=summary_budget(run),
            model=run.policy.summary_model or None,
            limits=Limits.of(run.policy),
        )
    )


# ---- the tier ---------------------------------------------------------------------------------


def choose_range(run: Run) -> Range | None:
    """The range Tier 4 replaces: before the latest `summaryKeepTurns` complete turns; when
    that still leaves the request over its threshold, before the latest complete turn only
    (the spec's "retain the latest turn" — the latest complete user turn is always kept). With
    nothing to summarize, short history under the threshold is left alone."""
    policy, proj = run.policy, run.rendered.projection
    rng = select_replaceable_range(run.graph, run.path, proj, policy.summary_keep_turns)
    cost = range_cost(run.rendered.conversation, rng, proj) if rng and rng.new_turns else 0
    cost = round(cost * run.rendered.ratio)  # calibrated, like run.total
    estimate = run.total - cost + min(policy.summary_max_tokens, max(1, cost // 4))
    if estimate > run.threshold:
        wider = select_replaceable_range(run.graph, run.path, proj, 1)
        if (
            wider is not None
            and wider.new_turns
            and (rng is None or len(wider.turns) > len(rng.turns))
        ):
            rng = wider
    return rng if rng is not None and rng.new_turns else None


def due(run: Run) -> bool:
    """Still over the threshold after the cheaper tiers (or `/compact`, which jumps here)."""
    return run.total > run.threshold


def apply(run: Run, *, manual: bool = False, instructions: str | None = None) -> Steps[None]:
    """Replace the range before the retained turns with one rolling summary — only if the
    request gets strictly smaller; otherwise (or on failure) nothing is written."""
    policy = run.policy
    if run.provider is None:
        run.note(
            TIER,
            "no summary provider is configured (COMPACTD_SUMMARY_PROVIDER or the "
            "session's summaryProvider); the LLM tiers were skipped",
        )
        return
    proj = run.rendered.projection
    rng = choose_range(run)
    if rng is None:
        run.note(
            TIER,
            "short history: nothing before the retained turns to summarize; the "
            "provider was not called",
        )
        return
    inp = build_input(run.graph, run.path, proj, run.rendered.conversation, rng, run.engine.counter)
    model = policy.summary_model or None
    prepared = run.engine.prepared_summary(run.session.id, inp.digest, model)
    try:
        if prepared is not None:
            text, usage = prepared.text, {"calls": 0, "reused": True, "model": prepared.model}
        else:
            text, usage = yield from generate_checkpoint(run, inp, instructions)
    except SummaryFailure as failed:
        run.note(TIER, f"{failed.message}; nothing was written", failed=True)
        return
    data: dict[str, Any] = {
        "text": text,
        "turns": [t.start_id for t in rng.turns],
        "userRequests": inp.user_requests,
        "lastAssistant": inp.last_assistant,
        "provider": run.provider,
        "inputHash": inp.digest,
        "inputTokens": inp.tokens,
        "usage": usage,
    }
    if proj.summary is not None:
        data["prior"] = proj.summary.id
    if instructions:
        data["instructions"] = instructions
    before = run.total
    run.propose(
        {"kind": SUMMARY, "covers": rng.covers, "data": data, "thread": run.thread},
        TierEvent(
            TIER,
            ("/compact" if manual else "over threshold after the cheaper tiers")
            + f": summarized {len(rng.turns)} turn(s)",
            details={
                "coveredTurns": len(rng.turns),
                "provider": run.provider,
                "calls": usage.get("calls", 0),
                "inputTokens": usage.get("inputTokens", 0),
                "outputTokens": usage.get("outputTokens", 0),
                "reused": prepared is not None,
                "manual": manual,
            },
        ),
    )
    after = run.total
    if after >= before:
        run.retract()
        run.note(
            TIER,
            f"no gain: with the summary the request would need {after:,} tokens, "
            f"not fewer than {before:,}; nothing was written",
        )


def prepare(run: Run) -> Steps[bool]:
    """Background preparation: summarize the range the next Tier 4 would replace and keep the
    result in memory (`Engine.keep_prepared`); nothing is written."""
    policy = run.policy
    proj = run.rendered.projection
    rng = choose_range(run)  # the very range the next Tier 4 would take
    if rng is None:
        return False
    inp = build_input(run.graph, run.path, proj, run.rendered.conversation, rng, run.engine.counter)
    model = policy.summary_model or None
    if run.engine.has_prepared(run.session.id, inp.digest, model):
        return False  # already prepared for this very range (a stale one is replaced below)
    try:
        text, usage = yield from generate_checkpoint(run, inp, None)
    except SummaryFailure:
        return False
    run.engine.keep_prepared(
        run.session.id,
        inp.digest,
        model,
        SummaryResult(text=text, model=str(usage.get("model") or "")),
    )
    return True
