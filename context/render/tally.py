"""Token tallies by category: what a formatter sent, counted as it sent it (DESIGN §3 step 7)."""

from __future__ import annotations

from ..tokens import MESSAGE_OVERHEAD
from .conversation import ALL_CATEGORIES, CONVERSATION_CATEGORIES


class Tally:
    """Estimated tokens per category of one request (uncalibrated)."""

    def __init__(self) -> None:
        self.by_category: dict[str, int] = dict.fromkeys(ALL_CATEGORIES, 0)

    def add(self, category: str, tokens: int) -> None:
        self.by_category[category] += tokens

    def add_message(self, items: list[tuple[str, int]]) -> None:
        """Count one message as sent: its `(category, tokens)` parts, and its own framing
        charged to the first part's category."""
        if not items:
            return
        for category, tokens in items:
            self.by_category[category] += tokens
        self.by_category[items[0][0]] += MESSAGE_OVERHEAD

    @property
    def prompt(self) -> int:
        """Everything sent (output reserve and free space excluded)."""
        return sum(v for k, v in self.by_category.items() if k not in ("output_reserve", "free"))

    @property
    def history(self) -> int:
        return sum(self.by_category[k] for k in CONVERSATION_CATEGORIES)
