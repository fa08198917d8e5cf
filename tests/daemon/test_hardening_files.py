"""Hardening, the files and sizes classes, through a real `compactd serve` run with small
limits (`COMPACTD_MAX_IMPORT_BYTES`, `COMPACTD_MAX_MESSAGE_BYTES`): import reads regular files
only and never past its limit, files a transcript refers to are read only inside its own
folder, NUL bytes and non-numeric counts are typed errors, an oversized message is refused, and
every refusal leaves the data dir's bytes as they were."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import threading
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio

from .convo import assistant, tool_use, user
from .test_hardening import assert_clean, snapshot
from .wire import RawDaemon, seeded_daemon

pytestmark = pytest.mark.asyncio(loop_scope="module")

SID = "files-main"
IMPORT_LIMIT = 2**20
MESSAGE_LIMIT = 64 * 2**10
SECRET = "TOP-SECRET-outside-the-transcript-folder"


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("hardening-files")


@pytest.fixture(scope="module")
def data_dir(root: Path) -> Path:
    return root / "data"


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def daemon(root: Path, data_dir: Path) -> AsyncIterator[RawDaemon]:
    limits = {
        "COMPACTD_MAX_IMPORT_BYTES": str(IMPORT_LIMIT),
        "COMPACTD_MAX_MESSAGE_BYTES": str(MESSAGE_LIMIT),
    }
    async with seeded_daemon(data_dir, {SID: [user("hello")]}, env=limits) as raw:
        yield raw
    for message in raw.received:
        assert_clean(message, data_dir)


async def refused(daemon: RawDaemon, data_dir: Path, method: str, params: Any) -> dict[str, Any]:
    """The error of a call that must be refused without changing a byte of the data dir."""
    before = snapshot(data_dir)
    error = await daemon.error(method, params)
    assert snapshot(data_dir) == before, f"{method} wrote something although refused"
    assert_clean({"error": error}, data_dir)
    return error


# ---- what import reads ---------------------------------------------------------------------


async def test_a_fifo_is_refused_at_once(daemon: RawDaemon, data_dir: Path, root: Path) -> None:
    fifo = root / "pipe.jsonl"
    os.mkfifo(fifo)
    for method in ("session/import", "session/replay"):
        error = await refused(daemon, data_dir, method, {"path": str(fifo)})
        assert error["code"] == 4015 and error["data"]["kind"] == "invalid_path", error


@pytest.mark.parametrize("device", ["/dev/zero", "/dev/null", "/dev/urandom"])
async def test_devices_are_refused(daemon: RawDaemon, data_dir: Path, device: str) -> None:
    error = await refused(daemon, data_dir, "session/import", {"path": device})
    assert error["code"] == 4015, error


async def test_a_folder_is_refused(daemon: RawDaemon, data_dir: Path, root: Path) -> None:
    error = await refused(daemon, data_dir, "session/import", {"path": str(root)})
    assert error["code"] == 4015, error


async def test_a_file_over_the_import_limit_is_refused_with_the_limit(
    daemon: RawDaemon, data_dir: Path, root: Path
) -> None:
    sparse = root / "sparse.jsonl"
    with open(sparse, "wb") as fh:
        fh.truncate(1 << 30)  # a 1 GB sparse file: refused from its size, never read
    error = await refused(daemon, data_dir, "session/import", {"path": str(sparse)})
    assert error["code"] == 4014
    assert error["data"] == {
        "kind": "too_large",
        "limit": "maxImportBytes",
        "maxBytes": IMPORT_LIMIT,
        "bytes": 1 << 30,
    }
    assert "maxImportBytes" in error["message"]


@pytest.mark.parametrize("method", ["session/import", "session/replay"])
async def test_a_nul_byte_in_a_path_is_a_typed_error(
    daemon: RawDaemon, data_dir: Path, method: str
) -> None:
    error = await refused(daemon, data_dir, method, {"path": "/tmp/a\x00b.jsonl"})
    assert error["code"] == 4015 and error["data"]["kind"] == "invalid_path"


async def test_a_missing_file_does_not_leak_more_than_the_path_given(
    daemon: RawDaemon, data_dir: Path, root: Path
) -> None:
    error = await refused(daemon, data_dir, "session/import", {"path": str(root / "nope.jsonl")})
    assert error["code"] == 4012


# ---- files a transcript refers to ------------------------------------------------------------


def claude_transcript(folder: Path, call_id: str, preview: str) -> Path:
    """A minimal Claude Code session whose one tool result was spilled to disk."""
    sid = "crafted"
    lines = [
        {"type": "user", "sessionId": sid, "uuid": "u1", "parentUuid": None,
         "timestamp": "2025-01-01T00:00:00Z", "message": {"role": "user", "content": "read it"}},
        {"type": "assistant", "sessionId": sid, "uuid": "u2", "parentUuid": "u1",
         "timestamp": "2025-01-01T00:00:01Z",
         "message": {"id": "m1", "role": "assistant", "model": "claude-sonnet-4-5",
                     "content": [{"type": "tool_use", "id": call_id, "name": "Read",
                                  "input": {"file_path": "x"}}]}},
        {"type": "user", "sessionId": sid, "uuid": "u3", "parentUuid": "u2",
         "timestamp": "2025-01-01T00:00:02Z",
         "message": {"role": "user", "content": [
             {"type": "tool_result", "tool_use_id": call_id, "content": preview}]}},
        {"type": "assistant", "sessionId": sid, "uuid": "u4", "parentUuid": "u3",
         "timestamp": "2025-01-01T00:00:03Z",
         "message": {"id": "m2", "role": "assistant", "model": "claude-sonnet-4-5",
                     "content": [{"type": "text", "text": "done"}]}},
    ]  # fmt: skip
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{sid}.jsonl"
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    (folder / sid / "tool-results").mkdir(parents=True, exist_ok=True)
    return path


PREVIEW = "<persisted-output>\nOutput too large (12KB). Preview:\nfirst lines\n</persisted-output>"


async def imported_text(daemon: RawDaemon, path: Path) -> tuple[str, list[str]]:
    """Import, then render: everything the model would be sent, and the warnings."""
    result = await daemon.call("session/import", {"path": str(path)})
    (sid,) = result["sessionIds"]
    rendered = await daemon.call("context/render", {"sessionId": sid})
    session = await daemon.call("session/get", {"sessionId": sid})
    return json.dumps([rendered, session]), result["warnings"]


@pytest.mark.parametrize(
    ("call_id", "preview"),
    [
        ("../../../secret", PREVIEW),
        ("toolu_a", PREVIEW.replace("Preview:", "saved to: ../../../secret.txt\nPreview:")),
        ("toolu_b", PREVIEW.replace("Preview:", "saved to: /abs/../../secret.txt\nPreview:")),
        ("..", PREVIEW),
    ],
)
async def test_a_crafted_spill_path_never_reads_outside_the_folder(
    daemon: RawDaemon, root: Path, call_id: str, preview: str
) -> None:
    case = root / f"escape-{abs(hash(call_id)) % 10**6}"
    (case / "secret.txt").parent.mkdir(parents=True, exist_ok=True)
    (case / "secret.txt").write_text(SECRET)
    (case / "a" / "b").mkdir(parents=True, exist_ok=True)
    (case / "a" / "secret.txt").write_text(SECRET)
    path = claude_transcript(case / "a" / "b" / "proj", call_id, preview)
    text, warnings = await imported_text(daemon, path)
    assert SECRET not in text
    assert "<persisted-output>" in text  # the preview stays
    assert any("kept the preview" in w for w in warnings), warnings


async def test_a_symlink_in_tool_results_is_not_followed(daemon: RawDaemon, root: Path) -> None:
    case = root / "symlinked"
    case.mkdir()
    (case / "secret.txt").write_text(SECRET)
    path = claude_transcript(case / "proj", "toolu_link", PREVIEW)
    (path.with_suffix("") / "tool-results" / "toolu_link.txt").symlink_to(case / "secret.txt")
    text, warnings = await imported_text(daemon, path)
    assert SECRET not in text
    assert any("kept the preview" in w for w in warnings), warnings


async def test_a_symlinked_subagent_transcript_is_not_read(daemon: RawDaemon, root: Path) -> None:
    case = root / "subagent-link"
    case.mkdir()
    other = case / "other.jsonl"
    other.write_text(json.dumps({"type": "user", "message": {"content": SECRET}}) + "\n")
    path = claude_transcript(case / "proj", "toolu_c", PREVIEW)
    agents = path.with_suffix("") / "subagents"
    agents.mkdir()
    (agents / "agent-x1.jsonl").symlink_to(other)
    text, warnings = await imported_text(daemon, path)
    assert SECRET not in text
    assert any("agent-x1.jsonl is not a regular file" in w for w in warnings), warnings


def with_an_agent_call(path: Path, agent_id: str) -> None:
    """The session's one call becomes an `Agent` call whose result names a sub-agent file."""
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    lines[1]["message"]["content"][0].update(name="Agent", input={"prompt": "look around"})
    lines[2]["toolUseResult"] = {"agentId": agent_id}
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))


