"""Recall: every piece of content a render leaves out names a handle the model can read back.

A handle is `recall:<node id>.<tag>`: the node whose content was cut (a tool result, a
function's output) or, for a range of removed turns, the turn it starts at (its recall lists
the tool results from there on). The tag is a hash of the session id and the node id, so a
handle is a pure function of the graph (the cached prefix stays byte-stable) and a handle
from another session is recognised as foreign rather than read as one of this session's
nodes. Content is addressed by lines; a line longer than `LINE_WIDTH` characters counts as
several, so a single-line result (minified JSON) can still be paged through.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable
from typing import Any

import attrs

from .errors import InvalidContent, UnknownHandle
from .graph import Graph, Node, Path

PREFIX = "recall:"
TOOL_NAME = "compactd_recall"
LINE_WIDTH = 1000
HANDLE_RE = re.compile(r"recall:[A-Za-z0-9_.-]+")
_TAG_RE = re.compile(r"^[0-9a-f]{8}$")

RECALL_TOOL: dict[str, Any] = {
    "name": TOOL_NAME,
    "description": (
        "Read back content compactd left out of this conversation to fit the context window. "
        "Every note that says content was cut, cleared or removed names a handle (it starts "
        "with `recall:`). Pass it as `handle`; `startLine`/`endLine` (1-based, inclusive) "
        "pick lines; a long answer is cut to a page and says where to continue. A tool result "
        "cleared without a handle: pass its tool_use id as the handle."
    ),
    "input_schema": {
        "type": "object",
        "properties": {
            "handle": {"type": "string", "description": "The handle, as the note names it"},
            "startLine": {"type": "integer", "minimum": 1},
            "endLine": {"type": "integer", "minimum": 1},
        },
        "required": ["handle"],
    },
}
"""The tool a request carries with `recall: true` (Anthropic shape; the OpenAI formatter
converts it like any tool the client passes)."""


def handle_for(session_id: str, node_id: str) -> str:
    digest = hashlib.sha256(f"{session_id}\0{node_id}".encode()).hexdigest()
    return f"{PREFIX}{node_id}.{digest[:8]}"


def with_recall_tool(tools: list[dict[str, Any]] | None) -> list[dict[str, Any]]:
    """The client's tools plus `compactd_recall` (unless the client already declares it)."""
    tools = list(tools or [])
    names = {t.get("name") or (t.get("function") or {}).get("name") for t in tools}
    if TOOL_NAME not in names:
        tools.append(RECALL_TOOL)
    return tools


# ---- lines ------------------------------------------------------------------------------------


def line_starts(text: str) -> list[int]:
    """The character offset where each line begins (long lines wrapped at `LINE_WIDTH`); a
    final newline does not open an empty last line."""
    starts: list[int] = []
    at = 0
    end = len(text)
    while at < end or not starts:
        starts.append(at)
        newline = text.find("\n", at, min(end, at + LINE_WIDTH + 1))
        if newline == -1:
            at = min(end, at + LINE_WIDTH)
            if at == end:
                break
        else:
            at = newline + 1
    return starts


def cleared_note(handle: str, content: Any) -> str:
    """Tier 1's placeholder when the request carries `compactd_recall`."""
    lines = len(line_starts(content_text(content)))
    size = f"its {lines} line{'s' if lines != 1 else ''}"
    return (
        "[Old tool result content cleared by compactd; compactd_recall with handle "
        f"{handle} returns {size}.]"
    )


def range_note(entries: list[str], index_handle: str | None, limit: int) -> str:
    """What a snip, collapse or summary marker adds: the handles of the tool results of its
    turns (the newest `limit`), and when there are more, the handle that lists them all."""
    if not entries:
        return ""
    shown = entries[-limit:] if limit else []
    out = ["[compactd_recall returns the tool results of these turns by handle]"]
    if len(shown) < len(entries) and index_handle is not None:
        out.append(
            f"({len(entries) - len(shown)} earlier ones are not listed; {index_handle} "
            "lists every tool result from the first of these turns on)"
        )
    out.extend(f"- {e}" for e in shown)
    return "\n\n" + "\n".join(out)


def entry(session_id: str, call: Node, content: Any) -> str:
    """One tool result in a range note or an index: handle, tool, its main argument, size."""
    lines = len(line_starts(content_text(content)))
    hint = _hint(call.input)
    return f"{handle_for(session_id, call.id)} {call.name}{hint} ({lines} line{'s' * (lines != 1)})"


def _hint(value: Any) -> str:
    if isinstance(value, dict):
        value = next((v for v in value.values() if isinstance(v, str) and v.strip()), None)
    if not isinstance(value, str):
        return ""
    text = " ".join(value.split())
    return " " + (text if len(text) <= 60 else text[:59] + "…")


