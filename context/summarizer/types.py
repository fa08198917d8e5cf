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
class Fork:
    """A summary asked as a fork of the request compactd last rendered: that very request (its
    system prompt, tools and messages, byte for byte up to its cache breakpoints, its context
    edits and the headers they need) with `instruction` after it as the last user turn, so a
    provider that caches prompts reads everything before the instruction from its cache
    instead of reading a transcript of the range at full price. A provider that can send it
    (the Anthropic Messages API, with the request's own model) answers it and says so
    (`SummaryResult.forked`); any other answers the request's plain prompt."""

    format: str  # the wire format of `request` ("anthropic")
    request: dict[str, Any]  # the body as rendered (model, max_tokens, system, tools, messages…)
    instruction: str  # what the fork asks, as the text of a last user turn
    headers: dict[str, str] = attrs.field(factory=dict)  # HTTP headers `request` needs
    input_tokens_estimate: int = 0  # the request and the instruction, in compactd's estimate
    # the render `request` came from: a replay prices the fork on it with its cache model
    rendered: Any = attrs.field(default=None, eq=False, repr=False)


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
    # the same summary asked as a fork of the cached request (one call for the whole range),
    # for a provider that can send it; `prompt` is the first chunk's, for any other
    fork: Fork | None = None
    # the provider's tokens per token of compactd's own count (the session's calibration):
    # `max_output_tokens` is in the provider's tokens, so the offline digest, which counts in
    # compactd's, writes to `max_output_tokens / ratio` — what a model's limit would hold
    ratio: float = 1.0


@attrs.frozen
class SummaryResult:
    text: str
    model: str
    input_tokens: int = 0
    output_tokens: int = 0
    cache_read_input_tokens: int = 0
    cache_creation_input_tokens: int = 0
    forked: bool = False  # the provider answered `request.fork` (the whole range), not `prompt`


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
        forked: bool = False,
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
        self.forked = forked  # the call that failed was a fork (`SummaryRequest.fork`)

    def __str__(self) -> str:
        return f"{self.kind}: {self.message}"


Answer = SummaryResult | SummaryFailure
"""What a driver sends back into a cascade for each `SummaryNeeded`."""

T = TypeVar("T")
Steps = Generator[SummaryNeeded, Answer, T]
"""A computation that may ask for summaries on its way (a tier, a cascade, a replay); its
value is `T`. Run it with `driver.drive` or `driver.drive_async`."""
