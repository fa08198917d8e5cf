"""Codex importer on the real Codex CLI 0.58.0 rollout."""

from __future__ import annotations

from pathlib import Path

import attrs
import orjson
import pytest
from compactd.context.importers import load_transcript
from compactd.context.importers.plan import Messages, ModelCall, Note

ROLLOUT = next(
    (Path(__file__).resolve().parents[1] / "data" / "transcripts" / "codex").glob("rollout-*.jsonl")
)


def _items(raw, kind):
    return [
        line["payload"]
        for line in raw
        if line["type"] == "response_item" and line["payload"].get("type") == kind
    ]


def test_calls_and_outputs_pair_by_call_id(load, check, raw_lines):
    [session] = load(ROLLOUT)
    main = check(session)[None]
    raw = raw_lines(ROLLOUT)
    calls = _items(raw, "function_call")
    outputs = {item["call_id"]: item["output"] for item in _items(raw, "function_call_output")}
    assert len(main.tool_uses) == len(main.results) == 39
    assert [block["id"] for block in main.tool_uses] == [call["call_id"] for call in calls]
    for block, call in zip(main.tool_uses, calls, strict=True):
        assert block["name"] == call["name"]
        assert block["input"] == orjson.loads(call["arguments"])
    for result in main.results:
        assert result["content"] == outputs[result["tool_use_id"]]
    assert session.source_id == "019a93b9-f380-7600-98ff-940e6b99603c"
    assert session.model == "gpt-5.1-codex"


def test_token_counts_become_per_request_usage(load, raw_lines):
    [session] = load(ROLLOUT)
    calls = [op for op in session.ops if isinstance(op, ModelCall)]
    assert len(calls) == 39 and all(call.usage is not None for call in calls)
    final = next(
        line["payload"]["info"]["total_token_usage"]
        for line in reversed(raw_lines(ROLLOUT))
        if line["type"] == "event_msg" and line["payload"].get("info")
    )
    # Repeated counts are not counted twice: the per-request usages add up to Codex's totals.
    assert sum(call.usage["output_tokens"] for call in calls) == final["output_tokens"]
    assert (
        sum(call.usage["cache_read_input_tokens"] for call in calls) == final["cached_input_tokens"]
    )
    assert (
        sum(call.usage["input_tokens"] + call.usage["cache_read_input_tokens"] for call in calls)
        == final["input_tokens"]
    )
    assert all(call.usage["cache_creation_input_tokens"] == 0 for call in calls)
    assert calls[2].usage == {
        "input_tokens": 11862 - 10240,
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": 10240,
        "output_tokens": 109,
    }


def test_injected_context_is_meta_and_the_request_is_not(load, check):
    [session] = load(ROLLOUT)
    first, second = check(session)[None].messages[:2]
    assert first["meta"] is True
    assert first["content"][0]["text"].startswith("<environment_context>")
    assert "meta" not in second
    assert second["content"][0]["text"].startswith("finish up the users work")


def test_reasoning_is_a_note_not_a_thinking_block(load, check):
    [session] = load(ROLLOUT)
    notes = [op for op in session.ops if isinstance(op, Note) and op.kind == "codex_reasoning"]
    assert len(notes) == 38
    assert notes[0].data == {"summary": ["**Planning repository inspection**"], "encrypted": True}
    for message in check(session)[None].messages:
        if message["role"] == "assistant":
            assert all(block["type"] != "thinking" for block in message["content"])
    # The note sits between the request and the message it explains.
    index = session.ops.index(notes[0])
    assert isinstance(session.ops[index - 1], ModelCall)
    assert isinstance(session.ops[index + 1], Messages)


def test_arguments_that_are_not_json_are_kept_raw(tmp_path, raw_lines, check):
    records = raw_lines(ROLLOUT)
    call = _items(records, "function_call")[0]
    call["arguments"] = "apply_patch <<'PATCH' (not json)"
    cut = tmp_path / ROLLOUT.name
    cut.write_bytes(b"".join(orjson.dumps(record) + b"\n" for record in records))
    [session] = load_transcript(cut)
    first = check(session)[None].tool_uses[0]
    assert first["input"] == {"raw": "apply_patch <<'PATCH' (not json)"}


def test_the_checker_itself_rejects_a_result_before_its_call(load, check):
    [session] = load(ROLLOUT)
    ops = list(session.ops)
    first_assistant = next(
        i
        for i, op in enumerate(ops)
        if isinstance(op, Messages) and op.messages[0]["role"] == "assistant"
    )
    ops[first_assistant], ops[first_assistant + 1] = ops[first_assistant + 1], ops[first_assistant]
    with pytest.raises(AssertionError):
        check(attrs.evolve(session, ops=ops))
