"""Claude Code importer on the two real sessions (2.1.63 and 1.0.98) and cuts of them."""

from __future__ import annotations

import shutil
from datetime import datetime
from pathlib import Path

import orjson
import pytest
from compactd.context.errors import InvalidContent
from compactd.context.importers import load_transcript
from compactd.context.importers.plan import FunctionEnd, FunctionStart, Messages, ModelCall, Note

CLAUDE = Path(__file__).resolve().parents[1] / "data" / "transcripts" / "claude-code"
NEW = CLAUDE / "64da7265-8f07-4967-b79f-0ae374c13330.jsonl"
NEW_DIR = CLAUDE / "64da7265-8f07-4967-b79f-0ae374c13330"
OLD = CLAUDE / "fe5e1c67-53e7-4862-81ae-d0e013e3270b.jsonl"
SPILLED_ID = "toolu_01FNwq8WBVniRNRAZWKLeVDZ"


def _raw_tool_uses(lines, *, sidechain: bool | None = None):
    return [
        block
        for line in lines
        if line.get("type") == "assistant"
        and (sidechain is None or bool(line.get("isSidechain")) == sidechain)
        for block in line["message"]["content"]
        if block["type"] == "tool_use"
    ]


def _raw_results(lines):
    return {
        block["tool_use_id"]: block
        for line in lines
        if line.get("type") == "user" and isinstance(line["message"]["content"], list)
        for block in line["message"]["content"]
        if block["type"] == "tool_result"
    }


# --- 2.1.63: sub-agents in subagents/, compaction, spilled output -------------------------


def test_new_format_pairs_and_counts(load, check, raw_lines):
    [session] = load(NEW)
    threads = check(session)
    main = threads[None]
    raw = raw_lines(NEW)
    assert session.source_format == "claude-code"
    assert session.source_id == "64da7265-8f07-4967-b79f-0ae374c13330"
    assert session.model == "claude-opus-4-6"
    assert session.system is None
    assert [block["id"] for block in main.tool_uses] == [
        block["id"] for block in _raw_tool_uses(raw)
    ]
    assert len(main.tool_uses) == 115
    assert sum(block["name"] == "Agent" for block in main.tool_uses) == 4
    # Every call got its answer: 111 tool_result blocks plus 4 functions.
    assert len(main.results) == 111
    assert len(main.functions) == 4
    # One ModelCall per API message (merged by message.id), with that message's final usage.
    message_ids = list(
        dict.fromkeys(line["message"]["id"] for line in raw if line["type"] == "assistant")
    )
    assert len(main.model_calls) == len(message_ids) == 82
    first = main.model_calls[0]
    assert first.usage == {
        "input_tokens": 3,
        "cache_creation_input_tokens": 8072,
        "cache_read_input_tokens": 20430,
        "output_tokens": 538,
    }
    assert first.model == "claude-opus-4-6"
    assert first.timestamp == datetime.fromisoformat("2026-03-21T04:29:19.887Z").timestamp()


def test_new_format_sub_agents_are_functions(load, check, raw_lines):
    [session] = load(NEW)
    threads = check(session)
    raw = raw_lines(NEW)
    calls = {block["id"]: block for block in _raw_tool_uses(raw) if block["name"] == "Agent"}
    results = _raw_results(raw)
    starts = [op for op in session.ops if isinstance(op, FunctionStart)]
    ends = {op.key: op for op in session.ops if isinstance(op, FunctionEnd)}
    assert sorted(op.key for op in starts) == sorted(calls)
    for start in starts:
        assert start.name == "Agent"
        assert start.thread is None
        assert start.input == calls[start.key]["input"]
        inner = threads[start.key]
        assert inner.assistant_count > 0 and inner.tool_uses
        assert inner.messages[0] == {"role": "user", "content": start.input["prompt"]}
        assert ends[start.key].output == results[start.key]["content"]
        assert ends[start.key].status == "completed"
        # The answer is the function's output, not a tool_result block in the main thread.
        assert start.key not in {block["tool_use_id"] for block in threads[None].results}
    # The sub-agent threads hold exactly their files' calls.
    file_ids = set()
    for file in (NEW_DIR / "subagents").glob("agent-a[!c]*.jsonl"):
        file_ids |= {block["id"] for block in _raw_tool_uses(raw_lines(file))}
    inner_ids = {block["id"] for start in starts for block in threads[start.key].tool_uses}
    assert inner_ids == file_ids


