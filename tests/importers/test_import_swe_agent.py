"""SWE-agent importer on the real pydicom trajectory (12 steps)."""

from __future__ import annotations

from pathlib import Path

import orjson
from compactd.context.importers import load_transcript
from compactd.context.importers.plan import ModelCall
from compactd.context.importers.swe_agent import PROMPT_NOT_RECORDED

TRAJ = (
    Path(__file__).resolve().parents[1]
    / "data"
    / "transcripts"
    / "swe-agent"
    / "pydicom__pydicom-1458.traj"
)


def _document() -> dict:
    return orjson.loads(TRAJ.read_bytes())


def test_each_step_is_a_command_call_with_its_observation(load, check):
    [session] = load(TRAJ)
    main = check(session)[None]
    document = _document()
    steps = document["trajectory"]
    assert len(steps) == 12
    assert [block["input"] for block in main.tool_uses] == [
        {"command": step["action"]} for step in steps
    ]
    assert {block["name"] for block in main.tool_uses} == {"swe_agent_command"}
    assert [block["id"] for block in main.tool_uses] == [f"swe_step_{n}" for n in range(1, 13)]
    assert len(main.results) == 12
    # Results are what the model saw (the history's user messages, with SWE-agent's footer) …
    observations = [
        entry["content"] for entry in document["history"][3:] if entry["role"] == "user"
    ]
    assert [block["content"] for block in main.results[:11]] == observations
    assert observations[0].endswith("bash-$")
    # … and the final submit's output, which only the trajectory records.
    assert main.results[11]["content"] == steps[11]["observation"]
    thoughts = [
        message["content"][0]["text"] for message in main.messages if message["role"] == "assistant"
    ]
    assert thoughts == [step["thought"] for step in steps]
    assert len([op for op in session.ops if isinstance(op, ModelCall)]) == 12


def test_prompt_messages(load, check):
    [session] = load(TRAJ)
    main = check(session)[None]
    assert session.system.startswith("SETTING: You are an autonomous programmer")
    demo, issue = main.messages[:2]
    assert demo["meta"] is True and demo["content"].startswith("Here is a demonstration")
    assert "meta" not in issue and "Pixel Representation" in issue["content"]
    assert session.source_id == "pydicom__pydicom-1458"


def test_ids_are_deterministic(tmp_path, check):
    copy = tmp_path / TRAJ.name
    copy.write_bytes(TRAJ.read_bytes())
    first = load_transcript(copy)[0]
    again = load_transcript(copy)[0]
    assert first.ops == again.ops


def test_without_history_the_steps_are_used(tmp_path, check):
    document = _document()
    del document["history"]
    cut = tmp_path / TRAJ.name
    cut.write_bytes(orjson.dumps(document))
    [session] = load_transcript(cut)
    main = check(session)[None]
    assert len(main.tool_uses) == len(main.results) == 12
    assert main.results[0]["content"] == document["trajectory"][0]["observation"]
    assert session.system is None
    assert main.messages[0] == {"role": "user", "content": PROMPT_NOT_RECORDED, "meta": True}
    assert any("no history" in warning for warning in session.warnings)
