"""Malformed input, byte by byte: broken framing, bodies that are not JSON or not JSON-RPC,
params of the wrong type, path tricks in ids, a 10 MB tool result. Each is answered with an
error or logged and skipped; the daemon keeps serving (every case ends with a probe request
that must be answered); a rejected call writes nothing (every session log is compared before
and after); nothing is ever shown to the user as `window/showMessage`.

The daemon runs with umask 0, so the 0600 / 0700 modes it reports are its own doing.
"""

from __future__ import annotations

import os
import stat
from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio

from .convo import assistant, tool_turns, tool_use, user
from .wire import RawDaemon, frame, logs_bytes

pytestmark = pytest.mark.asyncio(loop_scope="module")

SID = "mal-main"
STATUS = b'{"jsonrpc":"2.0","id":"probe-%d","method":"daemon/status","params":{}}'


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("malformed")


@pytest.fixture(scope="module")
def data_dir(root: Path) -> Path:
    return root / "deep" / "down" / "data"  # room for `../..` to land inside `root`


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def daemon(root: Path, data_dir: Path) -> AsyncIterator[RawDaemon]:
    raw = await RawDaemon.spawn(data_dir, log_path=root / "daemon.log", umask=0)
    try:
        await raw.call("session/open", {"sessionId": SID})
        await raw.call("session/append", {"sessionId": SID, "messages": tool_turns("mal", 2)})
        yield raw
        assert await raw.shutdown_and_exit() == 0
    finally:
        await raw.kill()
    assert raw.violations == []
    assert not [m for m in raw.received if m.get("method") == "window/showMessage"]


def sessions(data_dir: Path) -> list[str]:
    return sorted(p.stem for p in (data_dir / "sessions").glob("*.jsonl"))


@contextmanager
def nothing_written(data_dir: Path) -> Iterator[None]:
    """No session is created and no log changes inside the block."""
    before_ids = sessions(data_dir)
    before = logs_bytes(data_dir, before_ids)
    yield
    assert sessions(data_dir) == before_ids
    assert logs_bytes(data_dir, before_ids) == before


_probes = iter(range(1, 10**6))


async def exchange(
    daemon: RawDaemon, data: bytes, replies: int | None = None
) -> list[dict[str, Any]]:
    """Write `data`, then a well-formed probe request; after checking the probe's answer,
    returns the replies that came before it, or — requests are answered as they finish, not
    in the order they came — the first `replies` besides it."""
    start = len(daemon.received)
    n = next(_probes)
    daemon.write(data + frame(STATUS % n))
    await daemon.drain()
    probe = await daemon.response(f"probe-{n}", start=start)
    assert probe["result"]["dataDir"], "the daemon must still serve after malformed input"
    return await daemon.replies_besides(probe, start, replies)


def assert_error(reply: dict[str, Any], code: int, msg_id: Any) -> None:
    assert reply["id"] == msg_id and "id" in reply
    assert reply["error"]["code"] == code, reply
    assert "result" not in reply


# ---- framing ---------------------------------------------------------------------------------


async def test_garbage_header_lines_are_skipped(daemon: RawDaemon, data_dir: Path) -> None:
    body = b'{"jsonrpc":"2.0","id":"after-garbage","method":"session/list","params":{}}'
    with nothing_written(data_dir):
        replies = await exchange(
            daemon, b"this is not a header\r\nX-Junk: yes\r\n" + frame(body), replies=1
        )
    assert [r["id"] for r in replies] == ["after-garbage"]
    assert SID in [s["sessionId"] for s in replies[0]["result"]["sessions"]]
    assert "not a header" in daemon.log_text()


