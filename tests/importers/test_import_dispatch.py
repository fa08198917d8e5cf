"""Format detection, clear errors for bad input, and the test data's integrity."""

from __future__ import annotations

import hashlib
import re
import shutil
from pathlib import Path

import pytest
from compactd.context.errors import InvalidContent, InvalidPath
from compactd.context.importers import detect_format, load_transcript

TRANSCRIPTS = Path(__file__).resolve().parents[1] / "data" / "transcripts"
CLAUDE_NEW = TRANSCRIPTS / "claude-code" / "64da7265-8f07-4967-b79f-0ae374c13330.jsonl"
CODEX = next((TRANSCRIPTS / "codex").glob("rollout-*.jsonl"))

EXPECTED_FORMATS = {
    "claude-code/64da7265-8f07-4967-b79f-0ae374c13330.jsonl": "claude-code",
    "claude-code/fe5e1c67-53e7-4862-81ae-d0e013e3270b.jsonl": "claude-code",
    "claude-code/64da7265-8f07-4967-b79f-0ae374c13330/subagents/agent-a29edc699187686ae.jsonl": (
        "claude-code"
    ),
    CODEX.relative_to(TRANSCRIPTS).as_posix(): "codex",
    **{
        p.relative_to(TRANSCRIPTS).as_posix(): "codex"
        for p in (TRANSCRIPTS / "more/codex").glob("*")
    },
    "openhands/multi_swe_bench_output.jsonl": "openhands",
    "swe-agent/pydicom__pydicom-1458.traj": "swe-agent",
}


@pytest.mark.parametrize(("relative", "expected"), sorted(EXPECTED_FORMATS.items()))
def test_detects_each_format(relative, expected):
    assert detect_format(TRANSCRIPTS / relative) == expected


@pytest.mark.parametrize("relative", sorted(EXPECTED_FORMATS))
def test_detection_reads_content_not_names(tmp_path, relative):
    renamed = tmp_path / "transcript.data"
    shutil.copyfile(TRANSCRIPTS / relative, renamed)
    assert detect_format(renamed) == EXPECTED_FORMATS[relative]


def test_every_format_loads_from_a_renamed_copy(tmp_path):
    renamed = tmp_path / "session.log"
    shutil.copyfile(CODEX, renamed)
    [session] = load_transcript(renamed)
    assert session.source_format == "codex"


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (b"", "the file is empty"),
        (b"\n\n", "the file is empty"),
        (b'{"hello": "world"}\n', "not a transcript format compactd can import"),
        (b"[1, 2, 3]", "not a transcript format compactd can import"),
        (b"plain text, not json\n", "neither JSON, JSONL nor an aider chat history"),
        (b'{"trajectory": [', "not valid JSON or JSONL"),
    ],
)
def test_unknown_or_broken_input_is_a_clear_error(tmp_path, content, message):
    path = tmp_path / "input.jsonl"
    path.write_bytes(content)
    with pytest.raises(InvalidContent, match=re.escape(message)) as raised:
        load_transcript(path)
    assert raised.value.data["path"] == str(path)


def test_missing_file_is_a_clear_error(tmp_path):
    with pytest.raises(InvalidContent, match="cannot read the transcript"):
        load_transcript(tmp_path / "nope.jsonl")
    with pytest.raises(InvalidPath, match="not a regular file"):
        detect_format(tmp_path)  # a folder: only regular files are read


def test_a_corrupt_line_is_named(tmp_path):
    lines = CODEX.read_bytes().splitlines(keepends=True)
    lines[100] = lines[100][: len(lines[100]) // 2] + b"\n"
    broken = tmp_path / CODEX.name
    broken.write_bytes(b"".join(lines))
    with pytest.raises(InvalidContent, match=r"line 101 is not valid JSON: ") as raised:
        load_transcript(broken)
    assert raised.value.data["line"] == 101
    assert "truncated" not in str(raised.value)


def test_a_truncated_rollout_is_named_as_such(tmp_path):
    data = CODEX.read_bytes()
    cut = tmp_path / CODEX.name
    cut.write_bytes(data[: len(data) - 40])
    with pytest.raises(InvalidContent, match="the file looks truncated"):
        load_transcript(cut)


def test_test_data_matches_its_recorded_checksums():
    readme = (TRANSCRIPTS / "README.md").read_text()
    table = re.findall(r"^([0-9a-f]{64})  (\S+)$", readme, flags=re.MULTILINE)
    assert len(table) == 31
    files = {path.relative_to(TRANSCRIPTS).as_posix() for path in TRANSCRIPTS.rglob("*")}
    files = {name for name in files if (TRANSCRIPTS / name).is_file() and name != "README.md"}
    assert {name for _digest, name in table} == files
    for digest, name in table:
        assert hashlib.sha256((TRANSCRIPTS / name).read_bytes()).hexdigest() == digest, name


def test_an_import_stopped_half_way_writes_no_session(tmp_path):
    """All of a transcript's sessions are written or none: stopped while the third of three
    is being built, not even the first two are on disk."""
    from compactd.context.engine import Engine
    from compactd.context.errors import Stopped
    from compactd.context.stores import FileStore

    engine = Engine(FileStore(tmp_path))
    asked = 0
    ops = sum(
        len(s.ops)
        for s in load_transcript(TRANSCRIPTS / "openhands/multi_swe_bench_output.jsonl")[:2]
    )

    def stopped() -> bool:
        nonlocal asked
        asked += 1
        return asked > ops + 5  # the fifth op of the third session

    with pytest.raises(Stopped):
        engine.import_sessions(
            str(TRANSCRIPTS / "openhands/multi_swe_bench_output.jsonl"), stopped=stopped
        )
    assert engine.list() == [] and not list(tmp_path.glob("*.jsonl"))
    sessions, outcome = engine.import_sessions(
        str(TRANSCRIPTS / "openhands/multi_swe_bench_output.jsonl")
    )
    assert len(sessions) == 3 and outcome.existing == []
