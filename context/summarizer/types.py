"""The contract between the engine and a summary provider.

The engine builds a `SummaryRequest` (what to summarize and how) and yields it, wrapped in a
`SummaryNeeded`, from a cascade; a provider — `anthropic`, `client` or `digest` — answers with
a `SummaryResult` or a `SummaryFailure`. The engine never calls a provider itself (it does no
I/O); a driver (`driver.py`) does, then hands the answer back.

`SummaryFailure` is the one name for "no usable summary": what a provider raises, and what
generation raises when a summary cannot be had (too many calls, an empty answer). The wire
error a client sees for it is `errors.ProviderFailure`.
"""

from __future__ import annotations

from collections.abc import Generator
from typing import Any, TypeVar

import attrs

from ..secrets import scrub

FAILURE_KINDS = (
    "prompt_too_long",  # the provider said the summary input is over its window (400)
    "too_large",  # the request body was too large (413)
    "rate_limited",  # 429
    "overloaded",  # 529, or an `overloaded_error` event inside a stream
    "timeout",  # the wall-time bound or the HTTP timeout ran out
    "cancelled",  # the caller cancelled
    "stream_error",  # any other `error` event inside a stream
    "empty",  # the provider answered with no text
    "truncated",  # the provider stopped before the summary's end (its output limit)
    "auth",  # 401/403: no or a bad API key
    "unavailable",  # no provider configured / cannot be reached
    "call_limit",  # the summary would need more calls than `summaryMaxCalls`
    "other",
)


@attrs.frozen
class SummaryRequest:
    """One call to a summary model."""

    purpose: str  # "rolling" (Tier 4) | "collapse" (Tier 3) | "evidence" | "chunk"
    system: str  # instructions for the summarizer
    prompt: str  # the rendered conversation (or chunk) to summarize, as one user message
    max_output_tokens: int
    model: str | None = None  # None: the provider's configured model
    input_tokens_estimate: int = 0
    # the same content as structured entries, for the offline `digest` provider:
    # {"type": "user"|"assistant"|"tool"|"summary", "text"?, "name"?, "input"?, "isError"?}
    items: tuple[dict[str, Any], ...] = ()
    input_hash: str = ""  # identifies the source range (reuse only for an identical one)
    # the whole summary's time bound (`summaryTimeBoundSeconds`), as the engine's clock reads
    # it: a driver stops waiting for this call then and answers `timeout`
    deadline: float | None = None


@attrs.frozen
class SummaryResult:
    text: str
    model: str
    input_tokens: int = 0
    output_tokens: int = 0
    cache_read_input_tokens: int = 0
    cache_creation_input_tokens: int = 0


@attrs.frozen
class SummaryNeeded:
    """What a cascade yields when a tier needs a summary: the tier asking and the request."""

    tier: str
    request: SummaryRequest


class SummaryFailure(Exception):
    """A provider call that produced no usable summary. Nothing is written after one."""

    def __init__(
        self,
        kind: str,
        message: str,
        *,
        status: int | None = None,
        prompt_tokens: int | None = None,
        limit_tokens: int | None = None,
    ) -> None:
        if kind not in FAILURE_KINDS:
            raise ValueError(f"unknown summary failure kind {kind!r}")
        message = scrub(message)  # a provider's words may echo its key (a gateway's may)
        super().__init__(message)
        self.kind = kind
        self.message = message
        self.status = status
        self.prompt_tokens = prompt_tokens
        self.limit_tokens = limit_tokens

    def __str__(self) -> str:
        return f"{self.kind}: {self.message}"


Answer = SummaryResult | SummaryFailure
"""What a driver sends back into a cascade for each `SummaryNeeded`."""

T = TypeVar("T")
Steps = Generator[SummaryNeeded, Answer, T]
"""A computation that may ask for summaries on its way (a tier, a cascade, a replay); its
value is `T`. Run it with `driver.drive` or `driver.drive_async`."""