def agent_file(text: str) -> str:
    line = {"type": "user", "sessionId": "agent", "uuid": "a1", "isSidechain": True,
            "message": {"role": "user", "content": text}}  # fmt: skip
    return json.dumps(line) + "\n"


async def test_a_symlinked_session_folder_is_not_even_listed(daemon: RawDaemon, root: Path) -> None:
    """The folder beside the session (its sub-agents, its spilled results) is a symlink to a
    folder elsewhere: nothing in it is read or listed, and the import says so."""
    case = root / "session-folder-link"
    elsewhere = case / "elsewhere"
    (elsewhere / "subagents").mkdir(parents=True)
    (elsewhere / "subagents" / "agent-x1.jsonl").write_text(agent_file(SECRET))
    (elsewhere / "tool-results").mkdir()
    (elsewhere / "tool-results" / "toolu_s.txt").write_text(SECRET)
    path = claude_transcript(case / "proj", "toolu_s", PREVIEW)
    with_an_agent_call(path, "x1")
    folder = path.with_suffix("")
    shutil.rmtree(folder)
    folder.symlink_to(elsewhere)
    text, warnings = await imported_text(daemon, path)
    assert SECRET not in text
    assert any("sub-agent folder was not read" in w for w in warnings), warnings


async def test_a_symlinked_subagents_folder_with_a_referenced_agent_is_a_warning(
    daemon: RawDaemon, root: Path
) -> None:
    """It failed the whole import ("Not a directory"); the docs promise a warning."""
    case = root / "subagents-link"
    (case / "elsewhere").mkdir(parents=True)
    (case / "elsewhere" / "agent-x2.jsonl").write_text(agent_file(SECRET))
    path = claude_transcript(case / "proj", "toolu_t", PREVIEW)
    with_an_agent_call(path, "x2")
    (path.with_suffix("") / "subagents").symlink_to(case / "elsewhere")
    text, warnings = await imported_text(daemon, path)
    assert SECRET not in text
    assert any("sub-agent folder was not read" in w for w in warnings), warnings
    assert any("agent-x2.jsonl" in w and "missing" in w for w in warnings), warnings


