"""Hardening, class by class, through a real `compactd serve`: broken framing never leaves the
reader deaf, request ids follow JSON-RPC (a bad one is refused and the request not run), empty
params mean "no arguments", refusals write nothing, any stdin ends in exit 0, and no error
carries a traceback or a local path."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import orjson
import pytest
import pytest_asyncio
from compactd.context.stores import open_store
from compactd.context.stores.files import COUNTS_SUFFIX

from tests.support.postgres import daemon_store_url

from .convo import assistant, user
from .wire import RawDaemon, frame, seeded_daemon, serve_command

pytestmark = pytest.mark.asyncio(loop_scope="module")

SID = "hard-main"


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("hardening")


@pytest.fixture(scope="module")
def data_dir(root: Path) -> Path:
    return root / "data"


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def daemon(root: Path, data_dir: Path) -> AsyncIterator[RawDaemon]:
    async with seeded_daemon(data_dir, {SID: [user("hello")]}) as raw:
        yield raw
    for message in raw.received:
        assert_clean(message, data_dir)


def snapshot(folder: Path) -> dict[str, bytes]:
    """Every file under the data dir, by its bytes (locks and logs alike), and when the daemon
    tests run on PostgreSQL every session's events in the data dir's database. Not the counts
    a listing keeps beside each log: a cache the probes' own listings write."""
    out = {
        str(p.relative_to(folder)): p.read_bytes()
        for p in folder.rglob("*")
        if p.is_file() and COUNTS_SUFFIX not in p.name
    }
    url = daemon_store_url(folder)
    if url:
        store = open_store(url, None)
        try:
            for sid in store.list_sessions():
                out[f"database:{sid}"] = orjson.dumps(store.read_from(sid, 0)[0])
        finally:
            store.close()
    return out


def assert_clean(message: dict[str, Any], data_dir: Path) -> None:
    """An error a client gets names no local path and carries no traceback, and has a kind."""
    error = message.get("error")
    if error is None:
        return
    text = json.dumps(error)
    assert "Traceback" not in text and "traceback" not in text, error
    assert str(data_dir) not in text and str(Path.home()) + "/" not in text, error
    assert isinstance(error.get("data"), dict) and error["data"].get("kind"), error


_probes = iter(range(1, 10**6))


async def after(daemon: RawDaemon, data: bytes, replies: int | None = None) -> list[dict[str, Any]]:
    """Write `data` then a probe (whose answer must come); the replies to `data`: those that
    came before the probe's, or — requests are answered as they finish, not in the order they
    came — the first `replies` besides the probe's."""
    start = len(daemon.received)
    n = next(_probes)
    probe = b'{"jsonrpc":"2.0","id":"probe-%d","method":"session/list"}' % n
    daemon.write(data + frame(probe))
    await daemon.drain()
    answer = await daemon.response(f"probe-{n}", start=start)
    return await daemon.replies_besides(answer, start, replies)


def count_appends(data_dir: Path, sid: str) -> int:
    log = data_dir / "sessions" / f"{sid}.jsonl"
    return sum(1 for line in log.read_bytes().splitlines() if b'"t":"node"' in line)


# ---- framing -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "header",
    [
        b"-5",
        b"twelve",
        b"",
        b"1e3",
        b"0x10",
        b"+5",
        b"5 5",
        b"99999999999999999999999",
        b"9" * 5000,  # more digits than int() converts
    ],
)
async def test_a_bad_length_then_a_body_without_newline_leaves_the_reader_listening(
    daemon: RawDaemon, data_dir: Path, header: bytes
) -> None:
    """The reported hang: the body of a frame with an unusable length has no newline, so a
    line reader would read headers forever. Now: one error (id null), then the next frame."""
    before = snapshot(data_dir)
    body = b'{"jsonrpc":"2.0","id":"lost","method":"session/append","params":{"sessionId":"'
    body += SID.encode() + b'","messages":[{"role":"assistant","content":"x"}]}}'
    replies = await after(daemon, b"Content-Length: " + header + b"\r\n\r\n" + body)
    (reply,) = replies
    assert reply["id"] is None and reply["error"]["code"] in (-32700, 4014), reply
    assert snapshot(data_dir) == before
    # and again right away: still answering, in order
    assert await after(daemon, b"") == []


async def test_two_lengths_that_disagree_are_a_bad_frame(daemon: RawDaemon) -> None:
    body = b'{"jsonrpc":"2.0","id":"two","method":"session/list"}'
    data = b"Content-Length: %d\r\nContent-Length: 3\r\n\r\n" % len(body) + body
    replies = await after(daemon, data)
    # the second header is then tried as a frame of its own: more errors, never a request run
    assert replies[0]["error"]["data"]["kind"] == "invalid_framing"
    assert all(r["id"] is None and r["error"]["code"] == -32700 for r in replies)