async def test_frames_without_a_usable_length_are_answered_and_skipped(
    daemon: RawDaemon, data_dir: Path
) -> None:
    unframed = b'{"jsonrpc":"2.0","id":"unframed","method":"session/open","params":{}}'
    with nothing_written(data_dir):
        replies = await exchange(
            daemon,
            b"Content-Type: application/vscode-jsonrpc; charset=utf-8\r\n\r\n"  # no length
            + unframed  # a body nobody announced: read as a header line, then skipped
            + b"\r\n\r\n"
            + b"Content-Length: twelve\r\n\r\n"
            + b"Content-Length: -5\r\n\r\n"
            + b"Content-Length: 99999999999\r\n\r\n",  # over the daemon's body limit
        )
    # each is answered (id null), and the reader finds the next frame after each one
    codes = [(r["id"], r["error"]["code"], r["error"]["data"]["kind"]) for r in replies]
    assert codes == [
        (None, -32700, "invalid_framing"),
        (None, -32700, "invalid_framing"),
        (None, -32700, "invalid_framing"),
        (None, 4014, "too_large"),
    ]
    assert replies[3]["error"]["data"]["limit"] == "maxRequestBytes"
    assert "usable Content-Length" in daemon.log_text()


async def test_a_long_length_swallows_what_follows_and_framing_resumes(
    daemon: RawDaemon, data_dir: Path
) -> None:
    swallowed = frame(b'{"jsonrpc":"2.0","id":"swallowed","method":"session/open","params":{}}')
    head = b'{"jsonrpc":"2.0","id":"too-long","method":"daemon/status"}'
    # the length covers this body and the whole next message: both are one broken body
    data = b"Content-Length: %d\r\n\r\n" % (len(head) + len(swallowed)) + head + swallowed
    with nothing_written(data_dir):
        replies = await exchange(daemon, data)
    (reply,) = replies
    assert_error(reply, -32700, None)


async def test_an_over_long_header_line_is_answered_and_dropped(
    daemon: RawDaemon, data_dir: Path
) -> None:
    with nothing_written(data_dir):
        replies = await exchange(daemon, b"X-Huge: " + b"a" * (3 * 2**20) + b"\r\n\r\n")
    (reply,) = replies
    assert_error(reply, -32700, None)
    assert reply["error"]["data"]["kind"] == "invalid_framing"


# ---- bodies ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "body",
    [
        b"not json at all",
        b'{"jsonrpc":"2.0","id":5,"method":"daemon/status"',  # cut short
        b'{"jsonrpc":"2.0","id":6,"method":"daemon/status",}',  # trailing comma
        b"\xff\xfe\x00garbage",  # not UTF-8, and not JSON once repaired either
        b'{"jsonrpc":"2.0","id":7,"method":"daemon/status","params":{"x":NaN}}',
        b"",
    ],
)
async def test_a_body_that_is_not_json_is_32700_with_id_null(
    daemon: RawDaemon, data_dir: Path, body: bytes
) -> None:
    with nothing_written(data_dir):
        (reply,) = await exchange(daemon, frame(body))
    assert_error(reply, -32700, None)


@pytest.mark.parametrize(
    ("text", "stored"),
    [
        (b"cut mid-emoji \\ud83d", "cut mid-emoji \ufffd"),  # what JSON.stringify writes
        (b"\\udc00 a lone low half", "\ufffd a lone low half"),
        (b"a byte that is not UTF-8: \xff", "a byte that is not UTF-8: \ufffd"),
        (b"a whole pair \\ud83d\\ude00", "a whole pair \U0001f600"),
    ],
)
async def test_text_a_utf8_encoder_would_repair_is_stored_repaired_and_answered_on_its_id(
    daemon: RawDaemon, text: bytes, stored: str
) -> None:
    """Once answered −32700 with id null (a JSON-RPC client then waits out its timeout):
    now the request runs, on its own id, with the text as a UTF-8 encoder makes it."""
    body = (
        b'{"jsonrpc":"2.0","id":"cut","method":"session/append","params":{"sessionId":"'
        + SID.encode()
        + b'","messages":[{"role":"user","content":"'
        + text
        + b'"}]}}'
    )
    (reply,) = await exchange(daemon, frame(body), replies=1)
    assert reply["id"] == "cut" and "result" in reply, reply
    [node_id] = reply["result"]["nodeIds"]
    got = await daemon.call("session/get", {"sessionId": SID, "nodeId": node_id})
    assert got["node"]["content"] == [{"type": "text", "text": stored}]
    await daemon.call(
        "session/append", {"sessionId": SID, "messages": [assistant("noted")]}
    )  # the turn goes on


