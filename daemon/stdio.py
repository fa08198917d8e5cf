"""The stdio transport: our own asyncio loop around pygls' protocol (notes/pygls.md §7).

Reading stdin through an `asyncio.StreamReader` avoids pygls' per-line thread hop (~3×
lower latency) and lets background tasks (idle timers, the store watcher) run from the first
moment. Bodies are parsed with orjson once, at the top level only. A frame that cannot be read
is answered (−32700 `invalid_framing`, or 4014 `too_large`, id null) and the reader
re-synchronizes on the next `Content-Length` header (`FrameReader`): it is never left deaf. A
body that is not JSON is answered with −32700 (id null); a request whose id is not a JSON-RPC
id gets −32600 and is not run. Nothing is ever shown to the user as a `window/showMessage`.
Any stdin works: a pipe, a file, a terminal, `/dev/null`, or none at all (EOF: exit 0).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import re
import stat
import sys
import threading
from typing import TYPE_CHECKING, Any, BinaryIO

import attrs
import orjson

from ..context.policy import MAX_REQUEST_BYTES
from ..protocol.types import METHODS
from .front import Front

if TYPE_CHECKING:
    from pygls.exceptions import JsonRpcException

log = logging.getLogger("compactd.daemon.stdio")
PIPE_BYTES = 1024 * 1024
READ_CHUNK = 1024 * 1024
MAX_HEADER_BYTES = 64 * 1024
"""A header block longer than this is not LSP framing (real ones are under 100 bytes)."""
MAX_SAFE_ID = 2**53 - 1
_LENGTH_NAME = b"content-length:"
_LENGTH_HEADER = re.compile(re.escape(_LENGTH_NAME), re.IGNORECASE)
_HEADER_END = re.compile(rb"\r?\n\r?\n")


class _Writer:
    """Blocking writes to stdout; replies are written whole, in order."""

    def __init__(self, stream: BinaryIO) -> None:
        self.stream = stream

    def write(self, data: bytes) -> None:
        try:
            self.stream.write(data)
            self.stream.flush()
        except (BrokenPipeError, ValueError):
            log.warning("client went away; dropping a reply")

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.stream.flush()


def _is_pipe(stdin: BinaryIO) -> bool:
    """Only pipes and sockets go to the event loop: epoll refuses regular files and some
    character devices (`/dev/null`), and a terminal is better read by a thread."""
    try:
        mode = os.fstat(stdin.fileno()).st_mode
    except (OSError, ValueError, AttributeError):
        return False
    return stat.S_ISFIFO(mode) or stat.S_ISSOCK(mode)


async def _open_reader(stdin: BinaryIO | None) -> asyncio.StreamReader:
    """A reader over stdin; a closed or missing stdin is an immediate EOF."""
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader(limit=1024 * 1024)
    if stdin is None:
        reader.feed_eof()
        return reader
    if _is_pipe(stdin):
        try:
            await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), stdin)
            return reader
        except (ValueError, OSError):
            pass

    # a regular file, a terminal, /dev/null, …: a daemon thread feeds the reader (a blocked
    # read in an executor thread would hold up the process's exit)
    read = getattr(stdin, "read1", stdin.read)

    def pump() -> None:
        while True:
            try:
                chunk = read(READ_CHUNK)
            except (OSError, ValueError):
                chunk = b""
            if not chunk:
                loop.call_soon_threadsafe(reader.feed_eof)
                return
            loop.call_soon_threadsafe(reader.feed_data, chunk)

    threading.Thread(target=pump, name="compactd-stdin", daemon=True).start()
    return reader


def valid_id(value: Any) -> bool:
    """JSON-RPC 2.0 ids: a string, null, or an integer a JavaScript peer can hold exactly."""
    if value is None or isinstance(value, str):
        return True
    return isinstance(value, int) and not isinstance(value, bool) and abs(value) <= MAX_SAFE_ID


def _invalid(server: Any, msg_id: Any, message: str) -> None:
    from pygls.exceptions import JsonRpcInvalidRequest

    error = JsonRpcInvalidRequest(message=f"Invalid request: {message}")
    server.protocol.send_error(msg_id, error)


LSP_METHODS = frozenset(
    {
        "initialize",
        "initialized",
        "shutdown",
        "exit",
        "$/cancelRequest",
        "$/setTrace",
        "window/workDoneProgress/cancel",
    }
)
"""The LSP methods the daemon answers besides its own (`protocol.types.METHODS`): the
lifecycle pygls runs. Any other method is −32601, whatever its params."""
_SURROGATE = re.compile("[\ud800-\udfff]")


def parse_body(body: bytes) -> Any:
    """A message body's JSON. Text a UTF-8 encoder would have repaired is repaired the same
    way, not refused: a lone surrogate escape (`"\\ud83d"`, what `JSON.stringify` writes for
    a string cut mid-emoji) or a byte that is not UTF-8 becomes U+FFFD, so the request is
    answered on its own id. Anything else that is not JSON raises `orjson.JSONDecodeError`."""
    try:
        return orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        failure = exc
    try:
        data = json.loads(
            body.decode("utf-8", errors="replace"),
            parse_constant=_not_json,
            parse_int=_integer,
        )
    except (ValueError, RecursionError):
        raise failure from None
    log.warning("a message held text that is not UTF-8 (a lone surrogate?): replaced by U+FFFD")
    return _repaired(data)


def _not_json(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def _integer(text: str) -> int | float:
    """As orjson reads one: past 64 bits, a float."""
    value = int(text) if len(text) < 30 else 2**64
    return value if -(2**63) <= value < 2**64 else float(text)


def _repaired(value: Any) -> Any:
    if isinstance(value, str):
        return _SURROGATE.sub("\ufffd", value)
    if isinstance(value, list):
        return [_repaired(v) for v in value]
    if isinstance(value, dict):
        return {_repaired(k): _repaired(v) for k, v in value.items()}
    return value


def dispatch(server: Any, body: bytes) -> None:
    """Parse one message body and hand it to the protocol, answering what it cannot. A
    request the daemon cannot answer by its own id is refused before it runs, and one for a
    method it does not have is −32601 before its params are looked at. Until pygls is loaded,
    the front answers compactd's own requests itself (`daemon.front`); pygls' types are
    imported only on its path."""
    try:
        data = parse_body(body)
    except orjson.JSONDecodeError as exc:
        from pygls.exceptions import JsonRpcParseError

        server.protocol.send_error(None, JsonRpcParseError(message=f"Parse error: {exc}"))
        return
    if not isinstance(data, dict):
        _invalid(server, None, "expected a JSON-RPC 2.0 object")
        return
    has_id = "id" in data
    msg_id = data.get("id")
    if has_id and not valid_id(msg_id):
        _invalid(server, None, "'id' must be a string, null or an integer within ±(2^53-1)")
        return
    if data.get("jsonrpc") != "2.0":
        _invalid(server, msg_id, "expected a JSON-RPC 2.0 object")
        return
    if "method" in data:
        method = data["method"]
        if not isinstance(method, str):
            _invalid(server, msg_id, "'method' must be a string")
            return
        if method not in METHODS and method not in LSP_METHODS:
            if has_id:
                from pygls.exceptions import JsonRpcMethodNotFound

                error = JsonRpcMethodNotFound(message=f"Method Not Found: {method}")
                server.protocol.send_error(msg_id, error)
            else:
                log.info("dropping a notification of an unknown method %r", method[:80])
            return
        if method in METHODS and data.get("params", None) in (None, []):
            data["params"] = {}  # `{}`, `[]`, `null` and omitted all mean "no arguments"
    elif not has_id:
        _invalid(server, None, "neither a request, a notification nor a response")
        return
    elif "result" not in data and "error" not in data:
        _invalid(server, msg_id, "a response needs 'result' or 'error'; a request 'method'")
        return
    if isinstance(server, Front) and (not server.loaded or server.busy) and server.take(data):
        return
    from pygls.exceptions import JsonRpcException

    protocol = server.protocol
    try:
        message = protocol.structure_message(data)
    except JsonRpcException as exc:
        if has_id and "method" in data:
            protocol.send_error(msg_id, exc)
        else:
            log.warning("dropping a malformed message: %s", exc)
        return
    protocol.handle_message(message)


@attrs.frozen
class BadFrame:
    """A frame that cannot be read: answered (id null), then the reader re-synchronizes."""

    error: JsonRpcException


class FrameReader:
    """LSP framing over a byte stream, never deaf: headers up to a blank line, then a body of
    exactly `Content-Length` bytes. A header block without one usable length (missing,
    not a number, negative, over the limit, or headers that never end) is reported as a
    `BadFrame`; the reader then drops bytes up to the next `Content-Length:` and goes on
    from there, so one broken frame costs that frame (and the next, when its length reached
    into it), never the ones after. (Inside a JSON
    body the text `Content-Length:` can appear only in a string, never followed by a raw
    line break, so a false start is itself a bad frame and is skipped the same way.)"""

    def __init__(self, reader: asyncio.StreamReader, max_body: int) -> None:
        self._reader = reader
        self._max_body = max_body
        self._buf = bytearray()
        self._eof = False
        self._resync = False

    async def _more(self) -> bool:
        if self._eof:
            return False
        chunk = await self._reader.read(READ_CHUNK)
        if not chunk:
            self._eof = True
            return False
        self._buf += chunk
        return True

    async def _skip_to_next_frame(self) -> None:
        keep = len(_LENGTH_NAME) - 1
        while True:
            found = _LENGTH_HEADER.search(self._buf)
            if found:
                del self._buf[: found.start()]
                return
            if len(self._buf) > keep:
                del self._buf[: len(self._buf) - keep]
            if not await self._more():
                self._buf.clear()
                return

    async def next(self) -> bytes | BadFrame | None:
        """The next body, a `BadFrame`, or None at the end of input."""
        if self._resync:
            self._resync = False
            await self._skip_to_next_frame()
        while True:
            while self._buf[:1] in (b"\r", b"\n"):  # blank lines between frames are harmless
                del self._buf[:1]
            end = _HEADER_END.search(self._buf)
            if end is not None:
                break
            if len(self._buf) > MAX_HEADER_BYTES:
                return self._bad(f"headers longer than {MAX_HEADER_BYTES} bytes")
            if not await self._more():
                if self._buf.strip():
                    log.warning(
                        "input ended inside a message's headers; %d bytes dropped", len(self._buf)
                    )
                return None
        header = bytes(self._buf[: end.start()])
        lengths = []
        for line in header.split(b"\n"):
            name, sep, value = line.rstrip(b"\r").partition(b":")
            if not sep:
                log.warning("dropping a line that is not a header: %r", line[:80])
            elif name.strip().lower() == b"content-length":
                lengths.append(value.strip())
        if not lengths:
            return self._bad("a message without a Content-Length header")
        if len(set(lengths)) > 1 or not lengths[0].isdigit():
            return self._bad(f"an unusable Content-Length {lengths[0][:40]!r}")
        # more digits than any real length: never handed to int() (which refuses over 4,300)
        length = int(lengths[0]) if len(lengths[0]) <= 20 else MAX_SAFE_ID + 1
        del self._buf[: end.end()]
        if length > self._max_body:
            log.warning(
                "a message of %d bytes is over the limit (maxRequestBytes %d)",
                length,
                self._max_body,
            )
            self._resync = True
            size = length if length <= MAX_SAFE_ID else None  # JSON peers hold 2^53 at most
            from .errors import too_large  # pygls' types, only when a frame is refused

            return BadFrame(too_large("maxRequestBytes", self._max_body, size))
        while len(self._buf) < length:
            if not await self._more():
                log.warning("input ended inside a message body; %d bytes dropped", len(self._buf))
                return None
        body = bytes(self._buf[:length])
        del self._buf[:length]
        return body

    def _bad(self, reason: str) -> BadFrame:
        """The block stays in the buffer but for its first byte: a real header may hide in
        it (the tail of a body that ran into the next frame's `Content-Length:`)."""
        log.warning("%s: skipped up to the next Content-Length", reason)
        del self._buf[:1]
        self._resync = True
        from pygls.exceptions import JsonRpcParseError

        return BadFrame(
            JsonRpcParseError(
                message=f"Parse error: {reason}; skipped up to the next Content-Length header",
                data={"kind": "invalid_framing"},
            )
        )


async def read_messages(
    server: Any, reader: asyncio.StreamReader, max_body: int = MAX_REQUEST_BYTES
) -> None:
    """Read frames until the end of input, answering the ones that cannot be read."""
    frames = FrameReader(reader, max_body)
    while True:
        try:
            item = await frames.next()
        except Exception:  # a reader that cannot go on must not look like a clean EOF
            log.exception("reading stdin failed; exiting with 1")
            server.request_exit(1)
            return
        if item is None:
            return
        try:
            if isinstance(item, BadFrame):
                server.protocol.send_error(None, item.error)
            else:
                dispatch(server, item)
        except Exception:  # one message must never end the daemon for every other client call
            log.exception("handling a message failed; it was dropped")


def _widen_pipe(stream: BinaryIO) -> None:
    """Let a whole rendered request sit in the pipe at once (Linux pipes hold 64 KB by
    default, so a 700 KB answer took a dozen hand-offs between the two processes)."""
    try:
        import fcntl

        fcntl.fcntl(stream.fileno(), getattr(fcntl, "F_SETPIPE_SZ", 1031), PIPE_BYTES)
    except (OSError, ValueError, ImportError, AttributeError):
        pass  # not a pipe, not Linux, or over the system's limit: the default works


async def serve_stdio(
    server: Any,
    stdin: BinaryIO | None = None,
    stdout: BinaryIO | None = None,
    background: list[Any] | None = None,
    max_request_bytes: int = MAX_REQUEST_BYTES,
) -> int:
    """Serve until `exit` (0 after `shutdown`, else 1) or stdin EOF (0)."""
    if stdin is None and sys.stdin is not None:
        stdin = sys.stdin.buffer  # a closed stdin (`<&-`) leaves sys.stdin None: EOF at once
    stdout = stdout or sys.stdout.buffer
    _widen_pipe(stdout)
    server.set_writer(_Writer(stdout))  # the front's (pygls' once loaded)
    reader = await _open_reader(stdin)
    exit_event = server.exit_event()
    tasks = [asyncio.ensure_future(coro) for coro in (background or [])]
    read_task = asyncio.ensure_future(read_messages(server, reader, max_request_bytes))
    exit_task = asyncio.ensure_future(exit_event.wait())
    await asyncio.wait({read_task, exit_task}, return_when=asyncio.FIRST_COMPLETED)
    for task in (read_task, exit_task, *tasks):
        task.cancel()
    await asyncio.gather(read_task, exit_task, *tasks, return_exceptions=True)
    return server.exit_code if server.exit_code is not None else 0
