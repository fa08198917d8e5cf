"""Errors on the wire: the project's codes with a structured `data.kind`, invalid params that
name the camelCase field, −32601 for unknown methods, and never a traceback. Every rejected
call must leave the session log byte-for-byte as it was.

This daemon has no summary provider, so the LLM tiers are skipped and a tiny window cannot fit.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
from compactd.protocol.errors import CODE_BY_KIND

from .convo import assistant, tool_results, tool_turns, tool_use, user
from .wire import RawDaemon, logs_bytes

pytestmark = pytest.mark.asyncio(loop_scope="module")

SID = "err-main"


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("errors") / "data"


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def daemon(data_dir: Path) -> AsyncIterator[RawDaemon]:
    raw = await RawDaemon.spawn(data_dir, log_path=data_dir.parent / "daemon.log")
    try:
        await raw.call("session/open", {"sessionId": SID})
        await raw.call(
            "session/append",
            {
                "sessionId": SID,
                "messages": [
                    user("fix the parser"),
                    assistant("looking", tool_use("e1", "Read")),
                    tool_results(("e1", "def parse(): ...")),
                    assistant("found it"),
                ],
            },
        )
        yield raw
        assert await raw.shutdown_and_exit() == 0
    finally:
        await raw.kill()
    assert raw.violations == []
    for message in raw.received:  # whatever went wrong, no traceback ever reached the client
        assert "Traceback" not in str(message.get("error", ""))


async def rejected(
    daemon: RawDaemon, data_dir: Path, method: str, params: Any, kind: str
) -> dict[str, Any]:
    """Call, expect the error of `kind` (code from protocol.errors), and check nothing was
    written to any session; returns the error's data."""
    sessions = sorted(p.stem for p in (data_dir / "sessions").glob("*.jsonl"))
    before = logs_bytes(data_dir, sessions)
    error = await daemon.error(method, params)
    assert error["code"] == CODE_BY_KIND[kind], error
    assert error["data"]["kind"] == kind, error
    assert error["message"] and "Traceback" not in error["message"]
    assert "traceback" not in error["data"]
    after = sorted(p.stem for p in (data_dir / "sessions").glob("*.jsonl"))
    assert after == sessions, "a rejected call created a session"
    assert logs_bytes(data_dir, sessions) == before, "a rejected call wrote to a log"
    return error["data"]


async def test_unknown_session_is_4004(daemon: RawDaemon, data_dir: Path) -> None:
    for method, extra in [
        ("session/get", {}),
        ("session/append", {"messages": [user("hi")]}),
        ("session/toolResult", {"toolUseId": "x", "content": "y"}),
        ("context/render", {}),
        ("context/measure", {}),
        ("context/compact", {}),
        ("context/reportUsage", {"model": "m"}),
        ("function/start", {"name": "Task"}),
    ]:
        data = await rejected(
            daemon, data_dir, method, {"sessionId": "nobody", **extra}, "unknown_session"
        )
        assert data["sessionId"] == "nobody"


async def test_invalid_session_id_is_4000(daemon: RawDaemon, data_dir: Path) -> None:
    for bad in ["../x", "a/b", "", ".hidden", "x" * 200, "nul\x00byte"]:
        data = await rejected(
            daemon, data_dir, "session/open", {"sessionId": bad}, "invalid_session_id"
        )
        assert data["sessionId"] == bad


