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
import sys
from collections.abc import Iterable
from typing import Any

import attrs

from .graph import Graph, Line, Path, Record
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
PASSTHROUGH = "passthrough"  # a request the proxy sent on as its client wrote it, and why
CONTEXT_KINDS = frozenset({SUMMARY, COLLAPSE, UNCOLLAPSE, SNIP, CLEAR, EVIDENCE, ABANDON})


_HIDING = frozenset({SUMMARY, COLLAPSE, UNCOLLAPSE, SNIP})
"""The records that hide whole turns (`hidden_runs`)."""


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
    # tool node id -> why, for the time-based clears of superseded results (their placeholder
    # says why; one the provider clears too shows the provider's)
    superseded: dict[str, str] = attrs.field(factory=dict)
    evidence: dict[str, Record] = attrs.field(factory=dict)  # tool node id -> evidence
    abandoned: frozenset[str] = frozenset()  # tool node ids that will never get a result
    applied: list[Record] = attrs.field(factory=list)
    # derived on first use: runs of whole turns hidden (turn index ranges), see `hidden_runs`
    runs: list[tuple[int, int, str]] | None = attrs.field(default=None, init=False)

    def key(self) -> tuple[Any, ...]:
        return tuple(r.id for r in self.applied)

    @property
    def server_clears(self) -> bool:
        return bool(self.cache_cleared or self.cache_cleared_inputs)

    def as_seen(self, results: Iterable[str], inputs: Iterable[str]) -> Projection:
        """What the model sees once the provider cleared these tool nodes' results and
        inputs (the provider's rule may reach calls no record names: it clears a prefix)."""
        # the last record of the two (without listing every cleared call of the session)
        fallback = next(reversed(self.cache_cleared_inputs.values()), None) or next(
            reversed(self.cache_cleared.values()), None
        )
        if fallback is None:
            return self

        def marked(ids: Iterable[str], own: dict[str, Record]) -> dict[str, Record]:
            return {i: own.get(i, fallback) for i in ids}

        results = results if isinstance(results, set | frozenset) else frozenset(results)
        seen = attrs.evolve(
            self,
            # what the provider clears shows its placeholder, whatever compactd had put there
            cleared={**self.cleared, **marked(results, self.cache_cleared)},
            superseded={k: v for k, v in self.superseded.items() if k not in results},
            cleared_inputs={**marked(inputs, self.cache_cleared_inputs), **self.cleared_inputs},
            cache_cleared={},
            cache_cleared_inputs={},
        )
        seen.runs = self.runs  # the same turns hidden
        return seen


def applicable(graph: Graph, path: Path, kinds: frozenset[str] = CONTEXT_KINDS) -> list[Record]:
    return [r for r in graph.records if r.kind in kinds and graph.record_applies(r, path)]


def project(graph: Graph, path: Path, extra: list[Record] | None = None) -> Projection:
    """The projection of the records applicable to `path` (plus `extra`, in-memory records a
    tier is trying out before it decides to write them).

    Without `extra` it is kept per thread line and records version, and reused for a longer
    path of the same line while nothing else could differ (no record anchored in between, no
    protected turn touched): appending to a long session does not rebuild the per-id maps of
    every clear and snip it ever wrote."""
    if extra:
        added = [r for r in extra if graph.record_applies(r, path)]
        if not any(r.kind == UNCOLLAPSE for r in added):
            # the kept projection with the drafts applied after it, as `_build` would apply
            # them after every written record (a trial does not rebuild thousands of snips)
            return _extended(graph, path, project(graph, path), added)
        return _build(graph, path, [*applicable(graph, path), *added])[0]
    key = ("projection", path.owner, id(path.line))
    entry = graph.memo.get(key)
    if entry is not None and _reusable(graph, path, entry):
        return entry.proj
    records = applicable(graph, path)
    proj, filtered, guard = _build(graph, path, records)
    graph.memo[key] = _Kept(
        graph.records_version,
        path.line,
        path.length,
        _next_anchor(graph, path),
        proj,
        filtered,
        [r for r in records if r.kind in _GUARDED],
        guard,
    )
    return proj


@attrs.frozen
class _Kept:
    """A projection kept for reuse, and what tells whether it still holds."""

    version: int
    line: Line
    length: int
    next_anchor: int  # line position of the nearest record anchor past `length`
    proj: Projection
    filtered: bool  # the guard or a summary's cut kept some record out of it
    turn_records: list[Record]
    guard: frozenset[str]  # the protected turns it was built with


def _next_anchor(graph: Graph, path: Path) -> int:
    """The nearest line position, at or past the path's end, where a record is anchored (a
    longer path of the line reaching it may have another record in force)."""
    pos = path.line.pos
    out = sys.maxsize  # none: a new record bumps the records version anyway
    for rec in graph.records:
        if rec.thread == path.owner and rec.anchor is not None:
            at = pos.get(rec.anchor)
            if at is not None and path.length <= at < out:
                out = at
    return out


def _reusable(graph: Graph, path: Path, kept: _Kept) -> bool:
    if kept.version != graph.records_version or kept.line is not path.line:
        return False
    if not kept.length <= path.length <= kept.next_anchor:
        return False
    if not kept.turn_records:
        return True
    guard = protected_starts(graph, path)
    if kept.filtered:  # only the very same cut: the same path, the same protected turns
        return kept.length == path.length and guard == kept.guard
    for rec in kept.turn_records:
        if rec.data.get("through"):
            if rec.data["through"] == path.head:
                return False
        elif not guard.isdisjoint(_turn_set(rec)):
            return False
    return True