def test_new_format_function_ops_sit_between_start_and_end(load):
    [session] = load(NEW)
    position = {id(op): index for index, op in enumerate(session.ops)}
    for start in (op for op in session.ops if isinstance(op, FunctionStart)):
        end = next(op for op in session.ops if isinstance(op, FunctionEnd) and op.key == start.key)
        inner = [op for op in session.ops if getattr(op, "thread", None) == start.key]
        assert inner
        assert all(position[id(start)] < position[id(op)] < position[id(end)] for op in inner)


def test_new_format_compaction_records_are_notes(load, raw_lines):
    [session] = load(NEW)
    notes = [op for op in session.ops if isinstance(op, Note)]
    boundaries = [note for note in notes if note.kind == "claude_code_compact_boundary"]
    summaries = [note for note in notes if note.kind == "claude_code_compact_summary"]
    calls = [note for note in notes if note.kind == "claude_code_compaction_call"]
    assert len(boundaries) == 1 and len(summaries) == 1 and len(calls) == 1
    assert boundaries[0].data["compactMetadata"] == {"trigger": "auto", "preTokens": 165763}
    summary_text = summaries[0].data["text"]
    assert summary_text.startswith("This session is being continued from a previous conversation")
    # Not conversation: no message or text block is the summary. (The phrase itself does occur
    # inside a file the agent read, so compare whole texts, not substrings.)
    for op in session.ops:
        if isinstance(op, Messages):
            for message in op.messages:
                content = message["content"]
                texts = (
                    [content]
                    if isinstance(content, str)
                    else [block.get("text") for block in content if block["type"] == "text"]
                )
                assert summary_text not in texts
    # The compaction call keeps its full input and the summary it produced, before the boundary.
    [compact_file] = (NEW_DIR / "subagents").glob("agent-acompact-*.jsonl")
    recorded = [line for line in raw_lines(compact_file) if line["type"] in ("user", "assistant")]
    call = calls[0].data
    assert call["messages"] == [{"role": "user", "content": recorded[0]["message"]["content"]}]
    assert call["summary"] == recorded[1]["message"]["content"][0]["text"]
    assert call["summary"].lstrip().startswith("<analysis>")
    order = [id(note) for note in notes]
    assert (
        order.index(id(calls[0])) < order.index(id(boundaries[0])) < order.index(id(summaries[0]))
    )


def test_new_format_spilled_output_is_resolved(load, check):
    [session] = load(NEW)
    results = {block["tool_use_id"]: block for block in check(session)[None].results}
    spilled = (NEW_DIR / "tool-results" / f"{SPILLED_ID}.txt").read_bytes().decode()
    assert results[SPILLED_ID]["content"] == spilled
    assert len(spilled) > 50_000
    assert not any("<persisted-output>" in str(block["content"]) for block in results.values())


def test_new_format_keeps_thinking_blocks_byte_exact(load, check, raw_lines):
    [session] = load(NEW)
    threads = check(session)
    ours = [
        block
        for message in threads[None].messages
        if message["role"] == "assistant"
        for block in message["content"]
        if block["type"] == "thinking"
    ]
    recorded = [
        block
        for line in raw_lines(NEW)
        if line["type"] == "assistant"
        for block in line["message"]["content"]
        if block["type"] == "thinking"
    ]
    assert len(ours) == 11
    assert ours == recorded
    assert all(block["signature"] for block in ours)


def test_new_format_tool_use_blocks_drop_only_the_default_caller(load, check):
    [session] = load(NEW)
    for block in check(session)[None].tool_uses:
        assert set(block) == {"type", "id", "name", "input"}


def test_new_format_skips_bookkeeping_and_says_so(load):
    [session] = load(NEW)
    text = "\n".join(session.warnings)
    assert "skipped 17 file-history-snapshot record(s)" in text
    assert "system/stop_hook_summary" in text
    assert "progress" in text


def test_interrupted_rejection_keeps_its_text_after_the_result(load, check):
    [session] = load(NEW)
    last = check(session)[None].messages[-1]
    assert last["role"] == "user"
    assert [block["type"] for block in last["content"]] == ["tool_result", "text"]
    assert last["content"][0]["is_error"] is True
    assert last["content"][1]["text"] == "[Request interrupted by user for tool use]"


# --- 1.0.98: inline sidechains -------------------------------------------------------------