async def test_a_body_shorter_than_its_length_costs_only_what_it_swallowed(
    daemon: RawDaemon,
) -> None:
    """The length reaches into the next frame: that one is lost too (its bytes were the
    body), its tail is a bad header block, and the frame after it is answered."""
    short = b'{"jsonrpc":"2.0","id":"short","method":"session/list"}'
    victim = frame(b'{"jsonrpc":"2.0","id":"victim","method":"session/list"}')
    daemon.write(b"Content-Length: %d\r\n\r\n" % (len(short) + 30) + short + victim)
    replies = await after(daemon, b"")
    assert [(r["id"], r["error"]["code"]) for r in replies] == [(None, -32700), (None, -32700)]
    assert [r["error"]["data"]["kind"] for r in replies] == ["parse_error", "invalid_framing"]


async def test_a_request_over_max_request_bytes_is_refused_and_skipped(
    daemon: RawDaemon, data_dir: Path
) -> None:
    before = snapshot(data_dir)
    big = json.dumps(
        {
            "jsonrpc": "2.0",
            "id": "big",
            "method": "session/append",
            "params": {"sessionId": SID, "messages": [user("x" * (65 * 2**20))]},
        }
    ).encode()
    (reply,) = await after(daemon, frame(big), replies=1)
    assert reply["id"] is None
    assert reply["error"]["code"] == 4014
    assert reply["error"]["data"] == {
        "kind": "too_large",
        "limit": "maxRequestBytes",
        "maxBytes": 64 * 2**20,
        "bytes": len(big),
    }
    assert snapshot(data_dir) == before


async def test_one_message_over_the_default_max_message_bytes_is_refused(
    daemon: RawDaemon, data_dir: Path
) -> None:
    """The reported 50 MB message: refused at once (16 MiB by default), nothing written, and
    the session still renders as before."""
    before = snapshot(data_dir)
    huge = assistant("z" * (16 * 2**20 + 1))
    error = await daemon.error("session/append", {"sessionId": SID, "messages": [huge]})
    assert error["code"] == 4014
    assert error["data"]["limit"] == "maxMessageBytes" and error["data"]["maxBytes"] == 16 * 2**20
    assert snapshot(data_dir) == before
    rendered = await daemon.call("context/render", {"sessionId": SID})
    assert rendered["tokens"]["total"] < 1000


# ---- request ids ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "bad_id",
    [{"a": 1}, [1], True, False, 1.5, 1.0, 2**53, -(2**53), 2**70, 10**30],
    ids=repr,
)
async def test_a_bad_id_is_32600_and_the_request_is_not_run(
    daemon: RawDaemon, data_dir: Path, bad_id: Any
) -> None:
    before = snapshot(data_dir)
    message = {
        "jsonrpc": "2.0",
        "id": bad_id,
        "method": "session/append",
        "params": {"sessionId": SID, "messages": [assistant("must not be written")]},
    }
    (reply,) = await after(daemon, frame(json.dumps(message).encode()), replies=1)
    assert reply["id"] is None and reply["error"]["code"] == -32600, reply
    assert reply["error"]["data"]["kind"] == "invalid_request"
    assert snapshot(data_dir) == before


@pytest.mark.parametrize("good_id", ["", "ü-id", 0, 2**53 - 1, -(2**53 - 1)], ids=repr)
async def test_good_ids_come_back_exactly(daemon: RawDaemon, good_id: Any) -> None:
    message = {"jsonrpc": "2.0", "id": good_id, "method": "session/list"}
    (reply,) = await after(daemon, frame(json.dumps(message).encode()), replies=1)
    assert reply["id"] == good_id and type(reply["id"]) is type(good_id)
    assert "sessions" in reply["result"]


async def test_a_null_id_is_answered_with_a_null_id(daemon: RawDaemon) -> None:
    (reply,) = await after(
        daemon, frame(b'{"jsonrpc":"2.0","id":null,"method":"session/list"}'), replies=1
    )
    assert reply["id"] is None and "sessions" in reply["result"]


async def test_a_message_with_only_an_id_is_answered(daemon: RawDaemon) -> None:
    (reply,) = await after(daemon, frame(b'{"jsonrpc":"2.0","id":41}'), replies=1)
    assert reply["id"] == 41 and reply["error"]["code"] == -32600


# ---- params --------------------------------------------------------------------------------


@pytest.mark.parametrize("params", ["{}", "[]", "null", None])
@pytest.mark.parametrize("method", ["session/list", "daemon/status"])
async def test_empty_params_in_any_form_mean_no_arguments(
    daemon: RawDaemon, method: str, params: str | None
) -> None:
    tail = f',"params":{params}' if params is not None else ""
    body = f'{{"jsonrpc":"2.0","id":"e","method":"{method}"{tail}}}'.encode()
    (reply,) = await after(daemon, frame(body), replies=1)
    assert "result" in reply, reply


