"""Records → what a render of one thread hides or replaces (DESIGN §3 step 3).

A record applies only when everything it covers lies on the rendered path (branch isolation
for free). The applicable summary hides the turns it covers behind one marker; collapses do
the same per segment unless undone; snips hide whole turns; time-based clears and evidence
replace single tool results. Cache-aware clears change nothing here: the provider applies them.
"""

from __future__ import annotations

from typing import Any

import attrs

from .graph import Graph, Path, Record

# record kinds (the log's vocabulary)
SUMMARY = "summary"
COLLAPSE = "collapse"
UNCOLLAPSE = "uncollapse"
SNIP = "snip"
CLEAR = "clear"
EVIDENCE = "evidence"
USAGE = "usage"
NOTE = "note"
REACTIVE = "reactive"
CONTEXT_KINDS = frozenset({SUMMARY, COLLAPSE, UNCOLLAPSE, SNIP, CLEAR, EVIDENCE})


@attrs.define
class Projection:
    summary: Record | None = None
    summary_turns: frozenset[str] = frozenset()  # start ids of turns the summary replaces
    snipped: dict[str, Record] = attrs.field(factory=dict)  # turn start id -> snip
    collapsed: dict[str, Record] = attrs.field(factory=dict)  # turn start id -> collapse
    cleared: dict[str, Record] = attrs.field(factory=dict)  # tool node id -> time-based clear
    cache_cleared: dict[str, Record] = attrs.field(factory=dict)  # tool id -> provider clear
    evidence: dict[str, Record] = attrs.field(factory=dict)  # tool node id -> evidence
    applied: list[Record] = attrs.field(factory=list)

    def key(self) -> tuple[Any, ...]:
        return tuple(r.id for r in self.applied)


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
    for rec in records:
        kind = rec.kind
        if kind == SUMMARY:
            # the rolling summary in force is the newest one; it folds the older ones in
            if proj.summary is None or rec.seq >= proj.summary.seq:
                proj.summary = rec
        elif kind == COLLAPSE:
            if rec.id in undone:
                continue
            for start in rec.data.get("turns", []):
                proj.collapsed[start] = rec
        elif kind == SNIP:
            for start in rec.data.get("turns", []):
                proj.snipped[start] = rec
        elif kind == CLEAR:
            target = proj.cache_cleared if rec.data.get("mode") == "cache" else proj.cleared
            for node_id in rec.covers:
                target.setdefault(node_id, rec)
        elif kind == EVIDENCE:
            for node_id in rec.covers:
                proj.evidence[node_id] = rec
        proj.applied.append(rec)
    if proj.summary is not None:
        proj.summary_turns = frozenset(proj.summary.data.get("turns", []))
    return proj
