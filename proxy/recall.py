"""`compactd_recall` answered inside the proxy: the model reads back what compactd cut without
the client knowing the tool exists."""

from __future__ import annotations

from typing import Any

from ..context.engine import Engine
from ..context.errors import InvalidContent, InvalidSearch, UnknownHandle
from ..context.recall import Search
from ..protocol.recall import page_text


def answer(engine: Engine, session_id: str, branch: str, call: dict[str, Any]) -> dict[str, Any]:
    """The `tool_result` block for one call: a page, or a search's matching lines. A bad
    handle, line range or search (one RE2 will not run) is the model's mistake, so it is an
    error result the model reads, not an error of the request; a recall writes nothing."""
    session = engine.session(session_id)
    args = call.get("input") if isinstance(call.get("input"), dict) else {}
    start, end = args.get("startLine"), args.get("endLine")
    try:
        if start is not None and not isinstance(start, int):
            raise InvalidContent("startLine must be an integer", field="startLine")
        if end is not None and not isinstance(end, int):
            raise InvalidContent("endLine must be an integer", field="endLine")
        search = Search.of(args.get("search"), args.get("regex"), args.get("context"))
        handle = str(args.get("handle", ""))
        got = engine.recall(session.id, handle, start, end, branch, search)
    except (UnknownHandle, InvalidContent, InvalidSearch) as exc:
        return {
            "type": "tool_result",
            "tool_use_id": call["id"],
            "content": str(exc),
            "is_error": True,
        }
    text = page_text(
        got.text, got.start_line, got.end_line, got.total_lines, got.truncated, got.matches
    )
    return {"type": "tool_result", "tool_use_id": call["id"], "content": text}


def as_note(call: dict[str, Any], result: dict[str, Any]) -> dict[str, Any]:
    """A recall made beside the client's own calls, answered in the next request as a text
    block after the client's results (its call never reached the client, so no result may)."""
    args = call.get("input") or {}
    handle = args.get("handle", "")
    status = " (failed)" if result.get("is_error") else ""
    if isinstance(args.get("search"), str):
        handle = f"{handle} search {args['search']!r}"
    return {
        "type": "text",
        "text": f"[compactd_recall {handle}{status}]\n{result['content']}",
    }
