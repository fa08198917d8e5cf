"""What a replay counts of recall: the loss the handles answer for, per run."""

from __future__ import annotations

from typing import Any

import attrs

from ..graph import Graph
from ..recall import handles_in


@attrs.define
class RecallCounts:
    """Per replay run: what Budget Reduction cut on arrival, what Tier 1 cleared, and how many
    distinct handles the requests showed (so the loss recall answers is measured)."""

    cut_results: int = 0
    cut_chars: int = 0
    cleared: int = 0
    handles: set[str] = attrs.Factory(set)

    def observe(self, request: dict[str, Any]) -> set[str]:
        """Note the handles `request` shows; returns them."""
        shown = handles_in(request.get("messages"))
        self.handles |= shown
        return shown

    def finish(self, graph: Graph, max_chars: int, head: int, tail: int) -> None:
        """Count the cuts and clears of the whole session (every thread)."""
        for node in graph.nodes.values():
            content = node.result if node.kind in ("tool", "function") else None
            parts = [content] if isinstance(content, str) else content
            if not isinstance(parts, list):
                continue
            cuts = [
                len(t) - head - tail
                for t in (p if isinstance(p, str) else p.get("text") for p in parts)
                if isinstance(t, str) and len(t) > max_chars
            ]
            self.cut_results += bool(cuts)
            self.cut_chars += sum(cuts)
        cleared: set[str] = set()
        for rec in graph.records:
            if rec.kind == "clear":
                cleared.update(rec.data.get("results") or [])
        self.cleared = len(cleared)

    def to_json(self) -> dict[str, int]:
        return {
            "cutResults": self.cut_results,
            "cutChars": self.cut_chars,
            "clearedResults": self.cleared,
            "handlesShown": len(self.handles),
        }
