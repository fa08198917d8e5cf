"""Prompt-cache pricing with Anthropic's rules (notes/anthropic-api.md §4), for `replay`.

A request is a sequence of blocks (tools, system blocks, message blocks), each a content key
and a token count. A request reads from the cache the longest earlier request that is an exact
block-prefix of it and is still alive (0.1× the base input price), writes the rest (1.25×, or
2× with a 1-hour TTL), and both it and the request it read from stay alive for a TTL from this
request's time (a hit refreshes). Prices are in input-token equivalents: one uncached input
token costs 1. Summary calls pay their own input (reading a shared prefix when they share it)
and their output at 5×.

Pure and deterministic: no clock, no I/O — the caller passes each request's time.
"""

from __future__ import annotations

import attrs

from ..budget import input_price
from ..render.request import CACHE_TTL_SECONDS

READ = 0.1
WRITE_5M = 1.25
WRITE_1H = 2.0
OUTPUT = 5.0
TTL_SECONDS = CACHE_TTL_SECONDS

Block = tuple[bytes, int]  # (content key, tokens)


@attrs.frozen
class Charge:
    """What one request cost."""

    tokens: int
    read: int  # tokens read from the cache
    written: int  # tokens written to the cache
    uncached: int  # tokens neither read nor cached (below the minimum cacheable prefix)
    output: int = 0
    write_price: float = WRITE_5M

    @property
    def cost(self) -> float:
        return (
            self.read * READ
            + self.written * self.write_price
            + self.uncached
            + self.output * OUTPUT
        )


@attrs.define
class _Entry:
    keys: tuple[bytes, ...]
    cumulative: list[int]  # tokens up to and including block i
    expires: float


class CacheModel:
    """The provider's cache as seen by one client, request after request."""

    def __init__(
        self,
        ttl: str = "5m",
        min_prefix_tokens: int = 1024,
        write_price: float | None = None,
        system_breakpoint: bool = False,
    ) -> None:
        if ttl not in TTL_SECONDS:
            raise ValueError(f"ttl must be one of {sorted(TTL_SECONDS)}")
        self.ttl = ttl
        # the sensitivity economy.md leaves out: the API also reads back a prefix that ends at
        # a breakpoint an earlier request wrote, and agents mark their system prompt
        self.system_breakpoint = system_breakpoint
        self.ttl_seconds = TTL_SECONDS[ttl]
        self.write_price = write_price or (WRITE_1H if ttl == "1h" else WRITE_5M)
        self.min_prefix_tokens = min_prefix_tokens
        self.entries: list[_Entry] = []

    def request(
        self, blocks: list[Block], at: float, output_tokens: int = 0, fixed: int = 0
    ) -> Charge:
        """Price one request sent at time `at` (seconds), then remember it. `fixed`: how many
        leading blocks are the tools and system prompt — with `system_breakpoint`, read back
        whenever a live request began with them."""
        keys = tuple(k for k, _ in blocks)
        cumulative: list[int] = []
        running = 0
        for _, tokens in blocks:
            running += tokens
            cumulative.append(running)
        total = running
        self.entries = [e for e in self.entries if e.expires > at]
        best: _Entry | None = None
        best_len = 0
        for entry in self.entries:
            n = len(entry.keys)
            if n <= len(keys) and n > best_len and keys[:n] == entry.keys:
                best, best_len = entry, n
        if self.system_breakpoint and best_len < fixed <= len(keys):
            for entry in self.entries:
                if len(entry.keys) >= fixed and entry.keys[:fixed] == keys[:fixed]:
                    best, best_len = entry, fixed
                    break
        read = cumulative[best_len - 1] if best_len else 0
        if best is not None:
            best.expires = at + self.ttl_seconds
        rest = total - read
        if total >= self.min_prefix_tokens:
            written, uncached = rest, 0
            self.entries.append(_Entry(keys, cumulative, at + self.ttl_seconds))
        else:
            written, uncached = 0, rest
        return Charge(total, read, written, uncached, output_tokens, self.write_price)

    def summary_call(self, blocks: list[Block], at: float, output_tokens: int) -> Charge:
        """A summary request: its input like any request (reading a shared prefix if any),
        its output at the output price."""
        return self.request(blocks, at, output_tokens)


SUMMARY_OUTPUT_FLOOR = 2_000  # the spec asks 2,000-5,000 of a real model; the digest writes less
COLLAPSE_OUTPUT_FLOOR = 100  # a segment summary
EVIDENCE_OUTPUT_PER_RESULT = 200  # tool evidence: one line of about this many tokens a result


def price_call(
    purpose: str,
    input_tokens: int,
    output_tokens: int,
    results: int = 0,
    read: int = 0,
    written: int = 0,
    write_price: float = WRITE_5M,
) -> float:
    """One LLM call, in input-token equivalents (economy.md): its input plus 5x its output,
    the output counted at no less than a real model would write — 2,000 tokens for a
    summary, 100 for a collapse segment, 200 for each result a tool-evidence call reads.
    `read`: tokens of the input read from the prompt cache (a cached fork), at 0.1;
    `written`: tokens it wrote to the cache (a fork carries its request's breakpoints), at
    `write_price`."""
    paid = input_tokens - read - written + READ * read + write_price * written
    if purpose == "evidence":
        return paid + OUTPUT * max(output_tokens, EVIDENCE_OUTPUT_PER_RESULT * results)
    floor = COLLAPSE_OUTPUT_FLOOR if purpose == "collapse" else SUMMARY_OUTPUT_FLOOR
    return paid + OUTPUT * max(output_tokens, floor)


def summary_price(summary_model: str | None, request_model: str | None) -> float:
    """What a summary call costs against the request's model, per token: the ratio of their
    published input prices (output is 5x input for both), 1 when either is unknown or no
    summary model is named (the request's own model summarizes)."""
    mine, theirs = input_price(summary_model), input_price(request_model)
    if not summary_model or mine is None or theirs is None:
        return 1.0
    return mine / theirs


def price_uncached(tokens: int, output_tokens: int = 0) -> float:
    """What a request costs with no cache at all."""
    return tokens + output_tokens * OUTPUT


def price_recorded(
    usage: dict[str, int], ttl: str = "5m", write_price: float | None = None
) -> float:
    """A recorded request's cost from the usage the provider reported."""
    write = write_price or (WRITE_1H if ttl == "1h" else WRITE_5M)
    return (
        int(usage.get("input_tokens") or 0)
        + int(usage.get("cache_creation_input_tokens") or 0) * write
        + int(usage.get("cache_read_input_tokens") or 0) * READ
    )
