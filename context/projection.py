"""Records → what a render of one thread hides or replaces (DESIGN §3 step 3).

A record applies only when everything it covers lies on the rendered path (branch isolation
for free). The applicable summary hides the turns it covers behind one marker; collapses do
the same per segment unless undone; snips hide whole turns; time-based clears and evidence
replace single tool results. Cache-aware clears change nothing here: the provider applies them.

Whatever the records say, a render never hides the path's protected turns (the active turn,
the latest complete turn, every turn holding a running function). Tiers only cover turns that
are removable on the path they cut, but a record also applies to every branch forked after its
covered nodes, and there those turns can be the latest ones: a record touching one is not
applied there (a snip skips just that turn; evidence names the turn of its result).
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable
from typing import Any

import attrs

from .graph import Graph, Path, Record
from .turns import Turn, is_complete

# record kinds (the log's vocabulary)
SUMMARY = "summary"
COLLAPSE = "collapse"
UNCOLLAPSE = "uncollapse"
SNIP = "snip"
CLEAR = "clear"
EVIDENCE = "evidence"
ABANDON = "abandon"  # calls an imported transcript left without a result when it ended
USAGE = "usage"
NOTE = "note"
REACTIVE = "reactive"
IDLE = "idle"
CONTEXT_KINDS = frozenset({SUMMARY, COLLAPSE, UNCOLLAPSE, SNIP, CLEAR, EVIDENCE, ABANDON})


@attrs.define
class Projection:
    summary: Record | None = None
    summary_turns: frozenset[str] = frozenset()  # start ids of whole turns the summary replaces
    # a summary that also replaces the earlier part of one turn: (that turn's start id, the
    # last thread node it replaces); the turn's first node (the request) stays before it
    summary_through: tuple[str, str] | None = None
    snipped: dict[str, Record] = attrs.field(factory=dict)  # turn start id -> snip
    collapsed: dict[str, Record] = attrs.field(factory=dict)  # turn start id -> collapse
    cleared: dict[str, Record] = attrs.field(factory=dict)  # tool node id -> time-based clear
    cleared_inputs: dict[str, Record] = attrs.field(factory=dict)  # tool id -> inputs shortened
    # the same two, cleared by the provider (Tier 1's server path): the messages sent keep
    # them, the model does not see them
    cache_cleared: dict[str, Record] = attrs.field(factory=dict)
    cache_cleared_inputs: dict[str, Record] = attrs.field(factory=dict)
    evidence: dict[str, Record] = attrs.field(factory=dict)  # tool node id -> evidence
    abandoned: frozenset[str] = frozenset()  # tool node ids that will never get a result
    applied: list[Record] = attrs.field(factory=list)

    def key(self) -> tuple[Any, ...]:
        return tuple(r.id for r in self.applied)

    @property
    def server_clears(self) -> bool:
        return bool(self.cache_cleared or self.cache_cleared_inputs)

    def as_seen(self, results: Iterable[str], inputs: Iterable[str]) -> Projection:
        """What the model sees once the provider cleared these tool nodes' results and
        inputs (the provider's rule may reach calls no record names: it clears a prefix)."""
        records = [*self.cache_cleared.values(), *self.cache_cleared_inputs.values()]
        fallback = records[-1] if records else None
        if fallback is None:
            return self

        def marked(ids: Iterable[str], own: dict[str, Record]) -> dict[str, Record]:
            return {i: own.get(i, fallback) for i in ids}

        return attrs.evolve(
            self,
            cleared={**marked(results, self.cache_cleared), **self.cleared},
            cleared_inputs={**marked(inputs, self.cache_cleared_inputs), **self.cleared_inputs},
            cache_cleared={},
            cache_cleared_inputs={},
        )


def applicable(graph: Graph, path: Path, kinds: frozenset[str] = CONTEXT_KINDS) -> list[Record]:
    return [r for r in graph.records if r.kind in kinds and graph.record_applies(r, path)]


def project(graph: Graph, path: Path, extra: list[Record] | None = None) -> Projection:
    """The projection of the records applicable to `path` (plus `extra`, in-memory records a
    tier is trying out before it decides to write them)."""
    proj = Projection()
    records = applicable(graph, path)
    if extra:
        records = records + [r for r in extra if graph.record_applies(r, path)]
    undone = {r.data.get("collapse") for r in records if r.kind == UNCOLLAPSE}
    guard: frozenset[str] = frozenset()
    if any(r.kind in _GUARDED for r in records):
        guard = protected_starts(graph, path)
    for rec in records:
        kind = rec.kind
        if kind == SUMMARY and rec.data.get("through"):
            # a summary inside a turn replaces the latest turns by design (keeping the turn's
            # request and its newest exchanges): in force wherever something follows its cut
            if rec.data["through"] == path.head:
                continue
            starts = rec.data.get("turns", [])
        elif kind in _GUARDED and guard.intersection(rec.data.get("turns", [])):
            if kind != SNIP:
                continue  # it would hide a protected turn of this path: not in force here
            starts = [s for s in rec.data.get("turns", []) if s not in guard]
            if not starts:
                continue
        else:
            starts = rec.data.get("turns", [])
        if kind == SUMMARY:
            # the rolling summary in force is the newest one; it folds the older ones in
            if proj.summary is None or rec.seq >= proj.summary.seq:
                proj.summary = rec
        elif kind == COLLAPSE:
            if rec.id in undone:
                continue
            for start in starts:
                proj.collapsed[start] = rec
        elif kind == SNIP:
            for start in starts:
                proj.snipped[start] = rec
        elif kind == CLEAR:
            server = rec.data.get("mode") == "cache"
            results = proj.cache_cleared if server else proj.cleared
            inputs = proj.cache_cleared_inputs if server else proj.cleared_inputs
            for node_id in rec.data.get("results", rec.covers):
                results.setdefault(node_id, rec)
            for node_id in rec.data.get("inputs", ()):
                inputs.setdefault(node_id, rec)
        elif kind == ABANDON:
            proj.abandoned = proj.abandoned | frozenset(rec.covers)
        elif kind == EVIDENCE:
            for node_id in rec.covers:
                proj.evidence[node_id] = rec
        proj.applied.append(rec)
    if proj.summary is not None:
        data = proj.summary.data
        proj.summary_turns = frozenset(data.get("turns", []))
        if data.get("through") and data.get("partialTurn"):
            proj.summary_through = (data["partialTurn"], data["through"])
    return proj


_TURN_KINDS = frozenset({SUMMARY, COLLAPSE, SNIP})
# evidence stands for a result its summary replaced: on a fork where the result's turn is
# protected (the summary is not in force there), the result shows as it was
_GUARDED = _TURN_KINDS | {EVIDENCE}


def protected_starts(graph: Graph, path: Path) -> frozenset[str]:
    """Start ids of the turns of `path` no record may hide: the active (last) turn, the latest
    complete turn and every turn holding a running function (what `turns.plan_cuts` protects
    with `keep_complete=1`), found without walking every turn."""
    bounds = path.turn_bounds()
    if not bounds:
        return frozenset()
    ids = path.line.ids
    out = {ids[bounds[-1][0]]}
    for i in range(len(bounds) - 1, -1, -1):
        start, end = bounds[i]
        if is_complete(graph, path, Turn(i, start, end, ids[start], True)):
            out.add(ids[start])
            break
    if graph.running:
        starts = [b[0] for b in bounds]
        for fid in graph.running:
            at = thread_index(graph, fid, path)
            if at is not None:
                out.add(ids[starts[bisect.bisect_right(starts, at) - 1]])
    return frozenset(out)


def thread_index(graph: Graph, node_id: str, path: Path) -> int | None:
    """The index in `path` of the thread node that `node_id` hangs under, if any."""
    node = graph.nodes[node_id]
    if path.owner is None:
        return path.index(node.anchor) if node.anchor in path else None
    cur = node
    while not (cur.is_thread and cur.owner == path.owner):
        if cur.parent is None:
            return None
        cur = graph.nodes[cur.parent]
    return path.index(cur.id) if cur.id in path else None