def _turn_set(rec: Record) -> frozenset[str]:
    found = rec.cache.get("turns")
    if found is None:
        found = rec.cache["turns"] = frozenset(rec.data.get("turns", []))
    return found  # type: ignore[no-any-return]


def _build(
    graph: Graph, path: Path, records: list[Record]
) -> tuple[Projection, bool, frozenset[str]]:
    """The projection of `records` on `path`; says whether a record was held back or trimmed
    (so a longer path may differ), and with which protected turns."""
    proj = Projection()
    undone = {r.data.get("collapse") for r in records if r.kind == UNCOLLAPSE}
    guard: frozenset[str] = frozenset()
    if any(r.kind in _GUARDED for r in records):
        guard = protected_starts(graph, path)
    filtered = _apply(proj, path, records, guard, undone)
    return proj, filtered, guard


def _extended(graph: Graph, path: Path, base: Projection, added: list[Record]) -> Projection:
    """`base` (the projection of the records written) with `added` applied after them: the
    same as building from all of them, for records that undo no collapse."""
    proj = Projection(
        summary=base.summary,
        summary_turns=base.summary_turns,
        summary_through=base.summary_through,
        snipped=dict(base.snipped),
        collapsed=dict(base.collapsed),
        cleared=dict(base.cleared),
        cleared_inputs=dict(base.cleared_inputs),
        cache_cleared=dict(base.cache_cleared),
        cache_cleared_inputs=dict(base.cache_cleared_inputs),
        superseded=dict(base.superseded),
        evidence=dict(base.evidence),
        abandoned=base.abandoned,
        applied=list(base.applied),
    )
    if not any(r.kind in _HIDING for r in added):
        proj.runs = base.runs  # the same turns hidden (a trial of clears walks none again)
    if not added:
        return proj
    undone = {r.data.get("collapse") for r in proj.applied if r.kind == UNCOLLAPSE}
    guard: frozenset[str] = frozenset()
    if any(r.kind in _GUARDED for r in added):
        guard = protected_starts(graph, path)
    _apply(proj, path, added, guard, undone)
    return proj


def _apply(
    proj: Projection,
    path: Path,
    records: list[Record],
    guard: frozenset[str],
    undone: set[Any],
) -> bool:
    """`records` applied to `proj` in order; whether one was held back or trimmed."""
    filtered = False
    for rec in records:
        kind = rec.kind
        if kind == SUMMARY and rec.data.get("through"):
            # a summary inside a turn replaces the latest turns by design (keeping the turn's
            # request and its newest exchanges): in force wherever something follows its cut
            if rec.data["through"] == path.head:
                filtered = True
                continue
            starts = rec.data.get("turns", [])
        elif kind in _GUARDED and guard.intersection(rec.data.get("turns", [])):
            filtered = True
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
            # superseded results always get compactd's own placeholder, which says why
            for node_id, why in (rec.data.get("superseded") or {}).items():
                proj.cleared.setdefault(node_id, rec)
                proj.superseded.setdefault(node_id, why)
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
        proj.summary_through = None
        if data.get("through") and data.get("partialTurn"):
            proj.summary_through = (data["partialTurn"], data["through"])
    return filtered


def hidden_runs(proj: Projection, path: Path) -> list[tuple[int, int, str]]:
    """The whole turns the projection hides, as runs `(first, end, kind)` of turn indices
    (kind `summary` over `snip` over `collapse`, as a render reads them), so a render or a
    tier walks only what is visible and steps over a long hidden prefix at once. Positions on
    a line never change, so this is computed once per projection."""
    if proj.runs is not None:
        return proj.runs
    kinds: dict[int, str] = {}
    for starts, kind in (
        (proj.collapsed, COLLAPSE),
        (proj.snipped, SNIP),
        (proj.summary_turns, SUMMARY),
    ):
        for start in starts:
            at = turn_index(path, start)
            if at is not None:
                kinds[at] = kind
    runs: list[tuple[int, int, str]] = []
    for at in sorted(kinds):
        kind = kinds[at]
        if runs and runs[-1][1] == at and runs[-1][2] == kind:
            runs[-1] = (runs[-1][0], at + 1, kind)
        else:
            runs.append((at, at + 1, kind))
    proj.runs = runs
    return runs


def turn_index(path: Path, start_id: str) -> int | None:
    """The index of the turn of `path` that starts at `start_id` (None: not a turn start
    on it)."""
    at = path.line.pos.get(start_id)
    if at is None or at >= path.length:
        return None
    starts = path.line.turn_starts
    i = bisect.bisect_left(starts, at)
    if i < len(starts) and starts[i] == at:
        return i if starts[0] == 0 else i + 1
    return 0 if at == 0 else None


def visible_bounds(proj: Projection, path: Path) -> list[tuple[int, int, int]]:
    """`(turn index, start, end)` of every turn the projection does not hide."""
    bounds = path.turn_bounds()
    out = []
    at = 0
    for first, end, _kind in (*hidden_runs(proj, path), (len(bounds), len(bounds), "")):
        for i in range(at, min(first, len(bounds))):
            out.append((i, *bounds[i]))
        at = max(at, end)
    return out


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
