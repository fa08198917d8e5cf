"""The proxy's `client` summary provider: the client's own model, through the upstream, with the
credentials of the client's latest request on that session.

The credentials are held in memory only (never logged, written or echoed in an error), so a
summary needs a request of that session since the proxy started; background preparation of an
idle session after a restart says the provider is unavailable until the client is back.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import attrs
from anthropic import Omit

from ..context.summarizer.types import SummaryFailure, SummaryRequest, SummaryResult
from ..service.providers.anthropic_provider import AnthropicSummaryProvider

AUTH_HEADERS = ("x-api-key", "authorization")
"""The headers that carry a client's credentials: relayed upstream and nowhere else."""
RELAYED_HEADERS = ("anthropic-version",)


@attrs.define
class Credentials:
    """What a session's latest request said about who is asking, and for which model."""

    headers: dict[str, str]
    model: str


class UpstreamSummarizer:
    """Summaries for one session from the Anthropic upstream, as the client would ask."""

    def __init__(
        self,
        upstream: str,
        credentials: Mapping[str, Credentials],
        session_id: str,
        *,
        model: str | None,
        timeout_seconds: float,
    ) -> None:
        self.upstream = upstream
        self.credentials = credentials
        self.session_id = session_id
        self.model = model
        self.timeout_seconds = timeout_seconds

    async def summarize(self, request: SummaryRequest) -> SummaryResult:
        held = self.credentials.get(self.session_id)
        if held is None:
            raise SummaryFailure(
                "unavailable",
                "no request of this session has reached the proxy since it started, so there "
                "are no credentials to ask the upstream with",
            )
        headers: dict[str, Any] = {k: v for k, v in held.headers.items() if k not in AUTH_HEADERS}
        api_key = held.headers.get("x-api-key")
        bearer = held.headers.get("authorization", "")
        token = bearer[7:].strip() if bearer.lower().startswith("bearer ") else None
        if not api_key:  # the SDK would otherwise add the environment's key beside the token
            headers["X-Api-Key"] = Omit()
        provider = AnthropicSummaryProvider(
            model=self.model or held.model,
            api_key=api_key or None,
            auth_token=None if api_key else token,
            base_url=self.upstream,
            default_headers=headers,
            timeout_seconds=self.timeout_seconds,
            wall_seconds=self.timeout_seconds,
        )
        try:
            return await provider.summarize(request)
        finally:
            await provider.aclose()