async def test_invalid_graph_pairing_and_content(daemon: RawDaemon, data_dir: Path) -> None:
    graph = [
        ("session/append", {"nodes": [{"kind": "bogus"}]}),
        ("session/append", {"nodes": [{"kind": "user", "id": "n2", "content": "dup"}]}),
        ("session/append", {"nodes": [{"kind": "tool", "tool_use_id": "z", "name": "R"}]}),
        ("function/complete", {"functionId": "n2", "output": "x"}),  # not a function
        ("session/branch", {"name": "main"}),  # exists
    ]
    for method, params in graph:
        await rejected(daemon, data_dir, method, {"sessionId": SID, **params}, "invalid_graph")
    pairing = [
        ("session/toolResult", {"toolUseId": "never-called", "content": "x"}),
        ("session/toolResult", {"toolUseId": "e1", "content": "answered twice"}),
        ("session/append", {"messages": [user("q"), assistant("a", tool_use("e1"))]}),
    ]
    for method, params in pairing:
        data = await rejected(
            daemon, data_dir, method, {"sessionId": SID, **params}, "invalid_pairing"
        )
        assert data["toolUseId"] in ("never-called", "e1")
    content = [
        ("session/append", {"messages": [{"role": "user", "content": [{"type": "text"}]}]}),
        ("session/toolResult", {"toolUseId": "e1", "content": [{"type": "thinking"}]}),
        ("session/append", {"messages": [{"role": "wizard", "content": "hi"}]}),
        ("session/append", {"messages": [{"role": "user", "content": 42}]}),
        ("session/append", {"messages": [user("x")], "nodes": [{"kind": "user"}]}),
        ("context/render", {"overflow": {"status": 500, "message": "server error"}}),
    ]
    for method, params in content:
        await rejected(daemon, data_dir, method, {"sessionId": SID, **params}, "invalid_content")


async def test_unknown_node_branch_and_bad_config(daemon: RawDaemon, data_dir: Path) -> None:
    data = await rejected(
        daemon, data_dir, "session/get", {"sessionId": SID, "nodeId": "n999"}, "unknown_node"
    )
    assert data["nodeId"] == "n999"
    await rejected(
        daemon, data_dir, "session/checkout", {"sessionId": SID, "branch": "nope"}, "unknown_branch"
    )
    await rejected(
        daemon, data_dir, "context/render", {"sessionId": SID, "window": 0}, "invalid_config"
    )
    data = await rejected(
        daemon,
        data_dir,
        "session/open",
        {"sessionId": "err-config", "config": {"cascadeThreshold": "high"}},
        "invalid_config",
    )
    assert data["field"] == "cascadeThreshold"


async def test_pending_tool_results_name_the_calls(daemon: RawDaemon, data_dir: Path) -> None:
    sid = "err-pending"
    await daemon.call("session/open", {"sessionId": sid})
    await daemon.call(
        "session/append",
        {
            "sessionId": sid,
            "messages": [user("go"), assistant("two", tool_use("p1"), tool_use("p2"))],
        },
    )
    data = await rejected(
        daemon,
        data_dir,
        "session/append",
        {"sessionId": sid, "messages": [user("are you done?")]},
        "pending_tool_results",
    )
    assert data["pendingToolUseIds"] == ["p1", "p2"]
    data = await rejected(
        daemon, data_dir, "context/render", {"sessionId": sid}, "pending_tool_results"
    )
    assert data["pendingToolUseIds"] == ["p1", "p2"]


async def test_head_conflict_is_4030(daemon: RawDaemon, data_dir: Path) -> None:
    head = (await daemon.call("session/get", {"sessionId": SID}))["head"]
    data = await rejected(
        daemon,
        data_dir,
        "session/append",
        {"sessionId": SID, "messages": [user("late")], "expectedHead": "n2"},
        "head_conflict",
    )
    assert head in str(data)


async def test_cannot_fit_without_a_summary_provider(daemon: RawDaemon, data_dir: Path) -> None:
    sid = "err-fit"
    await daemon.call("session/open", {"sessionId": sid})
    await daemon.call("session/append", {"sessionId": sid, "messages": tool_turns("f", 3, 100)})
    data = await rejected(
        daemon,
        data_dir,
        "context/render",
        {"sessionId": sid, "cascade": True, "window": 200, "maxOutputTokens": 100},
        "cannot_fit",
    )
    assert data["limit"] == 100 and data["tokens"] > 100
    # the tiers it tried are in the error; the snip it drafted was not written
    assert any(e["tier"] == "summary" and not e["applied"] for e in data["events"])
    compact = await daemon.call("context/compact", {"sessionId": sid})
    assert compact["applied"] is False and "provider" in compact["reason"]


