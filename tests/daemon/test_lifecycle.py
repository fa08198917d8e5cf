"""The LSP lifecycle with a plain framed client: `initialize` is optional, `shutdown` + `exit`
gives 0, `exit` alone gives 1 (LSP's rule, which stock pygls loses), a request after
`shutdown` gets an error rather than silence, and stdin EOF ends the daemon with 0.

Each test needs its own process (it ends it), so they are kept to the cases that matter.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from compactd.clients.client import CompactdClient

from .convo import user
from .wire import RawDaemon, frame


@pytest.fixture
async def daemon(tmp_path: Path):  # type: ignore[no-untyped-def]
    raw = await RawDaemon.spawn(tmp_path / "data", log_path=tmp_path / "daemon.log")
    yield raw
    await raw.kill()
    assert raw.violations == []


async def test_plain_client_needs_no_initialize_and_exits_0(daemon: RawDaemon) -> None:
    # no `initialize`: a plain JSON-RPC client goes straight to the methods
    status = await daemon.call("daemon/status", {})
    assert status["loadedSessions"] == []
    opened = await daemon.call("session/open", {"sessionId": "plain"})
    assert opened["created"] is True
    await daemon.call("session/append", {"sessionId": "plain", "messages": [user("hi")]})
    rendered = await daemon.call("context/render", {"sessionId": "plain"})
    assert rendered["request"]["messages"][0]["content"][0]["text"] == "hi"
    # `initialize` later still works (an editor always sends it first; nothing depends on it)
    init = await daemon.call("initialize", {"capabilities": {}, "processId": None})
    assert init["serverInfo"]["name"] == "compactd"
    daemon.notify("initialized", {})

    assert (await daemon.request("shutdown"))["result"] is None
    after = await daemon.request("daemon/status", {})
    assert after["error"]["code"] == 4070, "a request after shutdown is answered, not dropped"
    assert after["error"]["data"]["kind"] == "shutting_down"
    daemon.notify("exit")
    await daemon.drain()
    assert await daemon.wait_exit() == 0


async def test_exit_without_shutdown_exits_1(daemon: RawDaemon) -> None:
    await daemon.call("daemon/status", {})
    daemon.notify("exit")
    await daemon.drain()
    assert await daemon.wait_exit() == 1


@pytest.mark.files_only
async def test_stdin_eof_exits_0_even_mid_message(daemon: RawDaemon, tmp_path: Path) -> None:
    await daemon.call("session/open", {"sessionId": "eof"})
    # the client dies halfway through a frame: the daemon must neither hang nor apply it
    body = b'{"jsonrpc":"2.0","id":99,"method":"session/append","params":{"sessionId":"eof"'
    daemon.write(frame(body)[:-10])
    await daemon.close_stdin()
    assert await daemon.wait_exit() == 0
    assert not [m for m in daemon.received if m.get("id") == 99]
    log = (tmp_path / "data" / "sessions" / "eof.jsonl").read_bytes()
    assert log.count(b"\n") == 1, "only the session's header was ever written"


async def test_the_python_client_fails_at_once_when_the_daemon_dies(tmp_path: Path) -> None:
    """A call made after the daemon died, and one in flight when it dies, fail with
    ConnectionError naming its exit code — not after the 120 s timeout with a bare
    TimeoutError (the outer bound only stops a hang from hanging the suite)."""
    client = await CompactdClient.spawn(data_dir=str(tmp_path / "data"))
    assert client.timeout == 120.0
    await client.status()
    assert client.process is not None
    in_flight = asyncio.ensure_future(client.list_sessions())
    client.process.kill()
    for call in (in_flight, client.status()):
        with pytest.raises(ConnectionError, match=r"closed the connection \(exit code -9\)"):
            await asyncio.wait_for(call, 60)
    await client.close()
