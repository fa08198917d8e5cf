"""Recall: every piece of content a render leaves out names a handle the model can read back.

A handle is `recall:<node id>[.<part>].<tag>`: the node whose content was left out, and which
of it —
- no part: the node's own content: a tool result, a function's output, a message's text;
- `cut`: the same content, where Budget Reduction's note stands — recalled without lines, it
  starts at the first line the cut left out (`Engine.recall` knows where that is);
- `input`: a tool call's input (Tier 1 shortens the long strings of old calls);
- `from`: the transcript of the thread from that node on — every message's words verbatim and
  each call with the handle of its result — which a removed range of turns names.
The tag is a hash of the session id, the node id and the part, so a handle is a pure function
of the graph (the cached prefix stays byte-stable) and a handle from another session is
recognised as foreign rather than read as one of this session's nodes. Content is addressed by
lines; a line longer than `LINE_WIDTH` characters counts as several, so a single-line result
(minified JSON) can still be paged through. A recall reads a page of lines, or searches: the
lines that match a pattern (plain text, or an RE2 regular expression, which matches in time
linear in the content — no pattern can hold the daemon), with their line numbers and a little
context, whole lines under the same page size.
"""

from __future__ import annotations

import hashlib
import re
from bisect import bisect_right
from collections.abc import Iterable, Iterator
from typing import Any

import attrs
import orjson
import re2

from .blocks import has_long_strings
from .errors import InvalidContent, InvalidSearch, UnknownHandle
from .graph import Graph, Node, Path

PREFIX = "recall:"
TOOL_NAME = "compactd_recall"
LINE_WIDTH = 1000
HANDLE_RE = re.compile(r"recall:[A-Za-z0-9_.-]+")
_TAG_RE = re.compile(r"^[0-9a-f]{8}$")

SEARCH_MAX_CHARS = 500  # the longest pattern a search takes
SEARCH_CONTEXT = 1  # lines shown before and after each matching line, unless asked
SEARCH_CONTEXT_MAX = 5

RECALL_TOOL: dict[str, Any] = {
    "name": TOOL_NAME,
    "description": (
        "Read back what compactd cut, cleared or removed to fit the context window: pass as "
        "`handle` the `recall:` handle its note names, or the tool_use id of a result cleared "
        "without one (`<id>.input`: its input). `search`: only the lines containing it, "
        "numbered (`regex`: RE2). `startLine`/`endLine` (1-based): the lines read or searched."
    ),
    "input_schema": {
        "type": "object",
        "properties": {
            "handle": {"type": "string"},
            "search": {"type": "string"},
            "regex": {"type": "boolean"},
            "context": {"type": "integer", "minimum": 0, "maximum": SEARCH_CONTEXT_MAX},
            "startLine": {"type": "integer", "minimum": 1},
            "endLine": {"type": "integer", "minimum": 1},
        },
        "required": ["handle"],
    },
}
"""The tool a request carries with `recall: true` (Anthropic shape; the OpenAI formatter
converts it like any tool the client passes)."""


CUT, INPUT, FROM = "cut", "input", "from"
PARTS = (CUT, INPUT, FROM)
INPUT_NOTE_CHARS = 200  # a transcript names a call's input handle past strings this long


def handle_for(session_id: str, node_id: str, part: str | None = None) -> str:
    key = node_id if part is None else f"{node_id}.{part}"
    digest = hashlib.sha256(f"{session_id}\0{key}".encode()).hexdigest()
    return f"{PREFIX}{key}.{digest[:8]}"


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


def cleared_note(handle: str, content: Any, superseded: str | None = None) -> str:
    """Tier 1's placeholder when the request carries `compactd_recall` (for a superseded
    result, saying why it went)."""
    lines = len(line_starts(content_text(content)))
    size = f"its {lines} line{'s' if lines != 1 else ''}"
    what = (
        f"Tool result cleared by compactd: superseded ({superseded})"
        if superseded
        else "Old tool result content cleared by compactd"
    )
    return f"[{what}; compactd_recall with handle {handle} returns {size}, or searches them.]"


