"""Tier 2 — Snip: remove whole turns, oldest first, until the request is under its target.

A turn goes whole — the user message, the assistant's replies and every tool call with its
result — so pairing cannot break. Never removed: the active turn, the latest complete turn,
a turn holding a running function, any turn of a running function's own thread, and the
session's first user turn (configurable). A snip
is a record over the graph; nothing is deleted, and it applies only to the branch whose path
holds the snipped turns. Completed functions go with their turn, in order, like anything else.
"""

from __future__ import annotations

from typing import Any

from ..graph import Graph, Path
from ..policy import Policy
from ..projection import SNIP, Projection
from ..render.conversation import Conversation
from ..turns import Turn, plan_cuts, turn_node_ids
from .base import Run, TierEvent

TIER = "snip"

MARKER_ALLOWANCE = 40  # tokens a snip marker costs (checked by the re-render)


def removable_turns(graph: Graph, path: Path, proj: Projection, policy: Policy) -> list[Turn]:
    """Visible turns Snip may remove, oldest first. None in the own thread of a function still
    running: its turns are active content, and active content is not deleted (spec §2.1) —
    in any view (a turn holding a running function is protected by `plan_cuts` already)."""
    if path.owner is not None and path.owner in graph.running:
        return []
    plan = plan_cuts(graph, path, keep_first_turn=policy.snip_keep_first_turn)
    hidden = set(proj.summary_turns) | set(proj.snipped) | set(proj.collapsed)
    return [t for t in plan.removable() if t.start_id not in hidden]


def turn_tokens(conv: Conversation) -> dict[int, int]:
    """Tokens each rendered turn costs in the request."""
    out: dict[int, int] = {}
    for msg in conv.messages:
        if msg.turn >= 0 and msg.kind == "turn":
            out[msg.turn] = out.get(msg.turn, 0) + msg.tokens
    return out


def choose(turns: list[Turn], costs: dict[int, int], excess: int) -> list[Turn]:
    """The fewest oldest turns whose removal frees `excess` tokens (plus a marker)."""
    chosen: list[Turn] = []
    freed = -MARKER_ALLOWANCE
    for turn in turns:
        if freed >= excess:
            break
        chosen.append(turn)
        freed += costs.get(turn.index, 0)
    return chosen


def snip_record(
    graph: Graph, path: Path, turns: list[Turn], reason: str, thread: str | None
) -> dict[str, Any]:
    covers: list[str] = []
    for turn in turns:
        covers.extend(turn_node_ids(graph, path, turn))
    return {
        "kind": SNIP,
        "covers": covers,
        "data": {"turns": [t.start_id for t in turns], "reason": reason},
        "thread": thread,
    }


# ---- the tier ---------------------------------------------------------------------------------


def due(run: Run) -> bool:
    """Still over the run's target after Tier 1 (the cascade calls it once over threshold)."""
    return run.total > run.target


def apply(run: Run, target: int | None = None, reason: str = "over threshold") -> None:
    """Remove the fewest oldest removable turns that bring the request to `target` (default:
    the run's target), as one snip record; say why when nothing can go."""
    goal = run.target if target is None else target
    if not run.policy.snip_enabled:
        run.note(TIER, "snip is disabled for this session")
        return
    start = run.total
    if start <= goal:
        run.note(TIER, f"already under the target ({start:,} ≤ {goal:,} tokens); nothing removed")
        return
    chosen_all: list[Turn] = []
    for _ in range(64):  # every pass removes at least one turn; bounded all the same
        if run.total <= goal:
            break
        removable = removable_turns(run.graph, run.path, run.rendered.projection, run.policy)
        # calibrated like run.total, or a ratio above 1 removes turns it did not need to
        ratio = run.rendered.ratio
        costs = {k: round(v * ratio) for k, v in turn_tokens(run.rendered.conversation).items()}
        chosen = choose(removable, costs, run.total - goal)
        if not chosen:
            break
        if chosen_all:
            run.retract()  # one snip record per run, covering every chosen turn
        chosen_all.extend(chosen)
        run.propose(
            snip_record(run.graph, run.path, chosen_all, reason, run.thread),
            TierEvent(
                TIER,
                f"{reason}: removed the {len(chosen_all)} oldest removable turn(s)",
                details={
                    "removedTurns": len(chosen_all),
                    "turns": [t.start_id for t in chosen_all],
                },
            ),
        )
    if chosen_all and run.total >= start:
        # the turns cost less than the marker that would replace them
        run.retract()
        run.note(
            TIER,
            f"no gain: removing the {len(chosen_all)} removable turn(s) would not make the "
            "request smaller; nothing was removed",
        )
    elif chosen_all:
        run.events[-1].tokens_before = start
    else:
        run.note(
            TIER,
            "no removable turn: what is left is the active turn, the latest "
            "complete turn, the first user turn or a running function",
        )


def on_demand(run: Run, target: int) -> None:
    """`context/snip`: Tier 2 alone, down to `target` tokens."""
    apply(run, target, reason=f"snip requested to {target:,} tokens")
