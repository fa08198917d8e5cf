"""The proxy's `client` summary provider: the client's own model, through the upstream its
requests go to, on the wire it speaks (each adapter asks in its own API), with the credentials
of the client's latest request on that session.

The credentials are held in memory only (never logged, written or echoed in an error), so a
summary needs a request of that session since the proxy started; background preparation of an
idle session after a restart says the provider is unavailable until the client is back.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from ..context.secrets import hold
from ..context.summarizer.types import SummaryFailure, SummaryRequest, SummaryResult
from ..service.stats import Usage
from .wire import Credentials
from .wires import BY_NAME

Called = Callable[[str, str, str, str, Usage | None, bool], None]
"""Told of each call: (session, purpose, model, wire, usage, whether it gave a summary)."""


class UpstreamSummarizer:
    """Summaries for one session from its upstream, asked as its client asks."""

    def __init__(
        self,
        upstream: str,
        credentials: Mapping[str, Credentials],
        session_id: str,
        *,
        model: str | None,
        timeout_seconds: float,
        called: Called | None = None,
    ) -> None:
        self.upstream = upstream
        self.credentials = credentials
        self.session_id = session_id
        self.model = model
        self.timeout_seconds = timeout_seconds
        self.called = called

    async def summarize(self, request: SummaryRequest) -> SummaryResult:
        """One summary call, told to `called` (the proxy's stats) with its usage."""
        held = self.credentials.get(self.session_id)
        model = self.model or (held.model if held is not None else "")
        wire = held.api if held is not None else "anthropic"
        try:
            result = await self._summarize(request)
        except SummaryFailure as failure:
            if self.called is not None and failure.kind not in ("unavailable", "timeout"):
                self.called(self.session_id, request.purpose, model, wire, None, False)
            raise
        if self.called is not None:
            usage = Usage(
                input=result.input_tokens,
                cache_read=result.cache_read_input_tokens,
                cache_write=result.cache_creation_input_tokens,
                output=result.output_tokens,
            )
            self.called(self.session_id, request.purpose, result.model or model, wire, usage, True)
        return result

    async def _summarize(self, request: SummaryRequest) -> SummaryResult:
        held = self.credentials.get(self.session_id)
        if held is None:
            raise SummaryFailure(
                "unavailable",
                "no request of this session has reached the proxy since it started, so there "
                "are no credentials to ask the upstream with",
            )
        wire = BY_NAME.get(held.api, BY_NAME["anthropic"])
        # out of every log line, error and record, whatever the upstream's error echoes
        hold(*wire.secrets(held.headers, {}))
        upstream = held.upstream or self.upstream
        return await wire.summarize(
            Credentials(held.headers, held.model, held.api, upstream, held.fields),
            request,
            model=self.model or held.model,
            timeout=self.timeout_seconds,
        )
