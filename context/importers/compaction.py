"""A compaction the agent recorded → the summary record that makes the session render as the
agent last saw it.

Claude Code (`compact_boundary` + its `isCompactSummary` message) and Codex (`compacted` with a
replacement history) replace their context by a summary they wrote, often in the middle of a
task. Imported as plain history, such a session renders everything the agent had already let
go of (162K where its last prompt was 63K). So the import writes the compaction as compactd's
own rolling-summary record: it covers every node of the thread up to that point (the originals
stay in the graph), its text is the agent's summary with what the agent put back after it
(Claude Code re-reads its most recent files), and compactd's later summaries fold it in as
their prior. When the agent compacted in the middle of a turn (the turn was still going),
the record ends inside it (`partialTurn`/`through`, as Tier 4 writes one), so the turn's
request stays verbatim and what the agent did after the compaction follows the marker.
"""

from __future__ import annotations

from typing import Any

from ..graph import Graph
from ..projection import SUMMARY
from ..turns import is_complete, turn_node_ids, turns_of
from .plan import Compaction

IMPORTED = "imported"  # the record's `provider`: the agent's own summary, not one of ours


def compaction_record(graph: Graph, op: Compaction, function: str | None) -> dict[str, Any] | None:
    """The summary record for `op` on the thread it was recorded in (`function`: the thread's
    function id, None for the top level); None when the thread holds nothing to replace."""
    head = graph.head(function=function) if function else graph.head()
    path = graph.path(head, owner=function)
    turns = turns_of(path)
    if not turns:
        return None
    last = turns[-1]
    whole = turns if is_complete(graph, path, last) else turns[:-1]
    covers: list[str] = []
    for turn in whole:
        covers.extend(turn_node_ids(graph, path, turn))
    text = "\n\n".join([op.summary, *op.restored])
    data: dict[str, Any] = {
        "text": text,
        "turns": [turn.start_id for turn in whole],
        "userRequests": list(op.user_requests),
        "lastAssistant": None,
        "provider": IMPORTED,
        "imported": op.source,
        "usage": {},
    }
    if len(whole) < len(turns):  # compacted mid-task: the record ends inside the last turn
        ids = path.line.ids
        for index in range(last.start, last.end):
            covers.append(ids[index])
            for call in graph.calls_of(graph.nodes[ids[index]]):
                covers.append(call.id)
                if call.function is not None:
                    covers.append(call.function)
        data["partialTurn"] = last.start_id
        data["through"] = ids[last.end - 1]
    return {"kind": SUMMARY, "covers": covers, "data": data, "thread": function}