async def test_a_hard_linked_file_beside_the_session_is_not_read(
    daemon: RawDaemon, root: Path
) -> None:
    """A spilled result or a sub-agent file with a second name (a hard link to any file of
    the user's) is not read: the preview stays, the import says why."""
    case = root / "hard-links"
    case.mkdir()
    (case / "secret.txt").write_text(SECRET)
    (case / "agent.jsonl").write_text(agent_file(SECRET))
    path = claude_transcript(case / "proj", "toolu_h", PREVIEW)
    with_an_agent_call(path, "x3")
    folder = path.with_suffix("")
    os.link(case / "secret.txt", folder / "tool-results" / "toolu_h.txt")
    (folder / "subagents").mkdir()
    os.link(case / "agent.jsonl", folder / "subagents" / "agent-x3.jsonl")
    text, warnings = await imported_text(daemon, path)
    assert SECRET not in text
    assert any("agent-x3.jsonl not read" in w and "2 links" in w for w in warnings), warnings
    assert any("toolu_h.txt" in w and "kept the preview" in w for w in warnings), warnings


async def test_a_real_spill_next_to_the_session_is_still_read(
    daemon: RawDaemon, root: Path
) -> None:
    case = root / "honest"
    path = claude_transcript(case / "proj", "toolu_ok", PREVIEW)
    (path.with_suffix("") / "tool-results" / "toolu_ok.txt").write_text("the whole output")
    text, _warnings = await imported_text(daemon, path)
    assert "the whole output" in text


