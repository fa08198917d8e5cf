"""Chunked generation: one summary of a `SummaryInput`, in as many provider calls as it takes.

A range longer than one summarizer call is summarized in budgeted chunks that fold a rolling
summary; a provider overflow retries with smaller chunks; calls are bounded. A generator: each
call is yielded as a `SummaryNeeded` and answered by a driver (`driver.py`), so the engine
itself does no I/O. Raises `SummaryFailure` when no usable summary can be had.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import attrs

from ..policy import Policy
from .input import MIN_CHUNK_TOKENS, SummaryInput
from .instructions import chunk_note
from .types import Fork, Steps, SummaryFailure, SummaryNeeded, SummaryRequest, SummaryResult


@attrs.frozen
class Limits:
    """How much one summary may take: tokens of input per call, calls, and wall time (one
    `deadline` on `clock` for the whole summary, evidence included)."""

    input_tokens: int
    calls: int
    deadline: float | None = None
    clock: Callable[[], float] | None = None

    @classmethod
    def of(cls, policy: Policy, clock: Callable[[], float] | None = None) -> Limits:
        """The policy's limits; with a `clock`, the time bound starts now."""
        deadline = clock() + policy.summary_time_bound_seconds if clock is not None else None
        return cls(policy.summary_input_max_tokens, policy.summary_max_calls, deadline, clock)

    def check_time(self, what: str) -> None:
        """Raise `SummaryFailure("timeout")` once the deadline has passed."""
        if self.deadline is not None and self.clock is not None and self.clock() >= self.deadline:
            raise SummaryFailure("timeout", f"{what} ran past its time bound; nothing was written")


RETRIED_SMALLER = ("prompt_too_long", "too_large", "truncated")
"""Failures a smaller chunk may not meet: over the provider's input, or a summary of more than
its output limit holds."""
FORK_RETRIED = (*RETRIED_SMALLER, "empty", "other")
"""Failures of a fork the plain prompt may not meet: the request with the instruction over the
window (our estimate was short), the model's thinking or a tool call instead of a summary, a
fork the API refused as sent. A provider that is down, refuses the key or ran out of time
fails the plain prompt as well."""


def chunk_lines(inp: SummaryInput, budget: int, start: int = 0) -> list[tuple[int, int]]:
    """Half-open line ranges of at most `budget` tokens each (a longer line goes alone)."""
    chunks: list[tuple[int, int]] = []
    i = start
    n = len(inp.lines)
    while i < n:
        j, used = i, 0
        while j < n and (j == i or used + inp.line_tokens[j] <= budget):
            used += inp.line_tokens[j]
            j += 1
        chunks.append((i, j))
        i = j
    return chunks


