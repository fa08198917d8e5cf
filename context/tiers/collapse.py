"""Tier 3 — Context Collapse: segments of 5–10 old turns, each summarized once (~100–300
tokens), projected over the originals at read time. Reversible: `context/uncollapse` writes an
`uncollapse` record and the originals show again.

It runs when the request is still over the cascade threshold after Snip (the spec's "about
90 %"), before the rolling summary, and commits segments until the request is at the run's
target; while it holds the headroom, auto-compact waits, and runs only when collapse cannot
bring the request under `collapse_block` (~95 %). Collapse works on the turns Snip may remove
(same protections); with the spec's order (Snip first) it has material when Snip is disabled
for a session or could not reach its target.
"""

from __future__ import annotations

from ..projection import COLLAPSE
from ..summarizer.generate import Limits, generate
from ..summarizer.input import Range
from ..summarizer.instructions import collapse_system
from ..summarizer.types import Steps, SummaryFailure
from ..turns import Turn, turn_node_ids
from .base import Run, TierEvent, llm_bar
from .snip import removable_turns

TIER = "collapse"


def segments(turns: list[Turn], min_turns: int, max_turns: int) -> list[list[Turn]]:
    """Runs of consecutive turns cut into segments of `min_turns`..`max_turns`, oldest first."""
    runs: list[list[Turn]] = []
    for turn in turns:
        if runs and runs[-1][-1].index + 1 == turn.index:
            runs[-1].append(turn)
        else:
            runs.append([turn])
    out: list[list[Turn]] = []
    for seq in runs:
        for i in range(0, len(seq), max_turns):
            piece = seq[i : i + max_turns]
            if len(piece) >= min_turns:
                out.append(piece)
    return out


def available(run: Run) -> bool:
    return bool(run.policy.collapse_enabled and run.provider is not None)


def due(run: Run) -> bool:
    """Over the LLM tiers' bar after the cheaper tiers, as the rolling summary
    (`summaryWhen`), with collapse on and a provider to ask."""
    return available(run) and run.total > llm_bar(run)


def apply(run: Run) -> Steps[None]:
    """Summarize segments of old turns, oldest first, until the request is at the run's
    target; a failure or a segment that frees nothing stops here with its reason."""
    policy = run.policy
    commit_at = run.target
    proj = run.rendered.projection
    pool = removable_turns(run.graph, run.path, proj, policy)
    candidates = segments(pool, policy.collapse_min_turns, policy.collapse_max_turns)
    if not candidates:
        run.note(TIER, f"no run of {policy.collapse_min_turns}+ old turns to collapse")
        return
    for seg in candidates:
        if run.total <= commit_at:
            break
        covers = [i for t in seg for i in turn_node_ids(run.graph, run.path, t)]
        rng = Range(seg, seg, covers)
        inp = run.summary_input(rng)
        try:
            text, usage = yield from generate(
                inp,
                purpose=TIER,
                system=collapse_system(policy.collapse_summary_tokens),
                max_output=policy.collapse_summary_tokens,
                model=policy.summary_model or None,
                limits=Limits.of(policy, run.engine.clock),  # the time bound, per segment
                ratio=run.rendered.ratio,
            )
        except SummaryFailure as failed:
            run.failed(TIER, failed)
            return
        before = run.total
        run.propose(
            {
                "kind": COLLAPSE,
                "covers": covers,
                "thread": run.thread,
                "data": {
                    "text": text,
                    "turns": [t.start_id for t in seg],
                    "usage": usage,
                    "provider": run.provider,
                },
            },
            TierEvent(
                TIER,
                f"over the threshold after Snip: collapsed {len(seg)} turns into a segment summary",
                details={
                    "turns": len(seg),
                    "provider": run.provider,
                    "calls": usage.get("calls", 0),
                    "inputTokens": usage.get("inputTokens", 0),
                    "outputTokens": usage.get("outputTokens", 0),
                },
            ),
        )
        if run.total >= before:
            run.retract()
            run.note(TIER, "no gain from a segment summary; nothing was written", attempted=True)
            return


def holds_headroom(run: Run) -> bool:
    """Auto-compact waits while collapse keeps the request under its blocking limit."""
    if not available(run):
        return False
    collapsed = any(e.tier == TIER and e.applied for e in run.events) or bool(
        run.rendered.projection.collapsed
    )
    return collapsed and run.total <= int(run.policy.collapse_block * run.limit)
