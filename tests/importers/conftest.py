"""Shared checks for the importer tests: the real transcripts and the op-stream invariants."""

from __future__ import annotations

import functools
from collections.abc import Callable
from pathlib import Path
from typing import Any

import attrs
import orjson
import pytest
from compactd.context.importers import load_transcript
from compactd.context.importers.plan import (
    FunctionEnd,
    FunctionStart,
    ImportedSession,
    Messages,
    ModelCall,
    Note,
)


@functools.cache
def _load(path: Path) -> list[ImportedSession]:
    return load_transcript(path)


@pytest.fixture(scope="session")
def load() -> Callable[[Path], list[ImportedSession]]:
    """Load a transcript once per test run (the sessions are frozen; tests only read them)."""
    return _load


def _raw_lines(path: Path) -> list[dict[str, Any]]:
    return [orjson.loads(line) for line in path.read_bytes().splitlines() if line.strip()]


@pytest.fixture(scope="session")
def raw_lines() -> Callable[[Path], list[dict[str, Any]]]:
    """The transcript's records parsed independently of the importer, to compare against."""
    return _raw_lines


@attrs.define
class ThreadStats:
    """What one thread held, as counted while checking it."""

    messages: list[dict[str, Any]] = attrs.Factory(list)
    tool_uses: list[dict[str, Any]] = attrs.Factory(list)
    results: list[dict[str, Any]] = attrs.Factory(list)
    model_calls: list[ModelCall] = attrs.Factory(list)
    functions: list[FunctionStart] = attrs.Factory(list)
    # Calls of the last assistant message → None (open), "result" or "function".
    open_calls: dict[str, str | None] = attrs.Factory(dict)
    assistant_count: int = 0
    awaiting_assistant: bool = False


def check_session(session: ImportedSession) -> dict[str | None, ThreadStats]:
    """Assert the op-stream invariants of `plan.py` thread by thread; return what was seen.

    Within a thread: the first message is a user message; a ModelCall is followed by an
    assistant message; two assistant messages follow each other only when functions answered
    every call of the first (there is no user message to carry them); consecutive user messages
    differ in `meta`; every tool_result answers an unanswered call of the assistant message just
    before it, in call order, and comes before any other block; tool_use ids are unique in the
    whole session; a function's call is answered by its FunctionEnd only, which comes after its
    start and before the next assistant message of the calling thread; a function's own ops
    come between its start and its end.
    """
    threads: dict[str | None, ThreadStats] = {None: ThreadStats()}
    started_at: dict[str, tuple[str | None, int]] = {}
    ended: set[str] = set()
    all_ids: set[str] = set()
    for op in session.ops:
        if isinstance(op, Note):
            assert isinstance(op.kind, str) and isinstance(op.data, dict)
            continue
        if isinstance(op, FunctionEnd):
            assert op.key in started_at, f"FunctionEnd {op.key} before its start"
            assert op.key not in ended, f"FunctionEnd {op.key} twice"
            parent, assistant_index = started_at[op.key]
            assert threads[parent].assistant_count == assistant_index, (
                f"function {op.key} ended after its caller moved on"
            )
            assert op.status in ("completed", "error")
            ended.add(op.key)
            continue
        assert op.thread in threads, f"op in unknown thread {op.thread}"
        assert op.thread is None or op.thread not in ended, f"op after {op.thread} ended"
        stats = threads[op.thread]
        if isinstance(op, ModelCall):
            assert not stats.awaiting_assistant, "two ModelCalls without an assistant message"
            stats.model_calls.append(op)
            stats.awaiting_assistant = True
        elif isinstance(op, FunctionStart):
            assert op.key == op.tool_use_id
            assert op.tool_use_id in stats.open_calls, (
                f"FunctionStart for {op.tool_use_id}, not a call of the last message"
            )
            assert stats.open_calls[op.tool_use_id] is None, f"{op.tool_use_id} answered twice"
            stats.open_calls[op.tool_use_id] = "function"
            assert op.key not in threads
            threads[op.key] = ThreadStats()
            started_at[op.key] = (op.thread, stats.assistant_count)
            stats.functions.append(op)
        elif isinstance(op, Messages):
            for message in op.messages:
                _check_message(message, stats, all_ids)
    for thread, stats in threads.items():
        assert not stats.awaiting_assistant, f"thread {thread} ends with a ModelCall"
        assert len(stats.model_calls) == stats.assistant_count, thread
    return threads


def _check_message(message: dict[str, Any], stats: ThreadStats, all_ids: set[str]) -> None:
    role = message["role"]
    content = message["content"]
    assert isinstance(content, str | list)
    previous = stats.messages[-1] if stats.messages else None
    if role == "assistant":
        assert previous is not None, "a thread starts with an assistant message"
        if previous["role"] == "assistant":
            answers = set(stats.open_calls.values())
            assert answers == {"function"}, (
                "two assistant messages in a row, and the first one's calls were not all "
                "answered by functions"
            )
        assert stats.awaiting_assistant, "an assistant message without its ModelCall"
        stats.awaiting_assistant = False
        stats.assistant_count += 1
        stats.open_calls = {}
        for block in content:
            if block["type"] == "tool_use":
                assert block["id"] not in all_ids, f"duplicate tool_use id {block['id']}"
                assert isinstance(block["input"], dict)
                assert set(block) >= {"type", "id", "name", "input"}
                all_ids.add(block["id"])
                stats.open_calls[block["id"]] = None
                stats.tool_uses.append(block)
            else:
                assert block["type"] != "tool_result"
    else:
        assert role == "user"
        assert not stats.awaiting_assistant, "a user message between ModelCall and its reply"
        if previous is not None and previous["role"] == "user":
            assert bool(previous.get("meta")) != bool(message.get("meta")), (
                "two user messages in a row with the same meta flag"
            )
        blocks = content if isinstance(content, list) else []
        seen_other = False
        call_order = list(stats.open_calls)
        last_index = -1
        for block in blocks:
            if block["type"] == "tool_result":
                assert not seen_other, "a tool_result after other blocks"
                call_id = block["tool_use_id"]
                if call_id in stats.open_calls:
                    index = call_order.index(call_id)
                    assert index > last_index, "tool results out of call order"
                    last_index = index
                assert call_id in stats.open_calls, (
                    f"tool_result for {call_id}: not a call of the previous assistant message"
                )
                assert stats.open_calls[call_id] is None, f"{call_id} answered twice"
                stats.open_calls[call_id] = "result"
                stats.results.append(block)
            else:
                assert block["type"] != "tool_use"
                seen_other = True
        assert blocks or (isinstance(content, str) and content)
    stats.messages.append(message)


@pytest.fixture(scope="session")
def check() -> Callable[[ImportedSession], dict[str | None, ThreadStats]]:
    return check_session
