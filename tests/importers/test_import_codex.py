"""Codex importer on the real Codex CLI 0.58.0 rollout."""

from __future__ import annotations

from pathlib import Path

import attrs
import orjson
import pytest
from compactd.context.engine import Engine, RenderParams
from compactd.context.importers import load_transcript
from compactd.context.importers.apply import OpApplier, import_session
from compactd.context.importers.codex import ENCRYPTED_SUMMARY
from compactd.context.importers.plan import Compaction, Messages, ModelCall, Note
from compactd.context.projection import SUMMARY
from compactd.context.stores import FileStore

from tests.support.invariants import check_anthropic_pairing

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


# The two newer rollouts of tests/data/transcripts/more/codex (codex-tui 0.140.0 and 0.142.2),
# with what reading the raw files found: user requests (= its `event_msg/user_message` count),
# tool calls (function, custom and tool-search calls, each with its output), hosted web
# searches, model requests (changed token counts) and the user messages each `compacted`
# record carried over.
MORE = Path(__file__).resolve().parents[1] / "data" / "transcripts" / "more" / "codex"
NEWER = {
    "rollout-2026-06-18T02-33-46-019ed893-d2a6-7c30-a8b8-5a8a49cfa23e.jsonl": {
        "requests": 17,
        "calls": 443,
        "web_searches": 4,
        "model_calls": 278,
        "carried_over": [10],
    },
    "rollout-2026-06-26T12-20-52-019f03e0-321f-7eb2-83cc-b54ecd71be23.jsonl": {
        "requests": 10,
        "calls": 177,
        "web_searches": 0,
        "model_calls": 180,
        "carried_over": [7, 10],
    },
}
CALLS = ("function_call", "custom_tool_call", "tool_search_call")
OUTPUTS = ("function_call_output", "custom_tool_call_output", "tool_search_output")


@pytest.mark.parametrize("name", sorted(NEWER), ids=lambda name: name[8:18])
def test_a_newer_rollout_imports_every_item_it_holds(name, load, check, raw_lines):
    path = MORE / name
    expected = NEWER[name]
    [session] = load(path)
    main = check(session)[None]  # pairing intact, results after their calls
    raw = raw_lines(path)
    items = [line["payload"] for line in raw if line["type"] == "response_item"]
    calls = [item for item in items if item["type"] in CALLS]
    outputs = {item["call_id"]: item for item in items if item["type"] in OUTPUTS}
    assert len(main.tool_uses) == len(main.results) == len(calls) == expected["calls"]
    assert [block["id"] for block in main.tool_uses] == [call["call_id"] for call in calls]
    for block, call in zip(main.tool_uses, calls, strict=True):
        assert block["name"] == (call.get("namespace") or "") + call.get("name", "tool_search")
    for result in main.results:
        output = outputs[result["tool_use_id"]]
        if output["type"] == "tool_search_output":
            assert orjson.loads(result["content"]) == output["tools"]
        else:
            assert result["content"] == output["output"]
    searches = [
        block["text"]
        for message in main.messages
        if message["role"] == "assistant"
        for block in message["content"]
        if block["type"] == "text" and block["text"].startswith("[web search: ")
    ]
    assert len(searches) == expected["web_searches"]
    hosted = [item["action"] for item in items if item["type"] == "web_search_call"]
    for text, action in zip(searches, hosted, strict=True):
        shown = action.get("queries") or [action.get("url")]  # a search, or a page it opened
        assert shown and all(query in text for query in shown)
    requests = [m for m in main.messages if m["role"] == "user" and not m.get("meta")]
    texts = [b for m in requests for b in m["content"] if b.get("type") == "text"]
    typed = [line for line in raw if line["payload"].get("type") == "user_message"]
    assert len(texts) == len(typed) == expected["requests"]
    # Nothing the model saw was dropped: only event_msg duplicates and UI events are skipped.
    assert not [w for w in session.warnings if "response_item" in w or "dropped" in w]


@pytest.mark.parametrize("name", sorted(NEWER), ids=lambda name: name[8:18])
def test_a_newer_rollouts_usage_and_compactions(name, load, raw_lines):
    """Since 0.140 a response's token count is written after its calls' outputs: it is that
    response's, not the next one's — across a compaction the two differ by 190K tokens."""
    path = MORE / name
    [session] = load(path)
    raw = raw_lines(path)
    calls = [op for op in session.ops if isinstance(op, ModelCall)]
    assert len(calls) == NEWER[name]["model_calls"]
    assert all(call.usage is not None for call in calls)
    counts = [
        line["payload"]["info"]
        for line in raw
        if line["payload"].get("type") == "token_count" and line["payload"].get("info")
    ]
    final = counts[-1]["total_token_usage"]
    assert sum(call.usage["output_tokens"] for call in calls) == final["output_tokens"]
    assert (
        sum(call.usage["input_tokens"] + call.usage["cache_read_input_tokens"] for call in calls)
        == final["input_tokens"]
    )
    compactions = [op for op in session.ops if isinstance(op, Compaction)]
    assert [len(op.user_requests) for op in compactions] == NEWER[name]["carried_over"]
    assert all(op.summary == ENCRYPTED_SUMMARY and op.source == "codex" for op in compactions)
    recorded = [line for line in raw if line["type"] == "compacted"]
    for op, record in zip(compactions, recorded, strict=True):
        carried = [
            item["content"][0]["text"]
            for item in record["payload"]["replacement_history"]
            if item.get("role") == "user" and not item["content"][0]["text"].startswith(("#", "<"))
        ]
        assert op.user_requests == carried
        # the request after the compaction is charged what Codex counted after it
        index = raw.index(record)
        after = next(
            line["payload"]["info"]["last_token_usage"]
            for line in raw[index:]
            if line["payload"].get("type") == "token_count"
            and line["payload"]["info"]["last_token_usage"]["input_tokens"]
        )
        first = next(c for c in session.ops[session.ops.index(op) :] if isinstance(c, ModelCall))
        assert (
            first.usage["input_tokens"] + first.usage["cache_read_input_tokens"]
            == (after["input_tokens"])
        )


@pytest.mark.parametrize("name", sorted(NEWER), ids=lambda name: name[8:18])
def test_a_newer_rollouts_compactions_are_honoured_on_import(name, load, tmp_path):
    """Each `compacted` record is a summary record of the imported session, so it renders as
    Codex last sent it (its own summary is encrypted: the marker says so), not everything the
    rollout holds."""
    [imported] = load(MORE / name)
    engine = Engine(FileStore(tmp_path))
    session = import_session(engine.library, imported)
    engine.sessions[session.id] = session
    records = [r for r in session.graph.records if r.kind == SUMMARY]
    assert [len(r.data["userRequests"]) for r in records] == NEWER[name]["carried_over"]
    assert all(r.data["imported"] == "codex" for r in records)
    rendered = engine.render_session(session, RenderParams())
    check_anthropic_pairing(rendered.request)
    assert ENCRYPTED_SUMMARY in str(rendered.request["messages"])
    plain = engine.library.create()
    applier = OpApplier(plain, compactions=False)
    for op in imported.ops:
        applier.apply(op)
    engine.sessions[plain.id] = plain
    assert rendered.total < engine.render_session(plain, RenderParams()).total / 2
