"""Tier 2 — Snip: remove whole turns, oldest first, until the request is under its target.

A turn goes whole — the user message, the assistant's replies and every tool call with its
result — so pairing cannot break. Never removed: the active turn, the latest complete turn,
a turn holding a running function, and the session's first user turn (configurable). A snip
is a record over the graph; nothing is deleted, and it applies only to the branch whose path
holds the snipped turns. Completed functions go with their turn, in order, like anything else.
"""

from __future__ import annotations

from typing import Any

from .graph import Graph, Path
from .projection import SNIP, Projection
from .render.conversation import Conversation
from .tool_aging.policy import Policy
from .turns import Turn, plan_cuts, turn_node_ids

MARKER_ALLOWANCE = 40  # tokens a snip marker costs (checked by the re-render)


def removable_turns(graph: Graph, path: Path, proj: Projection, policy: Policy) -> list[Turn]:
    """Visible turns Snip may remove, oldest first."""
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