@pytest.mark.parametrize("params", ["{}", "[]", "null", None])
async def test_empty_params_for_a_method_that_needs_some_is_a_typed_error(
    daemon: RawDaemon, data_dir: Path, params: str | None
) -> None:
    before = snapshot(data_dir)
    tail = f',"params":{params}' if params is not None else ""
    body = f'{{"jsonrpc":"2.0","id":"e","method":"session/append"{tail}}}'.encode()
    (reply,) = await after(daemon, frame(body), replies=1)
    error = reply["error"]
    assert error["code"] == -32602
    assert error["data"] == {"kind": "invalid_params", "fields": ["params.sessionId"]}
    assert snapshot(data_dir) == before


async def test_an_lsp_method_with_bad_params_has_no_traceback(
    daemon: RawDaemon, data_dir: Path
) -> None:
    body = b'{"jsonrpc":"2.0","id":"i","method":"initialize","params":{"processId":"x"}}'
    (reply,) = await after(daemon, frame(body), replies=1)
    assert reply["error"]["code"] == -32602
    assert_clean(reply, data_dir)


# ---- names and paths -----------------------------------------------------------------------


@pytest.mark.parametrize("bad", ["a\n", "a\nb", "a\x00", "\n"])
async def test_session_ids_match_in_full(daemon: RawDaemon, data_dir: Path, bad: str) -> None:
    before = snapshot(data_dir)
    error = await daemon.error("session/open", {"sessionId": bad})
    assert error["code"] == 4000 and error["data"]["kind"] == "invalid_session_id"
    assert snapshot(data_dir) == before


async def test_unknown_session_does_not_show_the_data_dir(
    daemon: RawDaemon, data_dir: Path
) -> None:
    error = await daemon.error("session/get", {"sessionId": "hard-nobody"})
    assert error["code"] == 4004
    assert str(data_dir) not in json.dumps(error)


@pytest.mark.parametrize("name", ["", "\n", "main\n", "nope"])
async def test_checkout_of_a_bad_branch_writes_nothing(
    daemon: RawDaemon, data_dir: Path, name: str
) -> None:
    before = snapshot(data_dir)
    for _ in range(2):
        error = await daemon.error("session/checkout", {"sessionId": SID, "branch": name})
        assert error["code"] == 4006 and error["data"]["kind"] == "unknown_branch"
    assert snapshot(data_dir) == before


# ---- stdin ---------------------------------------------------------------------------------


def _serve(data_dir: Path, stdin: Any, **kw: Any) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(
        serve_command(data_dir),
        stdin=stdin,
        capture_output=True,
        timeout=60,
        check=False,
        **kw,
    )


@pytest.mark.parametrize("kind", ["devnull", "empty-file", "closed", "eof-pipe"])
@pytest.mark.filterwarnings("ignore::pytest.PytestWarning")
def test_serve_exits_0_on_an_empty_or_closed_stdin(tmp_path: Path, kind: str) -> None:
    data_dir = tmp_path / "data"
    if kind == "devnull":
        done = _serve(data_dir, subprocess.DEVNULL)
    elif kind == "empty-file":
        empty = tmp_path / "empty"
        empty.write_bytes(b"")
        with open(empty, "rb") as fh:
            done = _serve(data_dir, fh)
    elif kind == "closed":
        # the child starts with fd 0 closed (`compactd serve <&-`)
        done = subprocess.run(
            ["/bin/sh", "-c", 'exec "$@" <&-', "sh", *serve_command(data_dir)],
            capture_output=True,
            timeout=60,
            check=False,
        )
    else:
        done = _serve(data_dir, None, input=b"")
    assert done.returncode == 0, done.stderr.decode()
    assert b"Traceback" not in done.stderr, done.stderr.decode()
    assert done.stdout == b""


@pytest.mark.filterwarnings("ignore::pytest.PytestWarning")
def test_serve_reads_a_regular_file_as_stdin(tmp_path: Path) -> None:
    """A file as stdin (epoll refuses one) is read: its `exit` without `shutdown` gives 1."""
    requests = tmp_path / "requests"
    requests.write_bytes(frame(b'{"jsonrpc":"2.0","method":"exit"}'))
    with open(requests, "rb") as fh:
        done = _serve(tmp_path / "data", fh)
    assert done.returncode == 1, done.stderr.decode()
    assert b"Traceback" not in done.stderr