@pytest.mark.parametrize("method", ["no/such", "textDocument/hover", "workspace/symbol"])
@pytest.mark.parametrize("params", [None, "null", "[]", "{}", "5", '"x"', "[1, 2]"])
async def test_an_unknown_method_is_32601_whatever_its_params(
    daemon: RawDaemon, data_dir: Path, method: str, params: str | None
) -> None:
    tail = f',"params":{params}' if params is not None else ""
    with nothing_written(data_dir):
        (reply,) = await exchange(
            daemon, frame(f'{{"jsonrpc":"2.0","id":"u","method":"{method}"{tail}}}'.encode())
        )
    assert_error(reply, -32601, "u")
    assert reply["error"]["data"]["kind"] == "method_not_found"


@pytest.mark.parametrize(
    ("message", "msg_id"),
    [
        ([], None),
        ([{"jsonrpc": "2.0", "id": 1, "method": "daemon/status"}], None),  # no batches
        (42, None),
        ("daemon/status", None),
        (None, None),
        ({"id": 7, "method": "daemon/status"}, 7),  # no "jsonrpc"
        ({"jsonrpc": "1.0", "id": 8, "method": "daemon/status"}, 8),
        ({"jsonrpc": "2.0", "id": 9, "method": 5}, 9),
    ],
)
async def test_not_a_json_rpc_request_is_32600(
    daemon: RawDaemon, data_dir: Path, message: Any, msg_id: Any
) -> None:
    import json

    with nothing_written(data_dir):
        (reply,) = await exchange(daemon, frame(json.dumps(message).encode()))
    assert_error(reply, -32600, msg_id)


async def test_a_stray_response_and_unknown_notifications_get_no_answer(
    daemon: RawDaemon, data_dir: Path
) -> None:
    with nothing_written(data_dir):
        replies = await exchange(
            daemon,
            frame(b'{"jsonrpc":"2.0","id":"nobody-asked","result":{}}')
            + frame(b'{"jsonrpc":"2.0","method":"no/such/notification","params":{}}')
            + frame(
                b'{"jsonrpc":"2.0","method":"session/append","params":{"sessionId":"'
                + SID.encode()
                + b'"}}'
            ),
        )
    assert replies == []  # notifications are never answered, not even with an error


@pytest.mark.parametrize(
    ("method", "params", "field"),
    [
        ("context/render", [SID], "params"),
        ("context/render", "mal-main", "params"),
        ("context/render", {"sessionId": ["mal-main"]}, "sessionId"),
        ("context/render", {"sessionId": SID, "system": 3}, "system"),
        ("context/render", {"sessionId": SID, "tools": {"name": "x"}}, "tools"),
        ("session/append", {"sessionId": SID, "messages": [1, 2]}, "messages"),
        ("session/append", {"sessionId": SID, "nodes": {"kind": "user"}}, "nodes"),
        ("session/open", {"config": "fast"}, "config"),
    ],
)
async def test_params_of_the_wrong_type_are_32602(
    daemon: RawDaemon, data_dir: Path, method: str, params: Any, field: str
) -> None:
    with nothing_written(data_dir):
        error = await daemon.error(method, params)
    assert error["code"] == -32602, error
    assert field in error["message"]


async def test_unknown_methods_and_sessions(daemon: RawDaemon, data_dir: Path) -> None:
    with nothing_written(data_dir):
        assert (await daemon.error("session/destroy", {"sessionId": SID}))["code"] == -32601
        missing = await daemon.error("session/get", {"sessionId": "mal-missing"})
    assert missing["code"] == 4004 and missing["data"]["sessionId"] == "mal-missing"


async def test_non_ascii_text_round_trips(daemon: RawDaemon) -> None:
    # the daemon writes UTF-8 bodies: its Content-Length must count bytes, which the raw
    # client's frame check verifies on every reply
    text = "héllo ✓ 日本 🎉 \u2028 end"
    sid = "mal-utf8"
    await daemon.call("session/open", {"sessionId": sid})
    await daemon.call("session/append", {"sessionId": sid, "messages": [user(text)]})
    rendered = await daemon.call("context/render", {"sessionId": sid})
    assert rendered["request"]["messages"][0]["content"][0]["text"] == text
    assert daemon.violations == []


