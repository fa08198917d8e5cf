"""Turns: the only places where history may be cut, and which of them no tier may touch.

A turn is a non-meta user node plus everything after it up to the next one (DESIGN §2); a
leading run before the first user node is a turn of its own. Every tier that removes or
replaces history asks this module where it may cut and what it must keep — so a tool call is
never separated from its result and the latest turns are never touched.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterator

import attrs

from .graph import Graph, Node, Path


@attrs.frozen(slots=True)
class Turn:
    index: int
    start: int  # index in the path of its first thread node
    end: int  # one past its last thread node
    start_id: str
    user_start: bool  # starts with a non-meta user node (not a leading preamble)


def turns_of(path: Path) -> list[Turn]:
    ids = path.line.ids
    starts = path.line.turn_starts
    preamble = not starts or starts[0] != 0  # the first turn does not start with a user node
    return [
        Turn(i, start, end, ids[start], not (i == 0 and preamble))
        for i, (start, end) in enumerate(path.turn_bounds())
    ]


def thread_nodes(graph: Graph, path: Path, turn: Turn) -> Iterator[Node]:
    for node_id in path.line.ids[turn.start : turn.end]:
        yield graph.nodes[node_id]


def turn_node_ids(graph: Graph, path: Path, turn: Turn) -> list[str]:
    """Every node a record covering this turn lists: thread nodes and the calls under them
    (a function called as a tool comes with its call)."""
    out: list[str] = []
    for node in thread_nodes(graph, path, turn):
        out.append(node.id)
        for call in graph.calls_of(node):
            out.append(call.id)
            if call.function is not None:
                out.append(call.function)
    return out


def has_running(graph: Graph, path: Path, turn: Turn, *, pending: bool = True) -> bool:
    """A running function (or, with `pending`, a call still waiting in the last turn) lives
    in this turn."""
    last = pending and turn.end == path.length
    for node in thread_nodes(graph, path, turn):
        for call in graph.calls_of(node):
            fn = graph.nodes[call.function] if call.function else call
            if fn.kind == "function" and fn.status == "running":
                return True
            if last and call.kind == "tool" and not call.answered:
                return True
    return False


def is_complete(graph: Graph, path: Path, turn: Turn) -> bool:
    """A finished exchange. An earlier turn is complete: the conversation moved on past it (a
    function still running in it protects that turn by itself). The last turn is complete
    once an assistant message in it ended without calls — and stays so when the agent carries
    on in it (a hook's meta message, another tool loop). So the latest complete turn only
    moves forward — unless the agent starts a function from the very message that had ended
    the turn, which makes it a call after all."""
    if turn.end < path.length:
        return True
    return any(answered(graph, graph.nodes[n]) for n in path.line.ids[turn.start : turn.end])


def answered(graph: Graph, node: Node) -> bool:
    """An assistant message that ended without calls: its turn was complete there. A function
    it started (`function/start` with `parent`) is a call like a tool's — the request shows it
    as one — so that message handed work on, it did not answer."""
    return node.kind == "assistant" and not node.calls


def running_turns(graph: Graph, path: Path, turns: list[Turn]) -> list[int]:
    """Indices of the turns `has_running` holds true for, without walking every turn: from
    the session's running functions (and the last turn's pending calls)."""
    out: set[int] = set()
    starts = [t.start for t in turns]
    for fid in graph.running:
        holder = graph.nodes[graph.nodes[fid].parent or fid]
        if holder.kind == "tool" and holder.function == fid and holder.parent is not None:
            holder = graph.nodes[holder.parent]  # a function called as a tool: its call's node
        if holder.is_thread and holder.id in path:
            out.add(turns[bisect.bisect_right(starts, path.index(holder.id)) - 1].index)
    if turns and has_running(graph, path, turns[-1]):
        out.add(turns[-1].index)
    return sorted(out)


@attrs.frozen
class CutPlan:
    """Which turns a tier may remove, replace or summarize."""

    turns: list[Turn]
    protected: frozenset[int]
    reasons: dict[int, str]

    def removable(self) -> list[Turn]:
        return [t for t in self.turns if t.index not in self.protected]


def plan_cuts(
    graph: Graph,
    path: Path,
    *,
    keep_first_turn: bool,
    keep_complete: int = 1,
    turns: list[Turn] | None = None,
) -> CutPlan:
    """The turns no tier may touch: the active (last) turn, the latest `keep_complete`
    complete turns, every turn holding a running function, and — if asked — the session's
    first user turn (the task statement)."""
    turns = turns if turns is not None else turns_of(path)
    reasons: dict[int, str] = {}
    if not turns:
        return CutPlan(turns, frozenset(), reasons)
    last = turns[-1].index
    reasons[last] = "active turn"
    found = 0
    for turn in reversed(turns):
        if found >= keep_complete:
            break
        if is_complete(graph, path, turn):
            reasons.setdefault(turn.index, "latest complete turn")
            found += 1
    for index in running_turns(graph, path, turns):
        reasons.setdefault(index, "running function")
    if keep_first_turn:
        first = next((t for t in turns if t.user_start), None)
        if first is not None:
            reasons.setdefault(first.index, "first user turn (the task)")
    return CutPlan(turns, frozenset(reasons), reasons)