def generate(
    inp: SummaryInput,
    *,
    purpose: str,
    system: str,
    max_output: int,
    model: str | None,
    limits: Limits,
    fork: Fork | None = None,
    ratio: float = 1.0,
) -> Steps[tuple[str, dict[str, Any]]]:
    """Summarize `inp` in budgeted chunks folding a rolling summary; a provider overflow, or an
    answer cut off before its end, retries with smaller chunks. With a `fork`, the first call
    offers it beside the first chunk's prompt: a provider that answers the fork has summarized
    the whole range in that one call; one that cannot send it answers the first chunk, and the
    chunks go on from there; a fork the provider could not make as it was sent
    (`FORK_RETRIED`) is followed by the chunks, one call more. `ratio`: the provider's tokens
    per token of compactd's count (`SummaryRequest.ratio`). Returns the text and its usage;
    raises `SummaryFailure` (nothing is written then)."""
    budget = max(MIN_CHUNK_TOKENS, limits.input_tokens)
    chunks = chunk_lines(inp, budget)
    usage: dict[str, Any] = {"calls": 0, "inputTokens": 0, "outputTokens": 0, "model": model}

    def plain(index: int, rolling: str | None) -> SummaryRequest:
        """Chunk `index`'s request: its lines with the rolling summary so far before them and,
        when the range takes several calls, which part of how many they are; its items (what
        the digest provider reads) the chunk's, or the whole range's when it is whole."""
        lo, hi = chunks[index]
        prompt = inp.text(lo, hi)
        if rolling is not None:
            prompt = f"<previous_checkpoint>\n{rolling}\n</previous_checkpoint>\n\n{prompt}"
        if len(chunks) > 1:
            prompt = chunk_note(index + 1, len(chunks)) + "\n\n" + prompt
        whole = lo == 0 and hi == len(inp.lines)
        return SummaryRequest(
            purpose=purpose,
            system=system,
            prompt=prompt,
            max_output_tokens=max_output,
            model=model,
            input_tokens_estimate=sum(inp.line_tokens[lo:hi]),
            items=tuple(inp.items) if whole else tuple(_chunk_items(inp, lo, hi, rolling)),
            input_hash=inp.digest,
            deadline=limits.deadline,
            ratio=ratio,
        )

    answered: SummaryResult | SummaryFailure | None = None  # the first chunk's, had already
    if fork is not None:
        limits.check_time(f"the {purpose} summary")
        # offered a fork, the digest stands in for a model reading it: the whole range
        request = attrs.evolve(plain(0, None), fork=fork, items=tuple(inp.items))
        answer = yield SummaryNeeded(purpose, request)
        usage["calls"] = 1
        if isinstance(answer, SummaryResult) and answer.forked and answer.text.strip():
            usage.update(
                inputTokens=answer.input_tokens,
                outputTokens=answer.output_tokens,
                model=answer.model,
                forked=True,
                cacheReadTokens=answer.cache_read_input_tokens,
            )
            return answer.text.strip(), usage
        if isinstance(answer, SummaryFailure) and answer.forked:
            if answer.kind not in FORK_RETRIED:
                raise SummaryFailure(answer.kind, f"the {purpose} summary failed: {answer}")
            usage["forkFailed"] = answer.kind
        else:
            answered = answer
    if len(chunks) > limits.calls:  # known before a chunk's call: none is paid for in vain
        raise SummaryFailure(
            "call_limit",
            f"the range to summarize is {inp.tokens:,} tokens: {len(chunks)} calls of up to "
            f"{budget:,} (summaryInputMaxTokens), more than summaryMaxCalls ({limits.calls}); "
            + ("the provider was not called" if fork is None else "nothing was written"),
        )
    rolling: str | None = None
    calls = 0  # the chunks' calls, which summaryMaxCalls bounds
    position = 0
    while position < len(inp.lines):
        index = next(i for i, c in enumerate(chunks) if c[0] == position)
        lo, hi = chunks[index]
        if calls >= limits.calls:
            raise SummaryFailure("call_limit", f"the summary needed more than {limits.calls} calls")
        if answered is not None:
            answer, answered = answered, None
        else:
            limits.check_time(f"the {purpose} summary")
            answer = yield SummaryNeeded(purpose, plain(index, rolling))
            usage["calls"] += 1
        calls += 1
        if isinstance(answer, SummaryFailure):
            sent = sum(inp.line_tokens[lo:hi])
            if answer.kind in RETRIED_SMALLER and min(budget, sent) > MIN_CHUNK_TOKENS:
                # halve what was actually sent: halving a budget the chunk did not fill would
                # send the very same prompt again
                budget = max(MIN_CHUNK_TOKENS, min(budget, sent) // 2)
                chunks = chunks[:index] + chunk_lines(inp, budget, lo)
                continue
            raise SummaryFailure(answer.kind, f"the {purpose} summary failed: {answer}")
        if not answer.text.strip():
            raise SummaryFailure("empty", "the provider returned an empty summary")
        usage["inputTokens"] += answer.input_tokens
        usage["outputTokens"] += answer.output_tokens
        usage["model"] = answer.model
        rolling = answer.text.strip()
        position = hi
    return rolling or "", usage


def _chunk_items(inp: SummaryInput, lo: int, hi: int, rolling: str | None) -> list[dict[str, Any]]:
    """Items of one chunk, for the digest provider (approximate: by proportion)."""
    n = max(1, len(inp.lines))
    a, b = lo * len(inp.items) // n, hi * len(inp.items) // n
    out = list(inp.items[a:b])
    if rolling is not None:
        out.insert(0, {"type": "summary", "text": rolling})
    return out