# ---- paths -------------------------------------------------------------------------------------


def tree(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*") if p.name != "daemon.log"}


@pytest.mark.parametrize(
    "bad",
    [
        "../../etc/passwd",
        "../escape",
        "..",
        "/tmp/absolute",
        "a/b",
        "back\\slash",
        ".lock",
        "sessions/../x",
    ],
)
async def test_path_tricks_in_ids_touch_nothing(
    daemon: RawDaemon, root: Path, data_dir: Path, bad: str
) -> None:
    before = tree(root)
    with nothing_written(data_dir):
        for method, params in [
            ("session/open", {"sessionId": bad}),
            ("session/get", {"sessionId": bad}),
            ("session/append", {"sessionId": bad, "messages": [user("x")]}),
            ("context/render", {"sessionId": bad}),
        ]:
            error = await daemon.error(method, params)
            assert error["code"] == 4000 and error["data"]["kind"] == "invalid_session_id", error
        for method, params in [
            ("session/branch", {"sessionId": SID, "name": bad}),
            ("session/append", {"sessionId": SID, "nodes": [{"kind": "user", "id": bad}]}),
        ]:
            error = await daemon.error(method, params)
            assert error["code"] == 4012, error
        error = await daemon.error("session/checkout", {"sessionId": SID, "branch": bad})
        assert error["code"] == 4006
    assert tree(root) == before
    assert not Path("/etc/passwd.jsonl").exists()


# ---- size ---------------------------------------------------------------------------------------


@pytest.mark.files_only
async def test_a_10_mb_tool_result_is_stored_whole_and_truncated_in_render(
    daemon: RawDaemon, data_dir: Path
) -> None:
    sid = "mal-big"
    await daemon.call("session/open", {"sessionId": sid})
    await daemon.call(
        "session/append",
        {
            "sessionId": sid,
            "messages": [user("dump the log"), assistant("ok", tool_use("big", "Bash"))],
        },
    )
    size = 10 * 2**20
    middle = "0123456789abcdef" * (size // 16)
    content = "HEAD<" + middle[: size - 10] + ">TAIL"
    assert len(content) == size
    await daemon.call(
        "session/toolResult", {"sessionId": sid, "toolUseId": "big", "content": content}
    )
    log = (data_dir / "sessions" / f"{sid}.jsonl").stat().st_size
    assert log > size
    tool_id = (await daemon.call("session/get", {"sessionId": sid}))["nodes"][1]["calls"][0]["id"]
    stored = await daemon.call("session/get", {"sessionId": sid, "nodeId": tool_id})
    assert stored["node"]["result"] == content
    rendered = await daemon.call("context/render", {"sessionId": sid})
    (result,) = [
        b
        for m in rendered["request"]["messages"]
        for b in m["content"]
        if b["type"] == "tool_result"
    ]
    text = result["content"] if isinstance(result["content"], str) else result["content"][0]["text"]
    assert 4_000 <= len(text) <= 4_100
    assert text.startswith(content[:2400]) and text.endswith(content[-1600:])
    assert f"{size - 4000:,} characters truncated" in text
    assert rendered["tokens"]["total"] < 3_000


# ---- files ----------------------------------------------------------------------------------


@pytest.mark.files_only
async def test_data_files_are_0600_and_folders_0700(daemon: RawDaemon, data_dir: Path) -> None:
    assert sessions(data_dir)  # the earlier tests wrote something
    for path in [data_dir, *data_dir.rglob("*")]:
        mode = stat.S_IMODE(os.lstat(path).st_mode)
        expected = 0o700 if path.is_dir() else 0o600
        assert mode == expected, f"{path} is {oct(mode)}"


async def test_no_show_message_was_ever_sent(daemon: RawDaemon) -> None:
    # last in the module: every malformed input above has been through this daemon
    assert len(daemon.received) > 50
    assert not [m for m in daemon.received if m.get("method") == "window/showMessage"]
    assert not [m for m in daemon.received if "method" in m and "id" not in m]
