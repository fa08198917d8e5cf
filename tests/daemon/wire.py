"""A raw framed client: bytes in, bytes out, on the pipes of a real `compactd serve`.

`CompactdClient` and pygls' client only ever write well-formed frames; the malformed-input and
lifecycle tests need to write anything at all (broken headers, bodies that are not JSON) and to
see exactly what comes back, including answers with `id: null`. Every frame the daemon writes is
checked here: `Content-Length` headers only, a body of exactly that many bytes, a JSON-RPC 2.0
object. A violation is kept in `violations` and fails the test that owns the daemon.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import sys
from collections.abc import AsyncIterator, Callable, Sequence
from pathlib import Path
from typing import Any

import orjson

from tests.support.logs import log_bytes
from tests.support.postgres import daemon_store_args

# hang detectors, never measures: a daemon that starts, or a reply that comes, on a busy
# machine (2 shared cores at load 10, a PostgreSQL store) is still well inside them
SPAWN_TIMEOUT = 120.0
REPLY_TIMEOUT = 60.0


def frame(body: bytes) -> bytes:
    """One LSP-framed message around `body`, exactly as a well-behaved client writes it."""
    return b"Content-Length: %d\r\n\r\n" % len(body) + body


def serve_command(data_dir: Path, *serve_args: str) -> list[str]:
    """The command line of a daemon on `data_dir` (the same entry point users run)."""
    store = daemon_store_args(data_dir)  # `--store URL` when this run tests PostgreSQL
    head = [sys.executable, "-m", "compactd", "--data-dir", str(data_dir), "serve"]
    return [*head, *store, *serve_args]


class RawDaemon:
    """A daemon process we talk to byte by byte; it keeps everything the daemon sent."""

    def __init__(self, proc: asyncio.subprocess.Process, stderr_path: Path) -> None:
        self.proc = proc
        self.stderr_path = stderr_path
        self.received: list[dict[str, Any]] = []
        self.violations: list[str] = []
        self._ids = itertools.count(1)
        self._arrived = asyncio.Event()
        self._reader = asyncio.ensure_future(self._read_loop())

    @classmethod
    async def spawn(
        cls, data_dir: Path, *serve_args: str, log_path: Path, umask: int | None = None
    ) -> RawDaemon:
        """Start `compactd serve`; its log goes to `log_path` so a test can read what it
        logged (a pipe nobody reads could fill up and stall the daemon)."""
        with open(log_path, "wb") as err:
            proc = await asyncio.create_subprocess_exec(
                *serve_command(data_dir, *serve_args),
                stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE,
                stderr=err,
                limit=2**26,
                **({"umask": umask} if umask is not None else {}),
            )
        return cls(proc, log_path)

    # ---- writing ---------------------------------------------------------------------------

    def write(self, data: bytes) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(data)

    async def drain(self) -> None:
        assert self.proc.stdin is not None
        await self.proc.stdin.drain()

    def send(self, message: Any) -> None:
        """Frame and write any JSON value (not necessarily a valid JSON-RPC message). The
        stdlib encoder, unlike orjson, writes nesting of any depth."""
        self.write(frame(json.dumps(message, separators=(",", ":")).encode()))

    def send_request(self, method: str, params: Any = None, *, msg_id: Any = None) -> Any:
        """Write a request and return its id (a fresh string unless given; strings so they
        never collide with the integer ids tests write by hand)."""
        msg_id = f"raw-{next(self._ids)}" if msg_id is None else msg_id
        message: dict[str, Any] = {"jsonrpc": "2.0", "id": msg_id, "method": method}
        if params is not None:
            message["params"] = params
        self.send(message)
        return msg_id

    def notify(self, method: str, params: Any = None) -> None:
        message: dict[str, Any] = {"jsonrpc": "2.0", "method": method}
        if params is not None:
            message["params"] = params
        self.send(message)

    async def request(self, method: str, params: Any = None, **kw: Any) -> dict[str, Any]:
        """The whole response message (result or error) to one request."""
        start = len(self.received)
        msg_id = self.send_request(method, params, **kw)
        return await self.response(msg_id, start=start)

    async def call(self, method: str, params: Any = None) -> Any:
        """The result of a request that must succeed."""
        reply = await self.request(method, params)
        assert "error" not in reply, f"{method} failed: {reply['error']}"
        return reply["result"]

    async def error(self, method: str, params: Any = None) -> dict[str, Any]:
        """The error of a request that must fail."""
        reply = await self.request(method, params)
        assert "error" in reply, f"{method} succeeded: {reply.get('result')!r}"
        return reply["error"]

    # ---- reading ---------------------------------------------------------------------------

    async def _read_loop(self) -> None:
        stdout = self.proc.stdout
        assert stdout is not None
        try:
            while True:
                header = await stdout.readuntil(b"\r\n\r\n")
                lines = header[:-4].split(b"\r\n")
                if len(lines) != 1 or not lines[0].startswith(b"Content-Length: "):
                    self.violations.append(f"unexpected header block {header!r}")
                    return
                length = int(lines[0][len(b"Content-Length: ") :])
                body = await stdout.readexactly(length)
                try:
                    message = orjson.loads(body)
                except orjson.JSONDecodeError:
                    self.violations.append(f"a body that is not JSON: {body[:200]!r}")
                    return
                if not isinstance(message, dict) or message.get("jsonrpc") != "2.0":
                    self.violations.append(f"not a JSON-RPC 2.0 object: {body[:200]!r}")
                self.received.append(message)
                self._arrived.set()
        except asyncio.IncompleteReadError as exc:
            if exc.partial:
                self.violations.append(f"output ended inside a frame: {exc.partial[:200]!r}")
        finally:
            self._arrived.set()

    async def wait_for(
        self,
        predicate: Callable[[dict[str, Any]], bool],
        timeout: float = REPLY_TIMEOUT,
        start: int = 0,
    ) -> dict[str, Any]:
        """The first message received (from the `start`-th on) that satisfies `predicate`."""

        async def scan() -> dict[str, Any]:
            while True:
                for message in self.received[start:]:
                    if predicate(message):
                        return message
                if self._reader.done():
                    raise ConnectionError("the daemon closed its output")
                self._arrived.clear()
                await self._arrived.wait()

        return await asyncio.wait_for(scan(), timeout)

    async def response(
        self, msg_id: Any, timeout: float = REPLY_TIMEOUT, start: int = 0
    ) -> dict[str, Any]:
        return await self.wait_for(
            lambda m: m.get("id") == msg_id and "method" not in m, timeout, start
        )

    def replies_since(self, start: int) -> list[dict[str, Any]]:
        """Responses (not notifications) received after the first `start` messages."""
        return [m for m in self.received[start:] if "method" not in m]

    async def replies_besides(
        self, probe: dict[str, Any], start: int, count: int | None = None
    ) -> list[dict[str, Any]]:
        """The replies since the `start`-th message other than `probe` (a probe request's
        answer): those that came before it, or — requests are answered as they finish, not in
        the order they came — the first `count` besides it, waited for."""
        if count is None:
            got = self.replies_since(start)
            return got[: got.index(probe)]

        def others() -> list[dict[str, Any]]:
            return [r for r in self.replies_since(start) if r is not probe]

        await self.wait_for(lambda _: len(others()) >= count, start=start)
        return others()[:count]

    def notifications(self, method: str) -> list[dict[str, Any]]:
        return [m["params"] for m in self.received if m.get("method") == method and "id" not in m]

    def log_text(self) -> str:
        return self.stderr_path.read_text("utf-8", errors="replace")

    # ---- ending ----------------------------------------------------------------------------

    async def wait_exit(self, timeout: float = SPAWN_TIMEOUT) -> int:
        code = await asyncio.wait_for(self.proc.wait(), timeout)
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(self._reader, timeout)
        return code

    async def close_stdin(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            await self.proc.stdin.wait_closed()

    async def shutdown_and_exit(self) -> int:
        """The polite ending: `shutdown`, then `exit`; returns the exit code."""
        reply = await self.request("shutdown")
        assert reply.get("result", "missing") is None, reply
        self.notify("exit")
        await self.drain()
        return await self.wait_exit()

    async def kill(self) -> None:
        """Last resort in a fixture's teardown, so a failed test never leaves a daemon behind."""
        if self.proc.returncode is None:
            self.proc.kill()
            await self.proc.wait()
        self._reader.cancel()
        with contextlib.suppress(BaseException):
            await self._reader


