"""The JSON Schema is what non-Python clients generate their types from, so it must say what
the daemon does: the checked-in `protocol/schema.json`, `compactd schema` and the code's
`schema_text()` are the same text; every method of `protocol.types.METHODS` is served by the
daemon; and live params, results and notifications fit the schema."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import orjson
import pytest
import pytest_asyncio
from compactd.protocol import errors
from compactd.protocol.schema import build_schema, checked_in_schema, schema_text
from compactd.protocol.types import METHODS, NOTIFICATIONS

from .convo import assistant, tool_turns, tool_use, user
from .wire import RawDaemon

live = pytest.mark.asyncio(loop_scope="module")

REPO = Path(__file__).parents[2]
SCHEMA = build_schema()
# the core shapes of DESIGN §6, which clients are promised ("do not rename these")
DESIGN_METHODS = {
    "session/open",
    "session/list",
    "session/get",
    "session/append",
    "session/toolResult",
    "function/start",
    "function/complete",
    "session/branch",
    "session/checkout",
    "context/render",
    "context/measure",
    "context/compact",
    "context/snip",
    "context/reportUsage",
}


def test_checked_in_schema_is_what_the_code_exports() -> None:
    text = schema_text()
    assert (REPO / "protocol" / "schema.json").read_text("utf-8") == text
    assert checked_in_schema() == text  # what an installed package ships


def test_the_cli_prints_the_same_schema() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "compactd", "schema"],
        capture_output=True,
        check=True,
        timeout=60,
    )
    assert out.stdout.decode("utf-8") == schema_text()


def test_schema_covers_every_method_notification_and_error() -> None:
    assert set(SCHEMA["methods"]) == set(METHODS)
    assert set(SCHEMA["notifications"]) == set(NOTIFICATIONS)
    assert {k: v["code"] for k, v in SCHEMA["errors"].items()} == errors.CODE_BY_KIND
    codes = list(errors.CODE_BY_KIND.values())
    assert len(set(codes)) == len(codes)
    assert all(not -32899 <= c <= -32000 for c in codes)  # outside JSON-RPC's and LSP's


def test_every_method_of_the_design_is_in_the_protocol() -> None:
    assert set(METHODS) >= DESIGN_METHODS, DESIGN_METHODS - set(METHODS)
    # and with the core fields of DESIGN §6 under their promised names
    core = {
        "session/append": {"sessionId", "branch", "expectedHead", "messages", "format", "nodes"},
        "context/render": {"sessionId", "branch", "viewer", "model", "window", "cascade"},
        "context/compact": {"sessionId", "branch", "instructions", "workDoneToken"},
        "context/reportUsage": {"sessionId", "model", "usage", "error", "appliedEdits"},
    }
    for method, fields in core.items():
        params = SCHEMA["$defs"][SCHEMA["methods"][method]["params"]["$ref"].rsplit("/", 1)[1]]
        assert fields <= set(params["properties"]), (method, fields - set(params["properties"]))
    render = SCHEMA["$defs"]["RenderResult"]["properties"]
    assert {"request", "tokens", "events"} <= set(render)


# ---- a small JSON Schema checker (the subset the export uses) ---------------------------------


def problems(value: Any, schema: dict[str, Any], path: str = "$") -> list[str]:
    """Where `value` does not fit `schema`; object types with `properties` are closed, so a
    field the daemon sends but the schema does not know is a disagreement too."""
    if "$ref" in schema:
        return problems(value, SCHEMA["$defs"][schema["$ref"].rsplit("/", 1)[1]], path)
    if "anyOf" in schema:
        options = [problems(value, s, path) for s in schema["anyOf"]]
        return [] if any(not o for o in options) else min(options, key=len)
    if "enum" in schema:
        return [] if value in schema["enum"] else [f"{path}: {value!r} not in {schema['enum']}"]
    kind = schema.get("type")
    checks = {
        "object": lambda v: isinstance(v, dict),
        "array": lambda v: isinstance(v, list),
        "string": lambda v: isinstance(v, str),
        "integer": lambda v: isinstance(v, int) and not isinstance(v, bool),
        "number": lambda v: isinstance(v, int | float) and not isinstance(v, bool),
        "boolean": lambda v: isinstance(v, bool),
        "null": lambda v: v is None,
    }
    if kind is not None and not checks[kind](value):
        return [f"{path}: expected {kind}, got {type(value).__name__}"]
    out: list[str] = []
    if kind == "array":
        for i, item in enumerate(value):
            out += problems(item, schema.get("items", {}), f"{path}[{i}]")
    if kind == "object":
        props = schema.get("properties")
        out += [f"{path}: missing {k}" for k in schema.get("required", []) if k not in value]
        for key, item in value.items():
            if props is not None:
                if key not in props:
                    out.append(f"{path}: unknown field {key}")
                else:
                    out += problems(item, props[key], f"{path}.{key}")
            elif "additionalProperties" in schema:
                out += problems(item, schema["additionalProperties"], f"{path}.{key}")
    return out


def test_the_checker_catches_disagreements() -> None:
    result = SCHEMA["methods"]["session/open"]["result"]
    assert (
        problems({"sessionId": "s", "branch": "main", "head": None, "created": True}, result) == []
    )
    assert problems({"sessionId": "s", "branch": "main", "head": None}, result)  # missing
    assert problems({"sessionId": 1, "branch": "main", "head": None, "created": True}, result)
    renamed = {"session_id": "s", "branch": "main", "head": None, "created": True}
    assert problems(renamed, result)


# ---- against the live daemon -----------------------------------------------------------------


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def daemon(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[RawDaemon]:
    root = tmp_path_factory.mktemp("schema")
    raw = await RawDaemon.spawn(
        root / "data", "--summary-provider", "digest", log_path=root / "daemon.log"
    )
    try:
        yield raw
        assert await raw.shutdown_and_exit() == 0
    finally:
        await raw.kill()
    assert raw.violations == []


@live
async def test_every_method_is_served(daemon: RawDaemon) -> None:
    for method in METHODS:
        error = await daemon.error(method, ["params", "as", "an", "array"])
        assert error["code"] == -32602, (method, error)  # known, but the params are bad


@live
async def test_live_traffic_fits_the_schema(daemon: RawDaemon) -> None:
    sid = "schema-1"
    transcript = REPO / "tests/data/transcripts/swe-agent/pydicom__pydicom-1458.traj"
    calls: list[tuple[str, dict[str, Any]]] = [
        ("session/open", {"sessionId": sid, "config": {"snipEnabled": False}}),
        ("session/list", {}),
        ("session/append", {"sessionId": sid, "messages": tool_turns("sc", 12, 1500, "Deploy")}),
        (
            "session/append",
            {
                "sessionId": sid,
                "messages": [user("more"), assistant("x", tool_use("sc-t", "Task"))],
            },
        ),
        ("function/start", {"sessionId": sid, "name": "Task", "input": {}, "toolUseId": "sc-t"}),
        ("session/get", {"sessionId": sid}),
        ("context/measure", {"sessionId": sid}),
        ("daemon/status", {}),
        ("session/import", {"path": str(transcript)}),
    ]
    results: dict[str, Any] = {}
    for method, params in calls:
        results[method] = await check_call(daemon, method, params)
    fid = results["function/start"]["functionId"]
    await check_call(
        daemon, "function/complete", {"sessionId": sid, "functionId": fid, "output": "o"}
    )
    await check_call(daemon, "session/toolResult", await pending_call(daemon))
    total = results["context/measure"]["total"]
    rendered = await check_call(
        daemon,
        "context/render",
        {
            "sessionId": sid,
            "cascade": True,
            "window": int(total / 0.93) + 500,
            "maxOutputTokens": 500,
        },
    )
    (collapse,) = [e for e in rendered["events"] if e["applied"]]
    await check_call(
        daemon, "context/uncollapse", {"sessionId": sid, "collapseId": collapse["recordIds"][0]}
    )
    await check_call(daemon, "context/compact", {"sessionId": sid, "instructions": "short"})
    await check_call(daemon, "context/snip", {"sessionId": sid, "targetTokens": 10})
    await check_call(daemon, "session/branch", {"sessionId": sid, "name": "b2"})
    await check_call(daemon, "session/checkout", {"sessionId": sid, "branch": "b2"})
    await check_call(
        daemon,
        "context/reportUsage",
        {"sessionId": sid, "model": "m", "usage": {"input_tokens": 100}},
    )
    seen = {m["method"] for m in daemon.received if "method" in m and "id" not in m}
    assert "context/compacted" in seen
    for message in daemon.received:
        method = message.get("method")
        if method in SCHEMA["notifications"]:
            params = message["params"]
            assert problems(params, SCHEMA["notifications"][method]["params"]) == [], method


async def check_call(daemon: RawDaemon, method: str, params: dict[str, Any]) -> Any:
    """Call `method`; its params and its result must both fit the schema."""
    spec = SCHEMA["methods"][method]
    assert problems(orjson.loads(orjson.dumps(params)), spec["params"]) == [], method
    result = await daemon.call(method, params)
    assert problems(result, spec["result"]) == [], (method, problems(result, spec["result"]))
    return result


async def pending_call(daemon: RawDaemon) -> dict[str, Any]:
    """Params of a `session/toolResult` that answers a call left open in a fresh session."""
    sid = "schema-2"
    await daemon.call("session/open", {"sessionId": sid})
    await daemon.call(
        "session/append",
        {"sessionId": sid, "messages": [user("go"), assistant("", tool_use("open-1"))]},
    )
    return {"sessionId": sid, "toolUseId": "open-1", "content": "done", "isError": False}
