"""What the services see of the proxy: its clients are HTTP agents that never hear a
notification, so notifications and the store's words go to the proxy's log, and the `client`
summary provider is the client's own model reached through the upstream."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncIterator, Callable
from typing import Any

import attrs

from ..protocol import methods
from .summarizer import UpstreamSummarizer

log = logging.getLogger("compactd.proxy")


class ProxyFront:
    """The `Front` of `compactd.service.app` for the proxy."""

    def __init__(self, summarizers: Callable[[str, float], UpstreamSummarizer]) -> None:
        self._summarizers = summarizers

    def notify(self, method: str, params: Any) -> None:
        """A compaction is worth a log line (what changed in the context is never silent);
        the other notifications are for clients that listen, and these do not."""
        if method != methods.NOTIFY_COMPACTED:
            return
        # the wire's dict (the App unstructures and scrubs what it sends to every front)
        fields = attrs.asdict(params) if attrs.has(type(params)) else dict(params)
        before = fields.get("tokensBefore", fields.get("tokens_before"))
        after = fields.get("tokensAfter", fields.get("tokens_after"))
        log.info(
            "session %s: %s %s (%s → %s tokens): %s",
            fields.get("sessionId", fields.get("session_id")),
            fields.get("tier"),
            "applied" if fields.get("applied") else "not applied",
            f"{before:,}" if isinstance(before, int) else before,
            f"{after:,}" if isinstance(after, int) else after,
            fields.get("reason"),
        )

    def log_message(self, level: str, message: str) -> None:
        getattr(log, level if level in ("info", "warning", "error") else "info")(message)

    @contextlib.asynccontextmanager
    async def progress(self, token: str | None, title: str) -> AsyncIterator[Callable[[str], None]]:
        yield lambda message: None

    def client_summarizer(self, session_id: str, timeout_seconds: float) -> UpstreamSummarizer:
        return self._summarizers(session_id, timeout_seconds)