def session_log(data_dir: Path, session_id: str) -> Path:
    return data_dir / "sessions" / f"{session_id}.jsonl"


def logs_bytes(data_dir: Path, session_ids: Sequence[str]) -> dict[str, bytes]:
    """The bytes of each session's log, to prove a rejected call wrote nothing."""
    return {sid: log_bytes(data_dir, sid) for sid in session_ids}


@contextlib.asynccontextmanager
async def seeded_daemon(
    data_dir: Path,
    sessions: dict[str, list[dict[str, Any]]],
    *serve_args: str,
    env: dict[str, str] | None = None,
) -> AsyncIterator[RawDaemon]:
    """A raw-wire daemon (its log beside the data dir) with these sessions written first; it
    must keep to the protocol throughout and exit 0 after `shutdown` + `exit`. Its idle loop
    does not run (unless `serve_args` set `--idle-check-seconds`): the background work it does
    every 30 s (a session's claim file, kept counts) would land, on a slow machine more often,
    between the snapshots a test takes around a refused request."""
    if "--idle-check-seconds" not in serve_args:
        serve_args = (*serve_args, "--idle-check-seconds", "86400")
    with contextlib.ExitStack() as stack:
        if env:
            import pytest

            patch = stack.enter_context(pytest.MonkeyPatch.context())
            for key, value in env.items():
                patch.setenv(key, value)
        raw = await RawDaemon.spawn(data_dir, *serve_args, log_path=data_dir.parent / "daemon.log")
    try:
        for sid, messages in sessions.items():
            await raw.call("session/open", {"sessionId": sid})
            await raw.call("session/append", {"sessionId": sid, "messages": messages})
        yield raw
        assert await raw.shutdown_and_exit() == 0
    finally:
        await raw.kill()
    assert raw.violations == []