def content_text(content: Any) -> str:
    """A result as recall serves it: text parts joined by newlines, other parts named."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        pieces = []
        for block in content:
            if isinstance(block, dict) and block.get("type") == "text":
                pieces.append(str(block.get("text", "")))
            else:
                kind = block.get("type", "content") if isinstance(block, dict) else "content"
                pieces.append(f"[{kind} block: not recallable as text]")
        return "\n".join(pieces)
    return str(content)


# ---- what a handle stands for -----------------------------------------------------------------


def shown_content(graph: Graph, call: Node) -> Any:
    """The content a call's result stands for: a bound function's output, else its result."""
    if call.kind == "tool" and call.function:
        return graph.nodes[call.function].result
    return call.result


def has_content(graph: Graph, call: Node) -> bool:
    if call.kind == "function" or (call.kind == "tool" and call.function):
        fn = graph.nodes[call.function] if call.kind == "tool" and call.function else call
        return fn.status != "running" and fn.result is not None
    return call.answered


def range_entries(graph: Graph, node_ids: Iterable[str]) -> list[str]:
    """Entries for every tool result of these thread nodes, in order."""
    out = []
    for node_id in node_ids:
        for call in graph.calls_of(graph.nodes[node_id]):
            if not has_content(graph, call):
                continue
            # memoized on the call: a marker is rebuilt on every render of the cascade
            holder = graph.nodes[call.function] if call.function else call
            key = ("recall-entry", holder.result_seq, holder.status)
            line = call.cache.get(key)
            if line is None:
                line = call.cache[key] = entry(graph.session_id, call, shown_content(graph, call))
            out.append(line)
    return out


@attrs.frozen
class Recalled:
    text: str
    total_lines: int
    start_line: int
    end_line: int
    truncated: bool


def resolve(graph: Graph, handle: str, path: Path) -> Node:
    """The node a handle names, if it is this session's and lies on `path`. A tool_use id
    stands for its call: the provider's own placeholder (Tier 1's server path) names none."""
    if not handle.startswith(PREFIX):
        call = graph.tool_by_use_id(handle)
        if call is None:
            raise UnknownHandle(
                f"{handle!r} is neither a recall handle (recall:<id>) nor a tool_use id of "
                "this session",
                handle=handle,
            )
        handle = handle_for(graph.session_id, call.id)
    node_id, _, tag = handle[len(PREFIX) :].rpartition(".")
    if not node_id or not _TAG_RE.match(tag):
        raise UnknownHandle(f"{handle!r} is not a well-formed recall handle", handle=handle)
    if node_id not in graph.nodes or handle_for(graph.session_id, node_id) != handle:
        raise UnknownHandle(
            f"handle {handle} does not belong to session {graph.session_id}", handle=handle
        )
    if not graph.on_path(node_id, path):
        raise UnknownHandle(
            f"handle {handle} is not on this branch; it was rendered on another one",
            handle=handle,
        )
    return graph.nodes[node_id]


def text_of(graph: Graph, node: Node) -> str:
    """What recalling a node gives: a result or output, or, for a turn, the index of every
    tool result from it to the head of its thread."""
    if node.kind in ("tool", "function"):
        if not has_content(graph, node):
            handle = handle_for(graph.session_id, node.id)
            raise UnknownHandle(f"{handle} has no result to recall yet", handle=handle)
        return content_text(shown_content(graph, node))
    thread = graph.function_path(node.owner) if node.owner else graph.branch_path()
    ids = thread.ids[thread.index(node.id) :] if node.id in thread else [node.id]
    return "\n".join(range_entries(graph, ids))


def recall(
    graph: Graph,
    handle: str,
    path: Path,
    max_chars: int,
    start_line: int | None = None,
    end_line: int | None = None,
) -> Recalled:
    """Lines `start_line..end_line` of what `handle` stands for, whole lines up to
    `max_chars` characters (a first line longer than that is cut)."""
    node = resolve(graph, handle, path)
    text = text_of(graph, node)
    starts = line_starts(text)
    total = len(starts)
    first = 1 if start_line is None else start_line
    last = total if end_line is None else min(end_line, total)
    if first < 1 or first > total:
        raise InvalidContent(
            f"startLine must be between 1 and {total} (the content has {total} lines)",
            field="startLine",
        )
    if last < first:
        raise InvalidContent("endLine must not be before startLine", field="endLine")
    bounds = [*starts, len(text)]
    out_end = first
    begin = starts[first - 1]
    for line in range(first, last + 1):
        if bounds[line] - begin > max_chars:
            break
        out_end = line
    stop = bounds[out_end]
    truncated = out_end < last
    if stop - begin > max_chars:  # even the first line does not fit
        stop, truncated = begin + max_chars, True
    return Recalled(text[begin:stop].rstrip("\n"), total, first, out_end, truncated)


def handles_in(value: Any) -> set[str]:
    """Every handle a rendered block shows (for the replay's count)."""
    found: set[str] = set()
    if isinstance(value, str):
        if PREFIX in value:
            found.update(HANDLE_RE.findall(value))
    elif isinstance(value, dict):
        for v in value.values():
            found |= handles_in(v)
    elif isinstance(value, list):
        for v in value:
            found |= handles_in(v)
    return found