async def test_invalid_params_name_the_camel_case_field(daemon: RawDaemon) -> None:
    cases = [
        ("context/render", {}, "sessionId"),
        ("context/render", {"sessionId": SID, "maxOutputTokens": "many"}, "maxOutputTokens"),
        ("context/render", {"sessionId": SID, "window": 1.5}, "window"),
        ("context/render", {"sessionId": SID, "cascade": "yes"}, "cascade"),
        ("context/render", {"sessionId": SID, "format": "gemini"}, "format"),
        ("session/append", {"sessionId": SID, "expectedHead": 5, "messages": []}, "expectedHead"),
        ("session/append", {"sessionId": SID, "messages": "hello"}, "messages"),
        (
            "context/reportUsage",
            {"sessionId": SID, "model": "m", "error": {"status": "400"}},
            "error.status",
        ),
        ("session/toolResult", {"sessionId": SID, "toolUseId": "e1", "content": 7}, "content"),
        ("context/snip", {"sessionId": SID, "targetTokens": True}, "targetTokens"),
        ("function/start", {"sessionId": SID, "name": "T", "toolUseId": ["x"]}, "toolUseId"),
    ]
    for method, params, field in cases:
        error = await daemon.error(method, params)
        assert error["code"] == -32602, (method, params, error)
        assert field in error["message"], (field, error["message"])
        assert "session_id" not in error["message"] and "max_output_tokens" not in error["message"]


async def test_params_nested_too_deep_are_rejected(daemon: RawDaemon, data_dir: Path) -> None:
    deep: dict[str, Any] = {}
    cursor = deep
    for _ in range(300):
        cursor["x"] = {}
        cursor = cursor["x"]
    before = logs_bytes(data_dir, [SID])
    error = await daemon.error(
        "session/append",
        {
            "sessionId": SID,
            "messages": [user("q"), assistant("a", tool_use("deep", "Read", **deep))],
        },
    )
    assert error["code"] == -32602 and "messages" in error["message"]
    assert logs_bytes(data_dir, [SID]) == before


async def test_unknown_method_is_32601(daemon: RawDaemon) -> None:
    for method in ["session/delete", "context/renderr", "", "$/unknownRequest"]:
        error = await daemon.error(method, {})
        assert error["code"] == -32601, (method, error)


@pytest.mark.files_only
async def test_a_corrupt_log_is_a_store_failure_never_a_crash(
    daemon: RawDaemon, data_dir: Path
) -> None:
    # a log line of the right JSON shape but the wrong types (hand-edited or foreign): reported
    # as unreadable, and the daemon goes on serving
    (data_dir / "sessions" / "err-corrupt.jsonl").write_bytes(
        b'{"t":"open","seq":"one","ts":1.0,"sid":"err-corrupt","config":{},"meta":{}}\n'
    )
    error = await daemon.error("session/get", {"sessionId": "err-corrupt"})
    assert error["code"] == CODE_BY_KIND["store_failure"]
    assert error["data"]["kind"] == "store_failure"
    assert "no valid header" in error["message"]
    assert (await daemon.call("session/get", {"sessionId": SID}))["sessionId"] == SID


async def test_internal_error_carries_no_traceback(tmp_path: Path) -> None:
    """Every bug takes this path: the `rpc` wrapper answers an unexpected exception with a
    −32603 that names nothing but its type (the details go to the daemon's log)."""
    from compactd.daemon.main import build
    from compactd.daemon.server import rpc
    from compactd.protocol.types import ListParams
    from compactd.service.app import Settings
    from pygls.exceptions import JsonRpcInternalError

    server, _app = build(Settings(data_dir=tmp_path, watch=False))

    @rpc(server, "test/boom", ListParams)
    def boom(ls: object, params: ListParams) -> None:
        raise RuntimeError("secret detail at /home/user/.ssh")

    handler = server.protocol.fm.features["test/boom"]
    with pytest.raises(JsonRpcInternalError) as caught:
        await handler({})
    error = caught.value.to_response_error()
    assert error.code == -32603
    assert error.data == {"kind": "internal_error", "type": "RuntimeError"}
    assert "secret" not in error.message and "Traceback" not in error.message
