"""The pygls server: LSP framing and lifecycle and compactd's error rules (the `rpc` decorator
lives in `daemon.rpc`, re-exported here). The daemon starts with `daemon.front` in its place
and builds this on first need, so its first answer does not wait for pygls' imports.

Deviations from stock pygls, all deliberate (notes/pygls.md §5):
- replies are encoded with orjson (stock `json.dumps` costs more than a render on big results);
- a request after `shutdown` is answered with an error instead of silence;
- `exit` ends the process with 0 after `shutdown` and 1 without (stock pygls always gives 0);
- out-of-band errors are logged, never sent as `window/showMessage` to a non-editor client;
- an unexpected exception is logged and answered with an internal error without a traceback.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import attrs
import orjson
from lsprotocol.converters import get_converter
from lsprotocol.types import TextDocumentSyncKind
from pygls.exceptions import JsonRpcException, JsonRpcInvalidRequest
from pygls.lsp.server import LanguageServer
from pygls.protocol import LanguageServerProtocol
from pygls.protocol.json_rpc import JsonRPCNotification, JsonRPCResponseMessage

from .. import __version__
from ..protocol.convert import unstructure
from .errors import CompactdRpcError
from .rpc import encode_fallback as _fallback
from .rpc import rpc
from .wire import clean_error

log = logging.getLogger("compactd.daemon")


class CompactdProtocol(LanguageServerProtocol):
    """JSON-RPC over LSP framing, with compactd's lifecycle and encoding rules."""

    def handle_message(self, message: Any) -> None:
        method = getattr(message, "method", None)
        if method == "exit":
            server: CompactdServer = self._server  # type: ignore[assignment]
            server.request_exit(0 if self._shutdown else 1)
            return
        if self._shutdown and method is not None and getattr(message, "id", None) is not None:
            error = CompactdRpcError(
                "shutting_down", "the daemon is shutting down; only 'exit' is accepted"
            )
            self._send_response(message.id, error=error.to_response_error())
            return
        super().handle_message(message)

    def _handle_response(self, msg_id: Any, result: Any = None, error: Any = None) -> None:
        """A late answer to a request of ours nobody waits for any more (`context/summarize`
        of a compact that was cancelled or timed out) is dropped. Stock pygls would set the
        result on the cancelled future and raise out of the read loop, ending the daemon."""
        future = self._request_futures.get(msg_id)
        if future is not None and future.done():
            del self._request_futures[msg_id]
            self._result_types.pop(msg_id, None)
            log.info("dropping a late answer to request %s (no longer awaited)", msg_id)
            return
        super()._handle_response(msg_id, result, error)

    def _send_data(self, data: Any) -> None:
        if not data or self.writer is None:
            return
        try:
            if type(data) is JsonRPCResponseMessage:
                # our handlers answer plain JSON already: cattrs would deep-copy every nested
                # dict of a rendered request (most of an RPC render's cost)
                data = {"jsonrpc": data.jsonrpc, "id": data.id, "result": data.result}
            elif type(data) is JsonRPCNotification and isinstance(data.params, dict):
                data = {"jsonrpc": data.jsonrpc, "method": data.method, "params": data.params}
            elif hasattr(data, "__attrs_attrs__"):
                data = self._converter.unstructure(data)
            if isinstance(data, dict) and isinstance(data.get("error"), dict):
                data = {**data, "error": clean_error(data["error"])}
            body = orjson.dumps(data, default=_fallback)
        except Exception:
            log.exception("cannot encode a reply")
            msg_id = data.get("id") if isinstance(data, dict) else getattr(data, "id", None)
            is_call = (
                data.get("method") if isinstance(data, dict) else getattr(data, "method", None)
            ) is not None
            if msg_id is None or is_call:
                return  # a notification or request of ours: nobody waits on an answer
            body = orjson.dumps(
                {
                    "jsonrpc": "2.0",
                    "id": msg_id,
                    "error": {
                        "code": -32603,
                        "message": "internal error: the answer could not be encoded",
                        "data": {"kind": "internal_error"},
                    },
                }
            )
        header = f"Content-Length: {len(body)}\r\n\r\n".encode("ascii")
        self.writer.write(header + body)  # our stdio writer is synchronous

    def send_error(self, msg_id: Any, error: JsonRpcException) -> None:
        """An error answer that always carries `id` (null when the request's id could not be
        read), as JSON-RPC 2.0 requires; the converter would drop a null id altogether."""
        body = self._converter.unstructure(error.to_response_error())
        self._send_data({"jsonrpc": "2.0", "id": msg_id, "error": body})


class CompactdServer(LanguageServer):
    """One daemon process: the engine, the session registry and the background tasks."""

    def __init__(self) -> None:
        super().__init__(
            name="compactd",
            version=__version__,
            text_document_sync_kind=TextDocumentSyncKind.None_,  # no documents here
            protocol_cls=CompactdProtocol,
            converter_factory=get_converter,
        )
        self.exit_code: int | None = None
        self._exit_event: asyncio.Event | None = None
        self.app: Any = None  # the daemon's services (set by `daemon.main.build`)

    def report_server_error(self, error: Exception, source: Any) -> None:
        """Out-of-band errors go to the log, never to a `window/showMessage`."""
        log.debug("server error (%s): %s", getattr(source, "__name__", source), error)

    def request_exit(self, code: int) -> None:
        self.exit_code = code
        if self._exit_event is not None:
            self._exit_event.set()

    def exit_event(self) -> asyncio.Event:
        if self._exit_event is None:
            self._exit_event = asyncio.Event()
        return self._exit_event

    def notify(self, method: str, params: Any) -> None:
        """Send a notification (attrs params become camelCase JSON)."""
        payload = unstructure(params) if attrs.has(type(params)) else params
        self.protocol.notify(method, payload)


__all__ = ["CompactdProtocol", "CompactdServer", "JsonRpcInvalidRequest", "rpc"]
