"""Crafted transcripts get typed errors naming the line, through a real daemon on both stores:
a Codex `type` that is an object or a list, a `call_id` / `tool_use_id` that is an object, an
OpenHands `choices` object, a SWE-agent `trajectory` that is a number — each answered −32603
(an internal error) before. Nothing is written for any of them. (The fuzz suite mutates real
transcripts the same way at random: `test_fuzz.py`.)"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio

from .test_hardening import assert_clean, snapshot
from .wire import RawDaemon, seeded_daemon

pytestmark = pytest.mark.asyncio(loop_scope="module")

INVALID_CONTENT, INVALID_PAIRING = 4012, 4011
CODEX_META = {"type": "session_meta", "payload": {"id": "crafted"}}
CC = {"sessionId": "crafted", "timestamp": "2026-01-01T00:00:00Z"}


def cc_line(kind: str, uuid: str, message: dict[str, Any]) -> dict[str, Any]:
    return {**CC, "type": kind, "uuid": uuid, "message": message}


CC_CALL = cc_line(
    "assistant",
    "u2",
    {
        "role": "assistant",
        "id": "m1",
        "content": [
            {"type": "tool_use", "id": "toolu_1", "name": "Bash", "input": {"command": "ls"}}
        ],
    },
)
CASES: dict[str, tuple[str, Any, int, int | None]] = {
    # name: (file name, JSONL records or a JSON document, code, line)
    "a Codex payload type that is an object": (
        "rollout-a.jsonl",
        [CODEX_META, {"type": "response_item", "payload": {"type": {"x": 1}, "role": "user"}}],
        INVALID_CONTENT,
        2,
    ),
    "a Codex type that is a list": (
        "rollout-b.jsonl",
        [CODEX_META, {"type": ["response_item"], "payload": {"type": "message"}}],
        INVALID_CONTENT,
        2,
    ),
    "a Codex call_id that is an object": (
        "rollout-c.jsonl",
        [
            CODEX_META,
            {
                "type": "response_item",
                "payload": {
                    "type": "function_call",
                    "call_id": "c1",
                    "name": "shell",
                    "arguments": "{}",
                },
            },
            {
                "type": "response_item",
                "payload": {
                    "type": "function_call_output",
                    "call_id": {"id": "c1"},
                    "output": "ok",
                },
            },
        ],
        INVALID_PAIRING,
        3,
    ),
    "a Claude Code tool_use_id that is an object": (
        "claude.jsonl",
        [
            cc_line("user", "u1", {"role": "user", "content": "list the files"}),
            CC_CALL,
            cc_line(
                "user",
                "u3",
                {
                    "role": "user",
                    "content": [
                        {"type": "tool_result", "tool_use_id": {"id": "toolu_1"}, "content": "a b"}
                    ],
                },
            ),
        ],
        INVALID_PAIRING,
        3,
    ),
    "an OpenHands choices object": (
        "output.jsonl",
        [
            {
                "instance_id": "i1",
                "history": [
                    {"action": "message", "source": "user", "args": {"content": "fix it"}},
                    {
                        "action": "run",
                        "tool_call_metadata": {
                            "tool_call_id": "t1",
                            "model_response": {"id": "r1", "choices": {"0": {}}},
                        },
                    },
                ],
            }
        ],
        INVALID_CONTENT,
        1,
    ),
    "a SWE-agent trajectory that is a number": (
        "task.traj",
        {"trajectory": 5, "info": {"exit_status": "submitted"}},
        INVALID_CONTENT,
        None,
    ),
}


def write(folder: Path, name: str, content: Any) -> Path:
    path = folder / name
    if isinstance(content, list):
        path.write_text("".join(json.dumps(record) + "\n" for record in content))
    else:
        path.write_text(json.dumps(content))
    return path


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def daemon(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[tuple[RawDaemon, Path]]:
    root = tmp_path_factory.mktemp("crafted")
    async with seeded_daemon(root / "data", {"kept": []}) as raw:
        yield raw, root


@pytest.mark.parametrize("case", sorted(CASES))
async def test_a_crafted_transcript_gets_a_typed_error_naming_its_line(
    daemon: tuple[RawDaemon, Path], case: str
) -> None:
    raw, root = daemon
    name, content, code, line = CASES[case]
    path = write(root, name, content)
    before = snapshot(root / "data")
    error = await raw.error("session/import", {"path": str(path)})
    assert error["code"] == code, error
    assert_clean({"error": error}, root / "data")
    if line is not None:
        assert error["data"]["line"] == line and f"line {line}" in error["message"], error
    assert snapshot(root / "data") == before
    replay = await raw.error("session/replay", {"path": str(path)})
    assert replay["code"] == code, replay
