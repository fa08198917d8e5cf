"""Imports cannot amplify, through a real daemon on both stores: a spilled file a crafted
transcript names from many results is stored once, and an import that would write more than
its bound (a multiple of what it read, and an absolute cap) is refused with 4014 and writes
nothing."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson
import pytest

from tests.support.logs import log_bytes

from .test_hardening import snapshot
from .wire import seeded_daemon

pytestmark = pytest.mark.asyncio(loop_scope="module")

TOO_LARGE = 4014
CODEX = next((Path(__file__).resolve().parents[1] / "data/transcripts/codex").glob("*.jsonl"))


def line(kind: str, message: dict[str, Any], n: int) -> bytes:
    record = {
        "type": kind,
        "sessionId": "amplified",
        "uuid": f"u{n}",
        "timestamp": f"2026-01-01T00:{n // 60 % 60:02d}:{n % 60:02d}Z",
        "message": message,
    }
    return orjson.dumps(record) + b"\n"


def spilling_transcript(
    folder: Path, results: int, spilled_bytes: int, spilled: bytes = b"a line of output\n"
) -> Path:
    """A Claude Code session whose `results` tool results all name one spilled file."""
    transcript = folder / "amplified.jsonl"
    spill = folder / "amplified" / "tool-results"
    spill.mkdir(parents=True)
    (spill / "big.txt").write_bytes(spilled * (spilled_bytes // len(spilled)))
    preview = (
        "<persisted-output>\nOutput too large (8MB). Full output saved to: "
        "/home/u/.claude/projects/p/amplified/tool-results/big.txt\n\nPreview (first 2KB):\n"
        "a line of the spilled output\n...\n</persisted-output>"
    )
    lines = [line("user", {"role": "user", "content": "read it"}, 0)]
    for i in range(results):
        call = {"type": "tool_use", "id": f"toolu_{i}", "name": "Bash", "input": {"c": "cat"}}
        answer = {"type": "tool_result", "tool_use_id": f"toolu_{i}", "content": preview}
        lines.append(line("assistant", {"role": "assistant", "id": f"m{i}", "content": [call]}, i))
        lines.append(line("user", {"role": "user", "content": [answer]}, i))
    lines.append(line("assistant", {"role": "assistant", "id": "end", "content": "done"}, 0))
    transcript.write_bytes(b"".join(lines))
    return transcript


async def test_a_spilled_file_named_by_many_results_is_stored_once(tmp_path: Path) -> None:
    """40 results naming one 2 MB file wrote 80 MB; now the file's text is stored for the
    first and the others keep their previews (what the model was shown), said in warnings."""
    transcript = spilling_transcript(tmp_path, 40, 2 * 2**20)
    read = transcript.stat().st_size + (tmp_path / "amplified/tool-results/big.txt").stat().st_size
    async with seeded_daemon(tmp_path / "data", {}) as raw:
        imported = await raw.call("session/import", {"path": str(transcript)})
        [sid] = imported["sessionIds"]
        assert sum("stored once" in w for w in imported["warnings"]) == 39
        written = len(log_bytes(tmp_path / "data", sid))
        assert written < 1.5 * read, (written, read)
        got = await raw.call("session/get", {"sessionId": sid})
        results = [c["result"] for n in got["nodes"] for c in n.get("calls", [])]
        assert len(results) == 40
        assert sum(1 for r in results if len(str(r)) > 2**20) == 1


async def test_an_import_that_would_write_more_than_4x_what_it_read_writes_nothing(
    tmp_path: Path,
) -> None:
    """A spilled file of control characters: each byte read is six in the log (`\\u0001`).
    Refused with 4014 naming maxImportAmplification; nothing is written."""
    transcript = spilling_transcript(tmp_path, 1, 2**20, spilled=b"\x01")
    data_dir = tmp_path / "data"
    async with seeded_daemon(data_dir, {"kept": []}) as raw:
        before = snapshot(data_dir)
        error = await raw.error("session/import", {"path": str(transcript)})
        assert error["code"] == TOO_LARGE, error
        assert error["data"]["limit"] == "maxImportAmplification", error
        assert snapshot(data_dir) == before
        assert [s["sessionId"] for s in (await raw.call("session/list"))["sessions"]] == ["kept"]


async def test_an_import_over_the_absolute_cap_writes_nothing(tmp_path: Path) -> None:
    """A real transcript's log is about 120 KB: under a cap of 100 KB it is refused whole;
    under the default cap it is imported."""
    data_dir = tmp_path / "data"
    async with seeded_daemon(data_dir, {}, env={"COMPACTD_MAX_IMPORT_LOG_BYTES": "100000"}) as raw:
        before = snapshot(data_dir)
        error = await raw.error("session/import", {"path": str(CODEX)})
        assert error["code"] == TOO_LARGE, error
        assert error["data"]["limit"] == "maxImportLogBytes", error
        assert snapshot(data_dir) == before
        assert (await raw.call("session/list"))["sessions"] == []
    async with seeded_daemon(data_dir, {}) as raw:
        assert (await raw.call("session/import", {"path": str(CODEX)}))["sessionIds"]


def _jsonl(*records: dict[str, Any]) -> bytes:
    return b"".join(orjson.dumps(r) + b"\n" for r in records)


HI = {"role": "user", "content": "hi"}
# the smallest valid file of every format the daemon imports: one message each, 31–160 bytes;
# a session's header alone is ~250 bytes, so each writes several times what it read
SMALLEST: dict[str, tuple[str, bytes]] = {
    "claude-code": (
        "s.jsonl",
        _jsonl({"type": "user", "sessionId": "s", "uuid": "u1", "message": HI}),
    ),
    "claude-code, older format": (
        "s.jsonl",
        _jsonl(
            {
                "type": "user",
                "sessionId": "s",
                "uuid": "u1",
                "parentUuid": None,
                "isSidechain": False,
                "message": HI,
            }
        ),
    ),
    "codex": (
        "rollout.jsonl",
        _jsonl(
            {"type": "session_meta", "payload": {"id": "s"}},
            {
                "type": "response_item",
                "payload": {
                    "type": "message",
                    "role": "user",
                    "content": [{"type": "input_text", "text": "hi"}],
                },
            },
        ),
    ),
    "openhands events": (
        "o.json",
        orjson.dumps([{"action": "message", "args": {"content": "hi"}, "source": "user"}]),
    ),
    "openhands output": (
        "o.jsonl",
        _jsonl(
            {
                "instance_id": "i",
                "history": [{"action": "message", "args": {"content": "hi"}, "source": "user"}],
            }
        ),
    ),
    "swe-agent": (
        "t.traj",
        orjson.dumps({"trajectory": [{"action": "ls", "observation": "a", "thought": "t"}]}),
    ),
    "mini-swe-agent": (
        "t.traj.json",
        orjson.dumps({"trajectory_format": "mini-swe-agent-1", "messages": [HI], "info": {}}),
    ),
    "gemini-cli": (
        "session.json",
        orjson.dumps({"sessionId": "s", "messages": [{"type": "user", "content": "hi"}]}),
    ),
    "cline": (
        "api_conversation_history.json",
        orjson.dumps([{"role": "user", "content": [{"type": "text", "text": "hi"}], "ts": 1}]),
    ),
    "aider": (
        ".aider.chat.history.md",
        b"# aider chat started at 2026-01-01 00:00:00\n\n#### hi\n",
    ),
    "messages array": ("m.json", orjson.dumps([HI])),
    "messages object": ("m.json", orjson.dumps({"messages": [HI]})),
    "chat jsonl": ("m.jsonl", _jsonl(HI)),
}


async def test_the_smallest_valid_file_of_every_format_imports(tmp_path: Path) -> None:
    """A small file is never refused for being small: most write more than 4 times what they
    read (a session's header alone outweighs them), under the floor every import may write,
    and the message is in the session."""
    ratios = {}
    async with seeded_daemon(tmp_path / "data", {}) as raw:
        for name, (filename, content) in SMALLEST.items():
            folder = tmp_path / name.replace(" ", "_").replace(",", "")
            folder.mkdir()
            (folder / filename).write_bytes(content)
            imported = await raw.call("session/import", {"path": str(folder / filename)})
            [sid] = imported["sessionIds"]
            ratios[name] = len(log_bytes(tmp_path / "data", sid)) / len(content)
            got = await raw.call("session/get", {"sessionId": sid})
            texts = orjson.dumps(got["nodes"]).decode()
            assert '"hi"' in texts or '"ls"' in texts, (name, texts)
    assert sum(r > 4 for r in ratios.values()) > len(SMALLEST) / 2, ratios