async def test_a_daemon_keeps_serving_while_stdin_stays_open(root: Path) -> None:
    """The thread-fed reader (a terminal, a file) must not stop the loop from answering."""
    env = {**os.environ}
    proc = await asyncio.create_subprocess_exec(
        *serve_command(root / "pty-data"),
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.DEVNULL,
        env=env,
    )
    assert proc.stdin is not None and proc.stdout is not None
    proc.stdin.write(frame(b'{"jsonrpc":"2.0","id":1,"method":"daemon/status"}'))
    await proc.stdin.drain()
    header = await asyncio.wait_for(proc.stdout.readuntil(b"\r\n\r\n"), 30)
    assert header.startswith(b"Content-Length:")
    proc.stdin.close()
    assert await asyncio.wait_for(proc.wait(), 30) == 0


# ---- data dir ------------------------------------------------------------------------------


@pytest.mark.files_only
async def test_the_watcher_survives_the_data_dir_being_removed_and_recreated(
    tmp_path: Path,
) -> None:
    """Daemon A has a session loaded; the data dir is moved away and restored as a new folder
    (a backup put back); an append by daemon B must still reach A as `session/changed`."""
    import shutil

    data_dir = tmp_path / "data"
    a = await RawDaemon.spawn(data_dir, log_path=tmp_path / "a.log")
    b = None
    try:
        sid = "watched"
        await a.call("session/open", {"sessionId": sid})
        await a.call("session/append", {"sessionId": sid, "messages": [user("one")]})
        shutil.move(data_dir, tmp_path / "moved-away")
        shutil.copytree(tmp_path / "moved-away", data_dir)
        b = await RawDaemon.spawn(data_dir, log_path=tmp_path / "b.log")
        await b.call("session/append", {"sessionId": sid, "messages": [assistant("two")]})
        changed = await a.wait_for(
            lambda m: m.get("method") == "session/changed" and m["params"]["sessionId"] == sid,
            timeout=20,
        )
        assert changed["params"]["events"] >= 1
        got = await a.call("session/get", {"sessionId": sid})
        assert [n["kind"] for n in got["nodes"]] == ["user", "assistant"]
        assert await b.shutdown_and_exit() == 0
        assert await a.shutdown_and_exit() == 0
    finally:
        await a.kill()
        if b is not None:
            await b.kill()


@pytest.mark.files_only
async def test_an_existing_data_dir_keeps_its_mode_and_new_parents_are_private(
    tmp_path: Path,
) -> None:
    import stat

    shared = tmp_path / "shared"
    shared.mkdir()
    os.chmod(shared, 0o755)  # shared on purpose
    existing = tmp_path / "existing"
    existing.mkdir()
    os.chmod(existing, 0o750)
    for data_dir in (shared / "a" / "b" / "data", existing):
        raw = await RawDaemon.spawn(data_dir, log_path=tmp_path / "d.log", umask=0)
        try:
            await raw.call("session/open", {"sessionId": "modes"})
            assert await raw.shutdown_and_exit() == 0
        finally:
            await raw.kill()
    assert stat.S_IMODE(shared.stat().st_mode) == 0o755
    assert stat.S_IMODE(existing.stat().st_mode) == 0o750
    for made in (shared / "a", shared / "a" / "b", shared / "a" / "b" / "data"):
        assert stat.S_IMODE(made.stat().st_mode) == 0o700, made


@pytest.mark.files_only
async def test_a_symlinked_session_log_is_refused_not_followed(tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    outside = tmp_path / "outside.jsonl"
    raw = await RawDaemon.spawn(data_dir, log_path=tmp_path / "a.log")
    try:
        await raw.call("session/open", {"sessionId": "linked"})
        assert await raw.shutdown_and_exit() == 0
    finally:
        await raw.kill()
    log = data_dir / "sessions" / "linked.jsonl"
    outside.write_bytes(log.read_bytes())  # a valid log, but reached through a link
    log.unlink()
    log.symlink_to(outside)
    before = outside.read_bytes()
    raw = await RawDaemon.spawn(data_dir, log_path=tmp_path / "b.log")
    try:
        for method, params in [
            ("session/get", {"sessionId": "linked"}),
            ("session/append", {"sessionId": "linked", "messages": [user("x")]}),
        ]:
            error = await raw.error(method, params)
            assert error["code"] == 4060 and error["data"]["kind"] == "store_failure", error
            assert_clean({"error": error}, data_dir)
        assert await raw.shutdown_and_exit() == 0
    finally:
        await raw.kill()
    assert outside.read_bytes() == before


async def test_a_reader_that_cannot_go_on_exits_1_not_0(tmp_path: Path) -> None:
    """An error reading stdin (EIO, …) is not a clean end of input: exit code 1."""
    from compactd.daemon.main import build
    from compactd.daemon.stdio import read_messages
    from compactd.service.app import Settings

    server, _app = build(Settings(data_dir=tmp_path / "data", watch=False))
    reader = asyncio.StreamReader()
    reader.set_exception(OSError(5, "Input/output error"))
    await read_messages(server, reader)
    assert server.exit_code == 1