def test_old_format_counts_and_sidechain_functions(load, check, raw_lines):
    [session] = load(OLD)
    threads = check(session)
    raw = raw_lines(OLD)
    assert sum(len(stats.tool_uses) for stats in threads.values()) == 167
    main_ids = [block["id"] for block in threads[None].tool_uses]
    assert main_ids == [block["id"] for block in _raw_tool_uses(raw, sidechain=False)]
    tasks = {
        block["id"]: block
        for block in _raw_tool_uses(raw, sidechain=False)
        if block["name"] == "Task"
    }
    starts = [op for op in session.ops if isinstance(op, FunctionStart)]
    assert len(starts) == len(tasks) == 5
    results = _raw_results(raw)
    ends = {op.key: op for op in session.ops if isinstance(op, FunctionEnd)}
    for start in starts:
        assert start.name == "Task" and start.input == tasks[start.key]["input"]
        inner = threads[start.key]
        assert inner.messages[0]["content"] == start.input["prompt"]
        assert inner.tool_uses and inner.assistant_count == len(inner.model_calls) > 0
        # Its last message is the text the main thread got back.
        final = inner.messages[-1]
        assert final["role"] == "assistant"
        assert final["content"][-1]["text"] == results[start.key]["content"][0]["text"]
        assert ends[start.key].output == results[start.key]["content"]
    assert session.title == "Empty Repo Setup: CLAUDE.md Foundation Created"
    assert [note.kind for note in session.ops if isinstance(note, Note)] == ["claude_code_summary"]
    assert session.warnings == []


def test_old_format_parallel_sub_agents_interleave_by_time(load):
    [session] = load(OLD)
    first_three = [op.key for op in session.ops if isinstance(op, FunctionStart)][:3]
    order = [getattr(op, "thread", None) for op in session.ops]
    spans = [(order.index(key), len(order) - 1 - order[::-1].index(key)) for key in first_three]
    # They ran at the same time, so each one's ops overlap the others'.
    assert all(start < other_end for start, _ in spans for _, other_end in spans)
    timestamps = [
        op.timestamp
        for op in session.ops
        if isinstance(op, Messages | ModelCall) and op.thread in first_three
    ]
    assert timestamps == sorted(timestamps)


def test_old_format_meta_lines_are_meta_messages(load, check):
    [session] = load(OLD)
    first, second = check(session)[None].messages[:2]
    assert "meta" not in first and first["content"].startswith("<command-message>")
    assert second["meta"] is True
    assert second["content"][0]["text"].startswith("Split complex tasks")


# --- cuts of the real files ----------------------------------------------------------------


def test_session_without_its_folders_keeps_agent_calls_as_tool_calls(tmp_path, check):
    alone = tmp_path / NEW.name
    shutil.copyfile(NEW, alone)
    [session] = load_transcript(alone)
    threads = check(session)
    assert not any(isinstance(op, FunctionStart) for op in session.ops)
    assert len(threads[None].results) == 115
    text = "\n".join(session.warnings)
    assert "agent-a29edc699187686ae.jsonl" in text and "missing" in text
    assert f"spilled output {SPILLED_ID}.txt" in text
    spilled = next(block for block in threads[None].results if block["tool_use_id"] == SPILLED_ID)
    assert spilled["content"].startswith("<persisted-output>")


def test_call_without_result_stays_unanswered(tmp_path, check):
    lines = NEW.read_bytes().splitlines(keepends=True)
    rejected = next(i for i, line in enumerate(lines) if b'"toolUseResult":"User rejected' in line)
    cut = tmp_path / NEW.name
    cut.write_bytes(b"".join(lines[:rejected]))
    shutil.copytree(NEW_DIR, tmp_path / NEW_DIR.name)
    [session] = load_transcript(cut)
    main = check(session)[None]
    last_call = main.tool_uses[-1]
    assert last_call["id"] == "toolu_01Efk13c5MvQ8ASvvrWWupsg"
    assert main.messages[-1]["role"] == "assistant"
    assert last_call["id"] not in {block["tool_use_id"] for block in main.results}


def test_sidechain_found_by_final_text_when_the_prompt_differs(tmp_path, check, raw_lines):
    records = raw_lines(OLD)
    for record in records:  # the Task prompt no longer matches its sidechain's first message
        if record.get("type") == "assistant" and not record.get("isSidechain"):
            for block in record["message"]["content"]:
                if block["type"] == "tool_use" and block["name"] == "Task":
                    block["input"]["prompt"] += " (edited)"
    cut = tmp_path / OLD.name
    cut.write_bytes(b"".join(orjson.dumps(record) + b"\n" for record in records))
    [session] = load_transcript(cut)
    check(session)
    assert sum(isinstance(op, FunctionStart) for op in session.ops) == 5


@pytest.mark.parametrize("cut_at", [0.5, 0.999])
def test_truncated_session_is_a_clear_error(tmp_path, cut_at):
    data = NEW.read_bytes()
    cut = tmp_path / NEW.name
    cut.write_bytes(data[: int(len(data) * cut_at)])
    with pytest.raises(
        InvalidContent, match=r"line \d+ is not valid JSON \(the file looks truncated\)"
    ):
        load_transcript(cut)
