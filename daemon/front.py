"""The front: what stands for the pygls server until something needs pygls.

Importing pygls costs a third of a second (lsprotocol builds ~1,000 LSP types), more than
everything else the first answer needs. So the daemon starts with this front: the handlers
register on it (`rpc` is pygls-free), and the stdio loop hands it compactd's own requests —
methods of the one method table — which it runs and answers itself, with the same encoding
and error shapes as pygls would. Anything else (`initialize`, `shutdown`, `exit`, a response to
a request of ours, a malformed message), and any use of pygls' machinery (`protocol` for the
`client` summary provider, `work_done_progress` for `$/progress`), loads the real server once;
from then on every message goes through it exactly as before, so LSP clients see no
difference. `$/cancelRequest` for a request the front runs cancels it (−32800, as pygls).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Callable
from typing import TYPE_CHECKING, Any

import attrs
import orjson

from ..protocol.convert import unstructure
from .rpc import encode_fallback
from .wire import clean_error

if TYPE_CHECKING:
    from .server import CompactdServer

log = logging.getLogger("compactd.daemon")
REQUEST_CANCELLED = -32800


class Front:
    """The daemon's server until pygls is needed; then a thin door to it."""

    def __init__(self) -> None:
        self.features: dict[str, Callable[..., Any]] = {}
        self.app: Any = None  # the daemon's services (set by `daemon.main.build`)
        self.real: CompactdServer | None = None
        self.writer: Any = None
        self._exit_event: asyncio.Event | None = None
        self._exit_code: int | None = None
        self._running: dict[Any, asyncio.Task[None]] = {}

    # ---- what handlers and the app use -------------------------------------------------------

    def feature(self, method: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
        def register(handler: Callable[..., Any]) -> Callable[..., Any]:
            self.features[method] = handler
            if self.real is not None:
                self.real.feature(method)(handler)
            return handler

        return register

    def notify(self, method: str, params: Any) -> None:
        """Send a notification (attrs params become camelCase JSON), as the server would."""
        if self.real is not None:
            self.real.notify(method, params)
            return
        payload = unstructure(params) if attrs.has(type(params)) else params
        self._write({"jsonrpc": "2.0", "method": method, "params": payload})

    @property
    def protocol(self) -> Any:
        return self.load().protocol

    @property
    def work_done_progress(self) -> Any:
        return self.load().work_done_progress

    def log_message(self, level: str, message: str) -> None:
        """`window/logMessage` (the services' word to the operator)."""
        from lsprotocol.types import LogMessageParams, MessageType

        kind = {"error": MessageType.Error, "warning": MessageType.Warning}.get(level)
        params = LogMessageParams(type=kind or MessageType.Info, message=message)
        self.protocol.notify("window/logMessage", params)

    @contextlib.asynccontextmanager
    async def progress(self, token: str | None, title: str) -> AsyncIterator[Callable[[str], None]]:
        """`$/progress` for a client-chosen work-done token (nothing without one)."""
        if token is None:
            yield lambda message: None
            return
        from lsprotocol.types import (
            WorkDoneProgressBegin,
            WorkDoneProgressEnd,
            WorkDoneProgressReport,
        )

        wdp = self.work_done_progress  # loads pygls, if the front has not yet
        wdp.begin(token, WorkDoneProgressBegin(title=title, cancellable=True, percentage=0))

        def report(message: str) -> None:
            wdp.report(token, WorkDoneProgressReport(message=message))

        try:
            yield report
        finally:
            wdp.end(token, WorkDoneProgressEnd(message="done"))
            wdp.tokens.pop(token, None)  # pygls never forgets a token otherwise

    def client_summarizer(self, session_id: str, timeout_seconds: float) -> Any:
        from .summarize_client import ClientSummaryProvider

        return ClientSummaryProvider(self.protocol, session_id, timeout_seconds)

    @property
    def loaded(self) -> bool:
        return self.real is not None

    def set_writer(self, writer: Any) -> None:
        self.writer = writer
        if self.real is not None:
            self.real.protocol.set_writer(writer)

    # ---- lifecycle ----------------------------------------------------------------------------

    def exit_event(self) -> asyncio.Event:
        if self._exit_event is None:
            self._exit_event = asyncio.Event()
        return self._exit_event

    @property
    def exit_code(self) -> int | None:
        return self.real.exit_code if self.real is not None else self._exit_code

    def request_exit(self, code: int) -> None:
        if self.real is not None:
            self.real.request_exit(code)
            return
        self._exit_code = code
        self.exit_event().set()

    def load(self) -> CompactdServer:
        """The pygls server, built on first need with every handler registered so far."""
        if self.real is None:
            from .server import CompactdServer

            real = CompactdServer()
            real.app = self.app
            if self._exit_event is not None:
                real._exit_event = self._exit_event
            for method, handler in self.features.items():
                real.feature(method)(handler)
            if self.writer is not None:
                real.protocol.set_writer(self.writer)
            self.real = real
        return self.real

    # ---- requests the front answers itself ----------------------------------------------------

    @property
    def busy(self) -> bool:
        """Requests the front runs are still in flight (a cancel may be for one of them)."""
        return bool(self._running)

    def take(self, data: Any) -> bool:
        """Run a request for one of compactd's methods (or cancel one it runs); False when the
        message is pygls' to handle."""
        if not isinstance(data, dict) or data.get("jsonrpc") != "2.0":
            return False
        method = data.get("method")
        if method == "$/cancelRequest":
            params = data.get("params")
            task = self._running.get(params.get("id")) if isinstance(params, dict) else None
            if task is None:
                return False
            task.cancel()
            return True
        if self.real is not None:
            return False  # loaded: new requests are pygls'; the front finishes its own
        handler = self.features.get(method) if isinstance(method, str) else None
        msg_id = data.get("id")
        if handler is None or msg_id is None or not isinstance(msg_id, int | str):
            return False
        task = asyncio.ensure_future(self._answer(handler, msg_id, data.get("params")))
        self._running[msg_id] = task
        task.add_done_callback(lambda done, key=msg_id: self._finished(done, key))
        return True

    def _finished(self, task: asyncio.Task[None], msg_id: Any) -> None:
        self._running.pop(msg_id, None)
        if task.cancelled():  # cancelled before it started (the cancel came in the same read)
            self._write({"jsonrpc": "2.0", "id": msg_id, "error": _cancelled(msg_id)})

    async def _answer(self, handler: Callable[..., Any], msg_id: Any, params: Any) -> None:
        try:
            result = await handler(self, params)
        except asyncio.CancelledError:
            self._write({"jsonrpc": "2.0", "id": msg_id, "error": _cancelled(msg_id)})
            return
        except Exception as exc:  # the rpc wrapper raised a JSON-RPC error (pygls' own type)
            error: dict[str, Any] = {
                "code": getattr(exc, "code", -32603),
                "message": getattr(exc, "message", "internal error"),
            }
            data = getattr(exc, "data", None)
            if data is not None:
                error["data"] = data
            self._write({"jsonrpc": "2.0", "id": msg_id, "error": error})
            return
        self._write({"jsonrpc": "2.0", "id": msg_id, "result": result})

    def _write(self, message: dict[str, Any]) -> None:
        """Encode and send as the server's `_send_data` does (orjson, LSP framing)."""
        if self.real is not None:  # loaded meanwhile: one writer, one path
            self.real.protocol._send_data(message)
            return
        if self.writer is None:
            return
        if isinstance(message.get("error"), dict):
            message = {**message, "error": clean_error(message["error"])}
        try:
            body = orjson.dumps(message, default=encode_fallback)
        except Exception:
            log.exception("cannot encode a reply")
            if "id" not in message or "method" in message:
                return
            body = orjson.dumps(
                {
                    "jsonrpc": "2.0",
                    "id": message["id"],
                    "error": {
                        "code": -32603,
                        "message": "internal error: the answer could not be encoded",
                        "data": {"kind": "internal_error"},
                    },
                }
            )
        header = f"Content-Length: {len(body)}\r\n\r\n".encode("ascii")
        self.writer.write(header + body)


def _cancelled(msg_id: Any) -> dict[str, Any]:
    """The error of a cancelled request, worded as pygls words it."""
    return {"code": REQUEST_CANCELLED, "message": f'Request with id "{msg_id}" is canceled'}
