"""A refused request writes nothing — for every method of `protocol.types.METHODS`.

Each method's refusals (bad params, unknown ids, broken pairing, paths it may not read, …) go
through one real daemon, and the bytes of every file under the data dir (logs and lock files)
are compared before and after each. A method added to the table without refusals here fails
`test_every_method_has_refusals`."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
from compactd.protocol.types import METHODS

from .convo import assistant, tool_results, tool_use, user
from .test_hardening import assert_clean, snapshot
from .wire import RawDaemon, seeded_daemon

pytestmark = pytest.mark.asyncio(loop_scope="module")

SID = "refuse"
PENDING = "refuse-pending"  # its head waits for the result of call `p1`
TRANSCRIPT = next((Path(__file__).parents[1] / "data/transcripts/codex").glob("rollout-*.jsonl"))
M = [user("x")]

REFUSALS: dict[str, list[Any]] = {
    "session/open": [
        {"sessionId": "a\n"},
        {"sessionId": "../x"},
        {"sessionId": SID, "config": {"cascadeThreshold": "high"}},
        {"sessionId": SID, "config": {"maxMessageBytes": 1}},
        {"sessionId": "refuse-new", "config": {"summaryProvider": "nobody"}},
        {"config": 5},
        [1],
    ],
    "session/list": [[1], "x"],
    "session/get": [
        {"sessionId": "refuse-none"},
        {"sessionId": SID, "nodeId": "no-such-node"},
        {"sessionId": SID, "branch": "no-such-branch"},
        {},
    ],
    "session/append": [
        {"sessionId": SID, "messages": [{"role": "robot", "content": "x"}]},
        {"sessionId": SID, "messages": M, "expectedHead": "not-the-head"},
        {"sessionId": SID, "messages": M, "branch": "no-such-branch"},
        {"sessionId": SID, "messages": M, "functionId": "no-such-function"},
        {"sessionId": SID, "messages": [tool_results(("never-called", "x"))]},
        {"sessionId": SID, "nodes": [{"kind": "teapot"}]},
        {"sessionId": SID, "messages": M, "format": "klingon"},
        {"sessionId": PENDING, "messages": M},
        {"sessionId": "refuse-none", "messages": M},
        {"sessionId": SID},
    ],
    "session/toolResult": [
        {"sessionId": SID, "toolUseId": "never-called", "content": "x"},
        {"sessionId": PENDING, "toolUseId": "p1", "content": 5},
        {"sessionId": PENDING, "toolUseId": "p1", "content": [1]},
        {"sessionId": PENDING, "toolUseId": "p1", "content": "x", "isError": "yes"},
    ],
    "session/branch": [
        {"sessionId": SID, "name": ""},
        {"sessionId": SID, "name": "main"},
        {"sessionId": SID, "name": "b\n"},
        {"sessionId": SID, "name": "fork", "fromNode": "no-such-node"},
    ],
    "session/checkout": [
        {"sessionId": SID, "branch": ""},
        {"sessionId": SID, "branch": "no-such-branch"},
        {"sessionId": SID, "branch": None},
    ],
    "session/import": [
        {"path": "/no/such/file.jsonl"},
        {"path": "/dev/zero"},
        {"path": "a\x00b"},
        {"path": str(Path(__file__))},  # not a transcript
        {"path": 7},
    ],
    "function/start": [
        {"sessionId": SID, "name": "f", "parent": "no-such-node"},
        {"sessionId": SID, "name": "f", "toolUseId": "never-called"},
        {"sessionId": SID, "name": "f", "functionId": "no-such-function"},
        {"sessionId": SID, "name": "f", "expose": "everything"},
        {"sessionId": SID},
    ],
    "function/complete": [
        {"sessionId": SID, "functionId": "no-such-function"},
        {"sessionId": SID, "functionId": "x", "status": "maybe"},
    ],
    "context/render": [
        {"sessionId": "refuse-none"},
        {"sessionId": SID, "branch": "no-such-branch"},
        {"sessionId": SID, "format": "klingon"},
        {"sessionId": SID, "window": "big"},
        {"sessionId": PENDING},
        {"sessionId": SID, "cascade": True, "window": 10},
    ],
    "context/measure": [
        {"sessionId": "refuse-none"},
        {"sessionId": SID, "branch": "no-such-branch"},
        {"sessionId": SID, "window": -1.5},
    ],
    "context/compact": [
        {"sessionId": "refuse-none"},
        {"sessionId": SID, "branch": "no-such-branch"},
        {"sessionId": SID, "instructions": 5},
    ],
    "context/snip": [
        {"sessionId": "refuse-none"},
        {"sessionId": SID, "targetTokens": "few"},
        {"sessionId": SID, "branch": "no-such-branch"},
    ],
    "context/uncollapse": [
        {"sessionId": "refuse-none", "collapseId": "c"},
        {"sessionId": SID, "collapseId": 5},
        {"sessionId": SID},
    ],
    "context/recall": [
        {"sessionId": "refuse-none", "handle": "recall:n1.00000000"},
        {"sessionId": SID, "handle": "recall:n1.00000000"},
        {"sessionId": SID, "handle": "no-such-tool-use"},
        {"sessionId": SID, "handle": 5},
        {"sessionId": SID},
        {"sessionId": SID, "handle": "recall:n1.00000000", "startLine": "one"},
        {"sessionId": SID, "handle": "recall:n1.00000000", "branch": "no-such-branch"},
    ],
    "context/reportUsage": [
        {"sessionId": SID, "model": "m", "usage": {"input_tokens": "many"}},
        {"sessionId": SID, "model": "m", "usage": {"output_tokens": -1}},
        {"sessionId": SID, "model": "m", "error": {"status": "x", "message": "y"}},
        {"sessionId": SID, "model": "m", "appliedEdits": [{"cleared_input_tokens": []}]},
        {"sessionId": "refuse-none", "model": "m", "usage": {"input_tokens": 1}},
        {"sessionId": SID},
    ],
    "daemon/status": [[1], 5],
    "session/replay": [
        {"path": "/no/such/file.jsonl"},
        {"path": "/dev/zero"},
        {"path": str(TRANSCRIPT), "index": 99},
        {"path": str(TRANSCRIPT), "ttl": "forever"},
    ],
}


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("refusals")


@pytest.fixture(scope="module")
def data_dir(root: Path) -> Path:
    return root / "data"


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def daemon(root: Path, data_dir: Path) -> AsyncIterator[RawDaemon]:
    sessions = {
        SID: [user("hello"), assistant("hi"), user("more")],
        PENDING: [user("go"), assistant("ok", tool_use("p1"))],
    }
    async with seeded_daemon(data_dir, sessions, "--summary-provider", "digest") as raw:
        yield raw


@pytest.mark.filterwarnings("ignore::pytest.PytestWarning")
def test_every_method_has_refusals() -> None:
    assert set(REFUSALS) == set(METHODS)


CASES = [(method, params) for method, cases in REFUSALS.items() for params in cases]


@pytest.mark.parametrize(
    ("method", "params"), CASES, ids=[f"{m}-{i}" for i, (m, _) in enumerate(CASES)]
)
async def test_a_refused_request_writes_nothing(
    daemon: RawDaemon, data_dir: Path, method: str, params: Any
) -> None:
    before = snapshot(data_dir)  # every file's bytes and name (and the database's events)
    error = await daemon.error(method, params)
    assert error["code"] != -32603, error  # refused on purpose, with a typed error
    assert_clean({"error": error}, data_dir)
    assert snapshot(data_dir) == before, f"{method} {params!r:.80} wrote although refused"
