"""Summary providers, chosen explicitly — one never silently stands in for another.

- `anthropic`: the official SDK (`anthropic_provider.py`);
- `client`: the front asks its client to summarize (the daemon's `context/summarize`, a
  server→client request with a timeout) — for agents that bring their own model;
- `digest`: the offline, deterministic extractive checkpoint (`compactd.context.summarizer.digest`).

Which one a session uses: its config's `summaryProvider`, else `COMPACTD_SUMMARY_PROVIDER`
(or `compactd serve --summary-provider`). Without one, the LLM tiers are skipped and say so.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

from ...context.summarizer import digest
from ...context.summarizer.types import SummaryFailure, SummaryRequest, SummaryResult

PROVIDERS = ("anthropic", "client", "digest")
Summarize = Callable[[SummaryRequest], Awaitable[SummaryResult]]


class DigestProvider:
    async def summarize(self, request: SummaryRequest) -> SummaryResult:
        """Computed in a worker thread: a digest of a long range is CPU work, and the loop
        keeps answering meanwhile."""
        return await asyncio.to_thread(digest.summarize, request)


def make_provider(
    name: str, *, session_id: str, front: Any, model: str | None, timeout_seconds: float
) -> Any:
    """The provider `name` names; `front` supplies the `client` one (`Front.client_summarizer`)."""
    if name == "digest":
        return DigestProvider()
    if name == "client":
        return front.client_summarizer(session_id, timeout_seconds)
    if name == "anthropic":
        from .anthropic_provider import AnthropicSummaryProvider

        # one bound for the whole call: per HTTP attempt and for the attempts together
        return AnthropicSummaryProvider(
            model=model, timeout_seconds=timeout_seconds, wall_seconds=timeout_seconds
        )
    raise SummaryFailure(
        "unavailable", f"unknown summary provider {name!r}; use one of {', '.join(PROVIDERS)}"
    )
