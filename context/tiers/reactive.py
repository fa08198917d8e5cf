"""Tier 5 — Reactive: the provider said the prompt is too long.

The client reports HTTP 413, or a 400 whose message reads `prompt is too long: N tokens > M
maximum` (notes/anthropic-api.md §5). The daemon adopts the provider's own count N for its
estimate, then runs the cascade to bring the request under M with a margin — at most once per
user turn, so a second overflow in the same turn ends in a clean "cannot fit" and never a loop.
"""

from __future__ import annotations

import re

import attrs

from ..budget import Calibration
from ..errors import CannotFit
from ..projection import REACTIVE
from ..turns import turns_of
from .base import Run, TierEvent

TIER = "reactive"

PROMPT_TOO_LONG = re.compile(r"prompt is too long:\s*(\d+)\s*tokens\s*>\s*(\d+)\s*maximum")
# OpenAI's wordings: Chat Completions names both numbers, the Responses API none
CONTEXT_LENGTH = re.compile(
    r"maximum context length is\s*(\d+)\s*tokens.*?(?:resulted in|requested)\s*(\d+)\s*tokens",
    re.DOTALL,
)
CONTEXT_EXCEEDED = re.compile(r"exceeds the context window|context_length_exceeded")
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
    match = CONTEXT_LENGTH.search(message or "")
    if match:
        return Overflow(status, message, int(match.group(2)), int(match.group(1)))
    if status == 413 or (status == 400 and CONTEXT_EXCEEDED.search(message or "")):
        return Overflow(status, message, None, None)
    return None


def target_tokens(overflow: Overflow, estimate: int, limit: int, margin: float) -> int:
    """Calibrated tokens the next request must stay under."""
    if overflow.limit_tokens is not None:
        ceiling = min(overflow.limit_tokens, limit)
    else:
        ceiling = min(int(estimate * TOO_LARGE_SHRINK), limit)
    return max(1, int(ceiling * (1 - margin)))


def apply(run: Run, overflow: Overflow) -> None:
    """Adopt the provider's count, then aim under its limit with a margin — once per turn.
    Due when the client reported a prompt-too-long error for the last request (the cascade
    is given the `Overflow`)."""
    turns = turns_of(run.path)
    active = turns[-1].start_id if turns else None
    for rec in run.graph.records:
        if rec.kind == REACTIVE and rec.data.get("turn") == active and rec.thread == run.thread:
            raise CannotFit(
                "the provider reported the prompt too long again in this turn; reactive "
                "compaction runs once per turn — stop and start a new turn or /compact",
                turn=active,
                reported=overflow.prompt_tokens,
                limit=overflow.limit_tokens,
            )
    model = run.spec.model or ""
    estimate = run.rendered.estimate
    if overflow.prompt_tokens is not None and estimate > 0:
        forced = Calibration(dict(run.engine.calibration(run.session).ratios))
        forced.force(model, overflow.prompt_tokens, estimate)
        run.forced_calibration = forced
        run.rerender()
    target = target_tokens(overflow, run.total, run.limit, run.policy.reactive_margin)
    run.threshold = min(run.threshold, target)
    run.target = min(run.target, target)
    run.limit = min(run.limit, target)
    record = {
        "kind": REACTIVE,
        "covers": [],
        "thread": run.thread,
        "data": {
            "turn": active,
            "status": overflow.status,
            "reported": overflow.prompt_tokens,
            "limit": overflow.limit_tokens,
            "estimated": estimate,
            "model": model,
        },
    }
    before = run.total
    event = TierEvent(
        TIER,
        f"provider overflow ({overflow.status}): {overflow.message[:200]}",
        applied=True,
        tokens_before=before,
        tokens_after=before,
        details={
            "target": target,
            "reported": overflow.prompt_tokens,
            "limit": overflow.limit_tokens,
        },
    )
    run.pending.append((record, event))
    run.events.append(event)
