"""`ThreadBuilder`: one thread's records, in transcript order, → correctly paired ops.

Every importer builds its threads through `ThreadBuilder`, so the conventions below hold for all
formats by construction rather than by each parser's care:


* An assistant API message is one `Messages` op, preceded by one `ModelCall` (with the usage the
  transcript recorded for that request, in Anthropic keys).
* The results answering one assistant message are collected into the user message that follows
  it: `tool_result` blocks first, in call order, then the text of the user lines that came before
  the next assistant message. User text with a different `meta` flag starts a new user message,
  so injected content never passes for a human turn (and vice versa).
* A call that never got a result keeps none; a result for an unknown call, or a second result
  for the same call, is dropped and named in `warnings`. Tool-use ids are unique per thread.
* A call that ran a sub-agent becomes a function: `FunctionStart(key=tool_use_id)` right after
  the assistant message, then the sub-agent's own ops (several sub-agents started by the same
  message are interleaved by timestamp, as they ran), then `FunctionEnd` with the call's recorded
  result as output, then the rest of the user message. The call gets no `tool_result` block.
* `Note`s keep their place among the user messages of the turn they were recorded in.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Callable, Iterable
from typing import Any

import attrs
import orjson

from ..errors import InvalidPairing
from .jsonio import json_type
from .plan import MAIN, Compaction, FunctionEnd, FunctionStart, Messages, ModelCall, Note, Op

__all__ = ["FunctionResolver", "FunctionRun", "ThreadBuilder"]


@attrs.define
class FunctionRun:
    """A sub-agent's own ops (every one in the thread named by the call's id)."""

    ops: list[Op]


FunctionResolver = Callable[[dict[str, Any], dict[str, Any] | None, Any], FunctionRun | None]
"""(tool_use block, its tool_result block or None, the result's extra info) → a function run."""


@attrs.define
class _Call:
    block: dict[str, Any]
    timestamp: float | None
    result: dict[str, Any] | None = None
    result_timestamp: float | None = None
    result_order: int = 0
    result_info: Any = None


@attrs.define
class _UserChunk:
    content: str | list[dict[str, Any]]
    meta: bool
    timestamp: float | None


@attrs.define
class _Turn:
    """One assistant API message and what came back before the next one."""

    is_assistant: bool
    message_id: str | None = None
    timestamp: float | None = None
    model: str | None = None
    usage: dict[str, int] | None = None
    blocks: list[dict[str, Any]] = attrs.Factory(list)
    calls: dict[str, _Call] = attrs.Factory(dict)
    notes_before: list[Note] = attrs.Factory(list)
    after: list[_UserChunk | Note | Compaction] = attrs.Factory(list)


class ThreadBuilder:
    """Turns one thread's records, in transcript order, into correctly paired ops.

    Feed it with `assistant` (blocks of one API message; lines sharing a `message_id` merge),
    `result`, `user` and `note`; call `finish` at the end. Ops go to `ops` as each turn closes.
    """

    def __init__(
        self,
        thread: str | None = MAIN,
        *,
        ops: list[Op] | None = None,
        warn: Callable[[str], None] | None = None,
        resolve_function: FunctionResolver | None = None,
    ) -> None:
        self.thread = thread
        self.ops: list[Op] = [] if ops is None else ops
        self._warn = warn or (lambda message: None)
        self._resolve_function = resolve_function
        self._turn: _Turn | None = None
        self._call_ids: set[str] = set()
        self._result_order = itertools.count()

    # feeding

    def assistant(
        self,
        blocks: Iterable[dict[str, Any]],
        *,
        message_id: str | None = None,
        timestamp: float | None = None,
        model: str | None = None,
        usage: dict[str, int] | None = None,
    ) -> None:
        """Add blocks of an assistant message; a new `message_id` (or None) starts a new one."""
        turn = self._turn
        if (
            turn is None
            or not turn.is_assistant
            or message_id is None
            or (turn.message_id != message_id)
        ):
            self._flush()
            turn = self._turn = _Turn(True, message_id, timestamp, model, usage)
        else:
            turn.model = turn.model or model
            turn.usage = _max_usage(turn.usage, usage)
        for block in blocks:
            if block.get("type") == "tool_use":
                call_id = block.get("id")
                if not isinstance(call_id, str) or not call_id:
                    self._warn("dropped a tool_use block without an id")
                    continue
                if call_id in self._call_ids:
                    self._warn(f"dropped a second tool_use with the id {call_id}")
                    continue
                self._call_ids.add(call_id)
                turn.calls[call_id] = _Call(block, timestamp)
            turn.blocks.append(block)

    def attach_usage(self, usage: dict[str, int]) -> bool:
        """Give the open assistant message its usage if it has none yet (usage recorded late)."""
        turn = self._turn
        if turn is None or not turn.is_assistant or turn.usage is not None:
            return False
        turn.usage = usage
        return True

    def result(
        self, block: dict[str, Any], *, timestamp: float | None = None, info: Any = None
    ) -> None:
        """A `tool_result` block; it must answer a call of the open assistant message. An id
        that is not a string can name no call: `InvalidPairing`."""
        call_id = block.get("tool_use_id")
        if call_id is not None and not isinstance(call_id, str):
            raise InvalidPairing(
                f"a tool result's id must be a string, got a JSON {json_type(call_id)}",
                toolUseId=orjson.dumps(call_id).decode()[:60],
            )
        turn = self._turn
        call = turn.calls.get(call_id) if turn is not None and isinstance(call_id, str) else None
        if call is None:
            where = "an earlier message" if call_id in self._call_ids else "no recorded call"
            self._warn(f"dropped a tool result for {call_id} (it answers {where})")
            return
        if call.result is not None:
            self._warn(f"dropped a second tool result for {call_id}")
            return
        call.result = block
        call.result_timestamp = timestamp
        call.result_order = next(self._result_order)
        call.result_info = info

    def user(
        self,
        content: str | list[dict[str, Any]],
        *,
        meta: bool = False,
        timestamp: float | None = None,
    ) -> None:
        """User content (not tool results): a human turn, or injected text when `meta`."""
        if not content:
            return
        if self._turn is None:
            self._turn = _Turn(False, timestamp=timestamp)
        self._turn.after.append(_UserChunk(content, meta, timestamp))

    def note(self, note: Note | Compaction) -> None:
        """A Note (or a recorded compaction) at this point of the thread, after what the open
        turn already holds."""
        if self._turn is None:
            self.ops.append(note)
        else:
            self._turn.after.append(note)

    def note_before_message(self, note: Note) -> None:
        """A Note about the open assistant message itself (e.g. its reasoning summary)."""
        if self._turn is not None and self._turn.is_assistant:
            self._turn.notes_before.append(note)
        else:
            self.note(note)

    def finish(self) -> list[Op]:
        """Close the last turn and return the ops."""
        self._flush()
        return self.ops

    # emitting

    def _flush(self) -> None:
        turn, self._turn = self._turn, None
        if turn is None:
            return
        if turn.is_assistant and turn.blocks:
            self.ops.append(ModelCall(self.thread, turn.timestamp, turn.model, turn.usage))
            self.ops.extend(turn.notes_before)
            message = {"role": "assistant", "content": turn.blocks}
            self.ops.append(Messages([message], self.thread, turn.timestamp))
        elif turn.is_assistant:
            # A response with nothing for the conversation (e.g. reasoning only): a ModelCall
            # must be followed by its message, so only the notes stay.
            self.ops.extend(turn.notes_before)
            self._warn("a model response with no content was not kept as a model call")
        functions = self._functions(turn)
        for call, _run in functions:
            self.ops.append(
                FunctionStart(
                    key=call.block["id"],
                    name=str(call.block.get("name") or "function"),
                    input=call.block.get("input"),
                    tool_use_id=call.block["id"],
                    thread=self.thread,
                    timestamp=call.timestamp,
                )
            )
        self.ops.extend(_interleave([run.ops for _call, run in functions]))
        ended = [call for call, _run in functions if call.result is not None]
        for call in sorted(ended, key=lambda call: call.result_order):
            assert call.result is not None
            self.ops.append(
                FunctionEnd(
                    key=call.block["id"],
                    output=call.result.get("content", ""),
                    status="error" if call.result.get("is_error") else "completed",
                    timestamp=call.result_timestamp,
                )
            )
        for call, _run in functions:
            if call.result is None:
                self._warn(f"function {call.block['id']} never returned; left running")
        as_functions = {id(call) for call, _run in functions}
        answered = [
            call
            for call in turn.calls.values()
            if call.result is not None and id(call) not in as_functions
        ]
        self._emit_user_messages(answered, turn.after)

    def _functions(self, turn: _Turn) -> list[tuple[_Call, FunctionRun]]:
        if self._resolve_function is None:
            return []
        found = []
        for call in turn.calls.values():
            run = self._resolve_function(call.block, call.result, call.result_info)
            if run is not None:
                found.append((call, run))
        return found

    def _emit_user_messages(
        self, answered: list[_Call], events: list[_UserChunk | Note | Compaction]
    ) -> None:
        results = [call.result for call in answered if call.result is not None]
        first_result_at = min(
            (call.result_timestamp for call in answered if call.result_timestamp is not None),
            default=None,
        )
        chunks: list[_UserChunk] = []
        carried: list[dict[str, Any]] = []

        def close() -> None:
            if chunks:
                self._append_user(carried, chunks, first_result_at if carried else None)
                chunks.clear()
                carried.clear()

        def emit_bare_results() -> None:
            nonlocal results
            if results:
                self.ops.append(
                    Messages([{"role": "user", "content": results}], self.thread, first_result_at)
                )
                results = []

        for event in events:
            if isinstance(event, Note | Compaction):
                close()
                emit_bare_results()
                self.ops.append(event)
                continue
            if chunks and chunks[0].meta != event.meta:
                close()
            if not chunks and results:
                carried.extend(results)
                results = []
            chunks.append(event)
        close()
        emit_bare_results()

    def _append_user(
        self, results: list[dict[str, Any]], chunks: list[_UserChunk], results_at: float | None
    ) -> None:
        content: str | list[dict[str, Any]]
        if not results and len(chunks) == 1 and isinstance(chunks[0].content, str):
            content = chunks[0].content
        else:
            content = list(results)
            for chunk in chunks:
                if isinstance(chunk.content, str):
                    content.append({"type": "text", "text": chunk.content})
                else:
                    content.extend(chunk.content)
        message: dict[str, Any] = {"role": "user", "content": content}
        if chunks[0].meta:
            message["meta"] = True
        timestamp = results_at if results_at is not None else chunks[0].timestamp
        self.ops.append(Messages([message], self.thread, timestamp))


def _max_usage(old: dict[str, int] | None, new: dict[str, int] | None) -> dict[str, int] | None:
    """Streamed lines of one message repeat its usage with growing output counts: keep the max."""
    if old is None or new is None:
        return old or new
    merged = dict(old)
    for key, value in new.items():
        merged[key] = max(merged.get(key, value), value)
    return merged


def _interleave(streams: list[list[Op]]) -> list[Op]:
    """Merge concurrent sub-agents' ops by time, keeping each one's own order."""
    if len(streams) <= 1:
        return streams[0] if streams else []

    def keyed(index: int, ops: list[Op]) -> list[tuple[float, int, Op]]:
        last = float("-inf")
        out = []
        for op in ops:
            if op.timestamp is not None:
                last = max(last, op.timestamp)
            out.append((last, index, op))
        return out

    merged = heapq.merge(*(keyed(i, ops) for i, ops in enumerate(streams)), key=lambda t: t[:2])
    return [op for _time, _index, op in merged]
