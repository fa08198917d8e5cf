"""The stdio transport: our own asyncio loop around pygls' protocol (notes/pygls.md §7).

Reading stdin through an `asyncio.StreamReader` avoids pygls' per-line thread hop (~3×
lower latency) and lets background tasks (idle timers, the store watcher) run from the first
moment. Bodies are parsed with orjson once, at the top level only. Broken framing is logged
and skipped; a body that is not JSON is answered with a −32700 error (id null); nothing is
ever shown to the user as a `window/showMessage`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import sys
from typing import Any, BinaryIO

import orjson

from .front import Front

log = logging.getLogger("compactd.daemon.stdio")
MAX_BODY_BYTES = 256 * 1024 * 1024
PIPE_BYTES = 1024 * 1024
_PUMPS: set[asyncio.Future[None]] = set()


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


async def _open_reader(stdin: BinaryIO) -> asyncio.StreamReader:
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader(limit=1024 * 1024)
    try:
        await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), stdin)
    except (ValueError, OSError):
        # not a pipe (a regular file, some Windows consoles): feed the reader from a thread
        async def pump() -> None:
            while True:
                chunk = await loop.run_in_executor(
                    None, stdin.read1 if hasattr(stdin, "read1") else stdin.read, 65536
                )  # type: ignore[attr-defined]
                if not chunk:
                    reader.feed_eof()
                    return
                reader.feed_data(chunk)

        _PUMPS.add(asyncio.ensure_future(pump()))
    return reader


def dispatch(server: Any, body: bytes) -> None:
    """Parse one message body and hand it to the protocol, answering what it cannot. Until
    pygls is loaded, the front answers compactd's own requests itself (`daemon.front`)."""
    if isinstance(server, Front) and (not server.loaded or server.busy):
        try:
            if server.take(orjson.loads(body)):
                return
        except orjson.JSONDecodeError:
            pass  # pygls' path answers it
    from pygls.exceptions import JsonRpcException, JsonRpcInvalidRequest, JsonRpcParseError

    protocol = server.protocol
    try:
        data = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        protocol.send_error(None, JsonRpcParseError(message=f"Parse error: {exc}"))
        return
    if not isinstance(data, dict) or data.get("jsonrpc") != "2.0":
        msg_id = data.get("id") if isinstance(data, dict) else None
        protocol.send_error(
            msg_id, JsonRpcInvalidRequest(message="Invalid request: expected a JSON-RPC 2.0 object")
        )
        return
    if "method" in data and not isinstance(data["method"], str):
        protocol.send_error(
            data.get("id"),
            JsonRpcInvalidRequest(message="Invalid request: 'method' must be a string"),
        )
        return
    try:
        message = protocol.structure_message(data)
    except JsonRpcException as exc:
        if "id" in data and "method" in data:
            protocol.send_error(data["id"], exc)
        else:
            log.warning("dropping a malformed message: %s", exc)
        return
    protocol.handle_message(message)


async def read_messages(server: Any, reader: asyncio.StreamReader) -> None:
    """LSP framing: headers, a blank line, a body of Content-Length bytes."""
    while True:
        length: int | None = None
        while True:
            try:
                line = await reader.readline()
            except ValueError:  # a header line over the limit: not our framing
                log.warning("dropping an over-long header line")
                continue
            if not line:
                return  # EOF
            if line in (b"\r\n", b"\n"):
                break
            name, sep, value = line.decode("latin-1").partition(":")
            if sep and name.strip().lower() == "content-length":
                try:
                    length = int(value.strip())
                except ValueError:
                    length = None
            elif not sep:
                log.warning("dropping a line that is not a header: %r", line[:80])
        if length is None or length < 0 or length > MAX_BODY_BYTES:
            log.warning("message without a usable Content-Length; skipped")
            continue
        try:
            body = await reader.readexactly(length)
        except asyncio.IncompleteReadError:
            return
        try:
            dispatch(server, body)
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
) -> int:
    """Serve until `exit` (0 after `shutdown`, else 1) or stdin EOF (0)."""
    stdin = stdin or sys.stdin.buffer
    stdout = stdout or sys.stdout.buffer
    _widen_pipe(stdout)
    server.set_writer(_Writer(stdout))  # the front's (pygls' once loaded)
    reader = await _open_reader(stdin)
    exit_event = server.exit_event()
    tasks = [asyncio.ensure_future(coro) for coro in (background or [])]
    read_task = asyncio.ensure_future(read_messages(server, reader))
    exit_task = asyncio.ensure_future(exit_event.wait())
    await asyncio.wait({read_task, exit_task}, return_when=asyncio.FIRST_COMPLETED)
    for task in (read_task, exit_task, *tasks):
        task.cancel()
    await asyncio.gather(read_task, exit_task, *tasks, return_exceptions=True)
    return server.exit_code if server.exit_code is not None else 0