def range_note(entries: list[str], transcript_handle: str, limit: int) -> str:
    """What a snip, collapse or summary marker adds: the handle of its turns' transcript (their
    messages verbatim, each call with its result's handle) and the handles of their tool
    results (the newest `limit`; the transcript names them all)."""
    shown = entries[-limit:] if limit else []
    head = (
        f"[compactd_recall with handle {transcript_handle} returns the messages of these turns "
        "verbatim, from the first on (with search: the lines that match in them and their tool "
        "results)"
    )
    out = [head + ("; their tool results by handle:]" if entries else "]")]
    if len(shown) < len(entries):
        out.append(
            f"({len(entries) - len(shown)} earlier ones are not listed; {transcript_handle} "
            "names them all)"
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


def range_entries(graph: Graph, node_ids: Iterable[str], only: str | None = None) -> list[str]:
    """Entries for every tool result of these thread nodes, in order (`only`: that call's)."""
    out = []
    for node_id in node_ids:
        for call in graph.calls_of(graph.nodes[node_id]):
            if (only is not None and call.id != only) or not has_content(graph, call):
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
    """A page of lines, or a search's matching lines: `end_line` is the last line the answer
    covers (a cut one goes on from the next); `matches` the lines that matched a search in
    all (None for a page)."""

    text: str
    total_lines: int
    start_line: int
    end_line: int
    truncated: bool
    matches: int | None = None


def resolve(graph: Graph, handle: str, path: Path) -> tuple[Node, str | None]:
    """The node a handle names and which part of it, if it is this session's and lies on
    `path`. A tool_use id stands for its call (`<id>.input` for the call's input): the
    provider's own placeholder (Tier 1's server path) names no handle."""
    if not handle.startswith(PREFIX):
        use_id, part = handle, None
        if handle.endswith(f".{INPUT}"):
            use_id, part = handle[: -len(INPUT) - 1], INPUT
        call = graph.tool_by_use_id(use_id, path)
        if call is None:
            raise UnknownHandle(
                f"{handle!r} is neither a recall handle (recall:<id>) nor a tool_use id of "
                "this session",
                handle=handle,
            )
        handle = handle_for(graph.session_id, call.id, part)
    key, _, tag = handle[len(PREFIX) :].rpartition(".")
    node_id, dot, part = key.rpartition(".")
    if not dot or part not in PARTS:
        node_id, part = key, None
    if not node_id or not _TAG_RE.match(tag):
        raise UnknownHandle(f"{handle!r} is not a well-formed recall handle", handle=handle)
    if node_id not in graph.nodes or handle_for(graph.session_id, node_id, part) != handle:
        raise UnknownHandle(
            f"handle {handle} does not belong to session {graph.session_id}", handle=handle
        )
    if not graph.on_path(node_id, path):
        raise UnknownHandle(
            f"handle {handle} is not on this branch; it was rendered on another one",
            handle=handle,
        )
    return graph.nodes[node_id], part


def text_of(graph: Graph, node: Node, part: str | None, path: Path) -> str:
    """What recalling a node's part gives: a result or output; a call's input; a message's
    text; or the transcript of the thread from the node on (`path`: the branch recalled)."""
    if part == FROM:
        return transcript(graph, node, path)
    if part == INPUT:
        if node.kind != "tool":
            raise UnknownHandle(
                f"{handle_for(graph.session_id, node.id, part)} names no tool call",
                handle=handle_for(graph.session_id, node.id, part),
            )
        return input_text(node.input)
    if node.kind in ("tool", "function"):
        if not has_content(graph, node):
            handle = handle_for(graph.session_id, node.id, part)
            raise UnknownHandle(f"{handle} has no result to recall yet", handle=handle)
        return content_text(shown_content(graph, node))
    return content_text(message_blocks(node))


def message_blocks(node: Node) -> list[Any]:
    """A message's blocks as recall serves them: its text and images, its thinking as text."""
    out: list[Any] = []
    for block in node.content if isinstance(node.content, list) else []:
        kind = block.get("type") if isinstance(block, dict) else None
        if kind == "thinking":
            out.append({"type": "text", "text": f"[thinking]\n{block.get('thinking', '')}"})
        elif kind != "redacted_thinking":
            out.append(block)
    return out


def input_text(value: Any) -> str:
    """A tool call's input, readable: each argument on its own line, a long or multi-line
    string verbatim below its name."""
    if not isinstance(value, dict):
        return value if isinstance(value, str) else orjson.dumps(value).decode()
    lines = []
    for key, arg in value.items():
        if isinstance(arg, str) and ("\n" in arg or len(arg) > 200):
            lines.append(f"{key}:\n{arg}")
        else:
            shown = arg if isinstance(arg, str) else orjson.dumps(arg).decode()
            lines.append(f"{key}: {shown}")
    return "\n".join(lines)


def transcript(graph: Graph, node: Node, path: Path) -> str:
    """The thread from `node` to its head: each message under a header naming its role and
    node, its words verbatim, and below it each call with its result's handle (and its
    input's, when the input holds long strings)."""
    sid = graph.session_id
    out = []
    for node_id in _thread_from(graph, node, path):
        message = graph.nodes[node_id]
        role = "user (meta)" if message.kind == "user" and message.meta else message.kind
        out.append(f"── {role} {node_id} ──")
        text = content_text(message_blocks(message))
        if text:
            out.append(text)
        for call in graph.calls_of(message):
            line = (
                range_entries(graph, [node_id], only=call.id)[0]
                if has_content(graph, call)
                else f"{handle_for(sid, call.id)} {call.name} (no result yet)"
            )
            if call.kind == "tool" and has_long_strings(call.input, INPUT_NOTE_CHARS):
                line += f"; its input: {handle_for(sid, call.id, INPUT)}"
            out.append(f"→ {line}")
    return "\n".join(out)


def _thread_from(graph: Graph, node: Node, path: Path) -> list[str]:
    """The ids of `node`'s thread from it to the head (a function's own thread, else `path`)."""
    thread = graph.function_path(node.owner) if node.owner else path
    return thread.ids[thread.index(node.id) :] if node.id in thread else [node.id]


def range_sources(graph: Graph, node: Node, path: Path) -> Iterator[tuple[str, str]]:
    """What a search of a transcript handle looks in, in order, each by the handle that reads
    it whole: the transcript, then every tool result of those turns and every call input that
    holds long strings — a name the agent read in a summarized range is one search away, not a
    page of the transcript and then a page of the result."""
    sid = graph.session_id
    yield handle_for(sid, node.id, FROM), transcript(graph, node, path)
    for node_id in _thread_from(graph, node, path):
        for call in graph.calls_of(graph.nodes[node_id]):
            if has_content(graph, call):
                yield handle_for(sid, call.id), content_text(shown_content(graph, call))
            if call.kind == "tool" and has_long_strings(call.input, INPUT_NOTE_CHARS):
                yield handle_for(sid, call.id, INPUT), input_text(call.input)


def recall(
    graph: Graph,
    handle: str,
    path: Path,
    max_chars: int,
    start_line: int | None = None,
    end_line: int | None = None,
    search: Search | None = None,
) -> Recalled:
    """Lines `start_line..end_line` of what `handle` stands for, whole lines up to
    `max_chars` characters (a first line longer than that is cut) — or, with `search`, the
    lines among them that match it."""
    node, part = resolve(graph, handle, path)
    if search is not None and part == FROM and start_line is None and end_line is None:
        return search_range(graph, node, path, search, max_chars)
    text = text_of(graph, node, part, path)
    if search is not None:
        return search_lines(text, search, max_chars, start_line, end_line)
    return page(text, max_chars, start_line, end_line)


def page(
    text: str, max_chars: int, start_line: int | None = None, end_line: int | None = None
) -> Recalled:
    """Lines `start_line..end_line` of `text`, whole lines up to `max_chars` characters."""
    starts = line_starts(text)
    total = len(starts)
    first, last = _range(total, start_line, end_line)
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


def _range(total: int, start_line: int | None, end_line: int | None) -> tuple[int, int]:
    first = 1 if start_line is None else start_line
    last = total if end_line is None else min(end_line, total)
    if first < 1 or first > total:
        raise InvalidContent(
            f"startLine must be between 1 and {total} (the content has {total} lines)",
            field="startLine",
        )
    if last < first:
        raise InvalidContent("endLine must not be before startLine", field="endLine")
    return first, last


# ---- search -----------------------------------------------------------------------------------


def _options() -> Any:
    options = re2.Options()
    options.log_errors = False  # a bad pattern is the model's mistake, answered, not logged
    return options


_RE2_OPTIONS = _options()


@attrs.frozen
class Search:
    """What a recall looks for: `pattern`, plain text or (`regex`) an RE2 expression, and how
    many lines of `context` to show around each match. Checked and compiled when made, so a
    search compactd will not run is refused before anything is read."""

    pattern: str
    regex: bool = False
    context: int = SEARCH_CONTEXT
    # the pattern, and the same wrapped to match once per line at the pattern's first match
    # (group 1), taking the rest of the line: one match per line, however dense
    bare: Any = attrs.field(init=False, eq=False, repr=False)
    per_line: Any = attrs.field(init=False, eq=False, repr=False)

    def __attrs_post_init__(self) -> None:
        if not self.pattern:
            raise InvalidSearch("search must not be empty", field="search")
        if len(self.pattern) > SEARCH_MAX_CHARS:
            raise InvalidSearch(
                f"search is {len(self.pattern):,} characters; at most {SEARCH_MAX_CHARS} are "
                "searched for",
                field="search",
            )
        if not 0 <= self.context <= SEARCH_CONTEXT_MAX:
            raise InvalidSearch(
                f"context must be between 0 and {SEARCH_CONTEXT_MAX}", field="context"
            )
        pattern = self.pattern if self.regex else re2.escape(self.pattern)
        try:
            bare = re2.compile(pattern, _RE2_OPTIONS)
            per_line = re2.compile(f"(?m)^[^\\n]*?({pattern})[^\\n]*", _RE2_OPTIONS)
        except re2.error as exc:
            why = exc.args[0] if exc.args else exc
            why = why.decode(errors="replace") if isinstance(why, bytes) else str(why)
            raise InvalidSearch(
                f"search is not a regular expression RE2 runs ({why}); RE2 has no "
                "backreferences or lookaround and repeats at most 1,000 times — or search "
                "for it as plain text (regex: false)",
                field="search",
            ) from None
        object.__setattr__(self, "bare", bare)
        object.__setattr__(self, "per_line", per_line)

    @classmethod
    def of(cls, pattern: Any, regex: Any = None, context: Any = None) -> Search | None:
        """A search from the wire (the tool call's input, the RPC's params); None without a
        pattern. Values of the wrong type are refused as the search they spoil."""
        if pattern is None:
            return None
        if not isinstance(pattern, str):
            raise InvalidSearch("search must be a string", field="search")
        if regex is not None and not isinstance(regex, bool):
            raise InvalidSearch("regex must be true or false", field="regex")
        if context is not None and (not isinstance(context, int) or isinstance(context, bool)):
            raise InvalidSearch("context must be a whole number", field="context")
        return cls(pattern, bool(regex), SEARCH_CONTEXT if context is None else context)


def matching_lines(
    text: str, starts: list[int], search: Search, first: int, last: int
) -> list[int]:
    """The lines (1-based, between `first` and `last`) that hold a match. A line longer than
    `LINE_WIDTH` counts as several (as recall numbers them); each of them is searched."""
    begin = starts[first - 1]
    end = starts[last] if last < len(starts) else len(text)
    found: list[int] = []
    if not search.regex:
        at = text.find(search.pattern, begin, end)
        while at != -1:
            line = bisect_right(starts, at)
            found.append(line)
            resume = starts[line] if line < len(starts) else end
            at = text.find(search.pattern, max(resume, at + 1), end) if resume < end else -1
        return found
    bare = search.bare
    bounds = [*starts, len(text)]
    for match in search.per_line.finditer(text, begin, end):
        line = bisect_right(starts, match.start(1))
        found.append(line)
        # the rest of a long line, past the recall line the first match is on
        stop = match.end()
        nxt = line + 1
        while nxt <= last and bounds[nxt - 1] < stop:
            if bare.search(text[bounds[nxt - 1] : bounds[nxt]]):
                found.append(nxt)
            nxt += 1
    return found


def search_lines(
    text: str,
    search: Search,
    max_chars: int,
    start_line: int | None = None,
    end_line: int | None = None,
) -> Recalled:
    """The lines of `text` (between `start_line` and `end_line`) that match `search`, each with
    its number and `search.context` lines around it, as grep prints them (`12:` a match,
    `11-` context, `--` between groups) — whole lines up to `max_chars` characters, after a
    line that says how many matched. A cut answer ends at its last shown line
    (`end_line`): the same search from the next line goes on."""
    starts = line_starts(text)
    total = len(starts)
    first, last = _range(total, start_line, end_line)
    hits = matching_lines(text, starts, search, first, last)
    what = f"the {'regex' if search.regex else 'text'} “{search.pattern}”"
    scope = f"lines {first}–{last} of {total}"
    if not hits:
        none = f"[compactd: no line matches {what} ({scope})]"
        return Recalled(none, total, first, last, False, 0)
    head = f"[compactd: {len(hits)} line{'s' * (len(hits) != 1)} match {what} ({scope})]"
    out = [head]
    pieces, shown_to, cut = _numbered(
        text, starts, hits, search.context, first, last, max_chars - len(head)
    )
    out.extend(pieces)
    if cut:
        return Recalled("\n".join(out), total, first, shown_to, True, len(hits))
    return Recalled("\n".join(out), total, first, last, False, len(hits))


def _numbered(
    text: str,
    starts: list[int],
    hits: list[int],
    context: int,
    first: int,
    last: int,
    room: int,
) -> tuple[list[str], int, bool]:
    """The matching lines with their context, numbered as grep prints them, in at most `room`
    characters (each line's newline counted): the lines, the last line shown, and whether
    some did not fit (when not even the first match fits, it is cut to fit)."""
    bounds = [*starts, len(text)]
    hit_set = set(hits)
    out: list[str] = []
    used = 0
    shown_to = first - 1  # the last line the answer shows

    def numbered(n: int) -> str:
        return f"{n}{':' if n in hit_set else '-'}{text[bounds[n - 1] : bounds[n]].rstrip(chr(10))}"

    for index, group in enumerate(_groups(hits, context, first, last)):
        for n in group:
            line = numbered(n)
            piece = f"--\n{line}" if n == group[0] and index else line
            if used + 1 + len(piece) > room:
                if shown_to < first:  # not even one line fits: the first match, cut to fit
                    shown_to = hits[0]
                    out.append(numbered(shown_to)[: max(0, room - used - 1)])
                return out, shown_to, True
            out.append(piece)
            used += 1 + len(piece)
            shown_to = n
    return out, shown_to, False


def search_range(graph: Graph, node: Node, path: Path, search: Search, max_chars: int) -> Recalled:
    """A search of a transcript handle: the matching lines of the transcript and of each tool
    result and long input it names (`range_sources`), under the handle of each, numbered as
    that handle pages them. What does not fit in `max_chars` is named by handle and count, to
    be searched there."""
    what = f"the {'regex' if search.regex else 'text'} “{search.pattern}”"
    found: list[tuple[str, str, list[int], list[int]]] = []
    sources = lines = 0
    for handle, text in range_sources(graph, node, path):
        sources += 1
        starts = line_starts(text)
        lines = lines or len(starts)  # the transcript's, as its handle pages it
        if not starts:
            continue
        hits = matching_lines(text, starts, search, 1, len(starts))
        if hits:
            found.append((handle, text, starts, hits))
    total = sum(len(hits) for *_, hits in found)
    scope = f"these turns and the {sources - 1} tool results and inputs they name"
    if not found:
        return Recalled(f"[compactd: no line matches {what} in {scope}]", lines, 1, lines, False, 0)
    head = (
        f"[compactd: {total} line{'s' * (total != 1)} match {what} in {scope}; "
        "each under the handle that reads it, numbered as that handle pages it]"
    )
    out = [head]
    room = max_chars - len(head) - 200  # the closing note's room
    rest: list[str] = []
    for handle, text, starts, hits in found:
        title = f"── {handle} ──"
        if rest or room < len(title) + 2:
            rest.append(f"{handle} ({len(hits)})")
            continue
        pieces, shown_to, cut = _numbered(
            text, starts, hits, search.context, 1, len(starts), room - len(title) - 1
        )
        if not pieces or (cut and shown_to < hits[0]):
            rest.append(f"{handle} ({len(hits)})")
            continue
        out.append(title)
        out.extend(pieces)
        room -= len(title) + 1 + sum(len(p) + 1 for p in pieces)
        if cut:
            more = sum(1 for h in hits if h > shown_to)
            rest.append(f"{handle} from line {shown_to + 1} ({more})")
    if rest:
        out.append(_more_matches(rest, max_chars - len("\n".join(out)) - 1))
    return Recalled("\n".join(out)[:max_chars], lines, 1, lines, False, total)


def _more_matches(rest: list[str], room: int) -> str:
    """The closing note of a range search cut short: as many of the sources left as fit in
    `room` characters, then how many more."""
    listed: list[str] = []
    for i, item in enumerate(rest):
        more = len(rest) - i - 1
        tail = f" and {more} more" if more else ""
        note = f"[compactd: more matches: {', '.join([*listed, item])}{tail}; search those handles]"
        if len(note) > room and listed:
            break
        listed.append(item)
    left = len(rest) - len(listed)
    tail = f" and {left} more" if left else ""
    return f"[compactd: more matches: {', '.join(listed)}{tail}; search those handles]"


def _groups(hits: list[int], context: int, first: int, last: int) -> list[list[int]]:
    """Runs of lines to show: each match with `context` lines either side, overlapping or
    touching runs merged."""
    groups: list[list[int]] = []
    for hit in hits:
        lo, hi = max(first, hit - context), min(last, hit + context)
        if groups and lo <= groups[-1][-1] + 1:
            groups[-1].extend(range(groups[-1][-1] + 1, hi + 1))
        else:
            groups.append(list(range(lo, hi + 1)))
    return groups


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
