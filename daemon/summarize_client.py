"""The `client` summary provider: the daemon asks its client to summarize with the client's own
model (`context/summarize`, a server→client request with a timeout)."""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

from ..context.summarizer.types import SummaryFailure, SummaryRequest, SummaryResult
from ..protocol import methods
from ..protocol.convert import ParamsError, structure, unstructure
from ..protocol.types import SummarizeParams, SummarizeResult


class ClientSummaryProvider:
    """Runs summaries through the connected client's own model. A summary the daemon no
    longer needs (its compaction was cancelled, or timed out) is cancelled at the client too,
    so the client's model call stops."""

    def __init__(self, protocol: Any, session_id: str, timeout_seconds: float) -> None:
        self.protocol = protocol
        self.session_id = session_id
        self.timeout_seconds = timeout_seconds

    async def summarize(self, request: SummaryRequest) -> SummaryResult:
        params = SummarizeParams(
            self.session_id,
            request.purpose,
            request.system,
            request.prompt,
            request.max_output_tokens,
        )
        msg_id = f"summarize-{uuid.uuid4().hex}"
        future = asyncio.wrap_future(
            self.protocol.send_request(
                methods.REQUEST_SUMMARIZE, unstructure(params), msg_id=msg_id
            )
        )
        try:
            raw = await asyncio.wait_for(future, self.timeout_seconds)
        except TimeoutError:
            self.protocol.notify("$/cancelRequest", _cancel(msg_id))
            raise SummaryFailure(
                "timeout",
                f"the client did not answer context/summarize within {self.timeout_seconds:.0f} s",
            ) from None
        except asyncio.CancelledError:
            self.protocol.notify("$/cancelRequest", _cancel(msg_id))
            raise
        except Exception as exc:  # the client answered with an error
            raise SummaryFailure("other", f"the client's summarizer failed: {exc}") from None
        try:
            answer = structure(
                raw if isinstance(raw, dict) else {}, SummarizeResult, methods.REQUEST_SUMMARIZE
            )
        except ParamsError as exc:
            raise SummaryFailure("other", str(exc)) from None
        if not answer.text.strip():
            raise SummaryFailure("empty", "the client returned an empty summary")
        return SummaryResult(
            text=answer.text,
            model=answer.model or "client",
            input_tokens=answer.input_tokens or 0,
            output_tokens=answer.output_tokens or 0,
        )


def _cancel(msg_id: Any) -> Any:
    """pygls types this notification's params (imported here: the daemon starts without it)."""
    from lsprotocol.types import CancelParams

    return CancelParams(id=msg_id)