# ---- numbers and sizes ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("usage", "edits"),
    [
        ({"input_tokens": "many"}, None),
        ({"input_tokens": 10, "cache_read_input_tokens": [1]}, None),
        ({"input_tokens": -5}, None),
        ({"output_tokens": True}, None),
        ({"input_tokens": 1.5}, None),
        ({"input_tokens": 10}, [{"cleared_input_tokens": "x"}]),
    ],
)
async def test_non_numeric_usage_fields_are_typed_errors(
    daemon: RawDaemon, data_dir: Path, usage: Any, edits: Any
) -> None:
    params = {"sessionId": SID, "model": "claude-sonnet-4-5", "usage": usage}
    if edits is not None:
        params["appliedEdits"] = edits
    error = await refused(daemon, data_dir, "context/reportUsage", params)
    assert error["code"] == 4012 and error["data"]["kind"] == "invalid_content", error
    assert error["data"]["field"].startswith(("usage.", "appliedEdits[0]."))


async def test_a_message_over_the_limit_is_refused_and_one_under_is_kept(
    daemon: RawDaemon, data_dir: Path
) -> None:
    big = "y" * (MESSAGE_LIMIT + 10)
    for method, params in [
        ("session/append", {"sessionId": SID, "messages": [assistant(big)]}),
        ("session/open", {"sessionId": "files-new", "config": {"summaryModel": big}}),
    ]:
        error = await refused(daemon, data_dir, method, params)
        assert error["code"] == 4014, error
        assert error["data"]["limit"] == "maxMessageBytes"
        assert error["data"]["maxBytes"] == MESSAGE_LIMIT
    sid = "files-calls"
    await daemon.call("session/open", {"sessionId": sid})
    await daemon.call(
        "session/append",
        {"sessionId": sid, "messages": [user("go"), assistant("ok", tool_use("t1", "Bash"))]},
    )
    error = await refused(
        daemon,
        data_dir,
        "session/toolResult",
        {"sessionId": sid, "toolUseId": "t1", "content": big},
    )
    assert error["code"] == 4014
    await daemon.call(
        "session/toolResult", {"sessionId": sid, "toolUseId": "t1", "content": big[:1000]}
    )


async def test_a_session_config_cannot_raise_a_daemon_wide_limit(
    daemon: RawDaemon, data_dir: Path
) -> None:
    error = await refused(
        daemon, data_dir, "session/open", {"sessionId": SID, "config": {"maxMessageBytes": 10**9}}
    )
    assert error["code"] == 4013 and error["data"]["field"] == "maxMessageBytes"


# ---- the import runs off the loop --------------------------------------------------------------


async def test_an_import_runs_in_a_worker_thread(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """While an import is being read, the daemon's loop keeps running: the import (held on an
    event) only finishes because a coroutine on the loop released it."""
    from compactd.context.engine import ImportOutcome
    from compactd.daemon.main import build
    from compactd.service.app import Settings

    server, app = build(Settings(data_dir=tmp_path / "data", watch=False))
    release = threading.Event()
    seen: list[str] = []

    def slow_import(
        path: str, *, new: bool = False, stopped: Any = None
    ) -> tuple[list[Any], ImportOutcome]:
        seen.append(threading.current_thread().name)
        assert release.wait(30), "the loop was blocked while the import ran"
        return [], ImportOutcome([], [], [])

    monkeypatch.setattr(app.engine, "import_sessions", slow_import)
    handler = server.protocol.fm.features["session/import"]
    task = asyncio.ensure_future(handler({"path": "/whatever"}))  # pygls passes the server
    while not seen and not task.done():
        await asyncio.sleep(0.01)
    release.set()  # only possible if the loop runs while the import waits
    assert await task == {"sessionIds": [], "warnings": []}
    assert seen != [threading.current_thread().name]
