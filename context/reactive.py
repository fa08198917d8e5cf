"""Tier 5 — Reactive: the provider said the prompt is too long.

The client reports HTTP 413, or a 400 whose message reads `prompt is too long: N tokens > M
maximum` (notes/anthropic-api.md §5). The daemon adopts the provider's own count N for its
estimate, then runs the cascade to bring the request under M with a margin — at most once per
user turn, so a second overflow in the same turn ends in a clean "cannot fit" and never a loop.
"""

from __future__ import annotations

import re

import attrs

PROMPT_TOO_LONG = re.compile(r"prompt is too long:\s*(\d+)\s*tokens\s*>\s*(\d+)\s*maximum")
TOO_LARGE_SHRINK = 0.8  # a 413 names no numbers: aim 20% under the last estimate


@attrs.frozen
class Overflow:
    status: int
    message: str
    prompt_tokens: int | None
    limit_tokens: int | None


def parse_overflow(status: int, message: str) -> Overflow | None:
    """An `Overflow` if this provider error means the prompt was too long, else None."""
    match = PROMPT_TOO_LONG.search(message or "")
    if match:
        return Overflow(status, message, int(match.group(1)), int(match.group(2)))
    if status == 413:
        return Overflow(status, message, None, None)
    return None


def target_tokens(overflow: Overflow, estimate: int, limit: int, margin: float) -> int:
    """Calibrated tokens the next request must stay under."""
    if overflow.limit_tokens is not None:
        ceiling = min(overflow.limit_tokens, limit)
    else:
        ceiling = min(int(estimate * TOO_LARGE_SHRINK), limit)
    return max(1, int(ceiling * (1 - margin)))
