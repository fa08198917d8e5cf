"""OpenHands importer on the real multi-SWE-bench output (3 runs)."""

from __future__ import annotations

from pathlib import Path

import orjson
from compactd.context.importers import detect_format, load_transcript
from compactd.context.importers.plan import ModelCall, Note

OUTPUT = (
    Path(__file__).resolve().parents[1]
    / "data"
    / "transcripts"
    / "openhands"
    / "multi_swe_bench_output.jsonl"
)


def _tool_actions(history):
    return [event for event in history if "action" in event and event.get("tool_call_metadata")]


def _tool_observations(history):
    return [
        event for event in history if "observation" in event and event.get("tool_call_metadata")
    ]


def test_one_session_per_run(load, check, raw_lines):
    sessions = load(OUTPUT)
    runs = raw_lines(OUTPUT)
    assert len(sessions) == 3
    for session, run in zip(sessions, runs, strict=True):
        main = check(session)[None]
        history = run["history"]
        assert session.source_id == run["instance_id"] == session.title
        assert session.system == history[0]["args"]["content"]
        assert session.system.startswith("You are OpenHands agent")
        assert session.model == "openai/openrouter-llama-4-maverick"
        actions = _tool_actions(history)
        observations = _tool_observations(history)
        assert [block["id"] for block in main.tool_uses] == [
            event["tool_call_metadata"]["tool_call_id"] for event in actions
        ]
        assert [block["tool_use_id"] for block in main.results] == [
            event["tool_call_metadata"]["tool_call_id"] for event in observations
        ]
        for block, event in zip(main.results, observations, strict=True):
            assert block["content"] == event["content"]
        # The first user message is the task; recall events are skipped and said so.
        assert main.messages[0] == {"role": "user", "content": history[1]["args"]["content"]}
        assert any("recall" in warning for warning in session.warnings)


def test_tool_calls_come_from_the_model_response(load, check, raw_lines):
    [session, *_] = load(OUTPUT)
    main = check(session)[None]
    history = raw_lines(OUTPUT)[0]["history"]
    first = _tool_actions(history)[0]
    response = first["tool_call_metadata"]["model_response"]
    assistant = main.messages[1]
    assert assistant["content"][0] == {
        "type": "text",
        "text": response["choices"][0]["message"]["content"],
    }
    assert assistant["content"][1] == {
        "type": "tool_use",
        "id": "toolu_01",
        "name": "execute_bash",
        "input": {"command": "ls -l /workspace/ponylang__ponyc__0.1"},
    }
    calls = [op for op in session.ops if isinstance(op, ModelCall)]
    assert calls[0].model == "meta-llama/llama-4-maverick"
    assert calls[0].usage == {
        "input_tokens": 5920,
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": 0,
        "output_tokens": 128,
    }


def test_finish_call_has_no_invented_result(load, check):
    first, second, third = load(OUTPUT)
    for session in (first, second):
        main = check(session)[None]
        assert main.tool_uses[-1]["name"] == "finish"
        assert main.messages[-1]["role"] == "assistant"
        assert main.tool_uses[-1]["id"] not in {block["tool_use_id"] for block in main.results}
    notes = [op for op in third.ops if isinstance(op, Note) and op.kind == "openhands_error"]
    assert "maximum iteration" in notes[0].data["error"]


def test_error_observation_without_a_call_is_meta_feedback(load, check):
    _, second, _ = load(OUTPUT)
    feedback = [
        message
        for message in check(second)[None].messages
        if message.get("meta") and message["role"] == "user"
    ]
    assert len(feedback) == 1
    assert feedback[0]["content"][-1]["text"].startswith("Parameter 'command' is expected")


def test_an_exported_event_list_loads_too(tmp_path, raw_lines, check):
    history = raw_lines(OUTPUT)[0]["history"]
    exported = tmp_path / "trajectory.json"
    exported.write_bytes(orjson.dumps(history, option=orjson.OPT_INDENT_2))
    assert detect_format(exported) == "openhands"
    [session] = load_transcript(exported)
    assert len(check(session)[None].tool_uses) == len(_tool_actions(history))
