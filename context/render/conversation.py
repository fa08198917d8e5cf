"""The provider-neutral conversation a render produces (DESIGN §3 steps 1–4).

Walks the viewer's thread turn by turn, applies the projection of the records (summary,
collapses, snips, clears, evidence), Budget Reduction on every tool result, and emits
messages of `Part`s: an Anthropic-shaped block, its token category and its token count.
Each formatter sends exactly these parts and measure sums exactly these counts, so the panel
and the request cannot disagree. Parts are memoized on their node, so a warm render only
assembles and a node is tokenized once.
"""

from __future__ import annotations

from collections.abc import Collection
from typing import Any

import attrs

from ..blocks import shorten_input
from ..budget_reduction import middle_truncate, truncate_result
from ..errors import PendingToolResults
from ..graph import Graph, Node, Path
from ..policy import (
    CLEARED_PLACEHOLDER,
    HIDDEN_OUTPUT_PLACEHOLDER,
    NO_RESULT_PLACEHOLDER,
    RUNNING_FUNCTION_PLACEHOLDER,
    SUMMARY_LAST_ASSISTANT_CHARS,
    Policy,
)
from ..projection import COLLAPSE as COLLAPSE_KIND
from ..projection import SNIP as SNIP_KIND
from ..projection import SUMMARY as SUMMARY_KIND
from ..projection import Projection, hidden_runs
from ..recall import CUT, FROM, INPUT, cleared_note, handle_for, range_entries, range_note
from ..superseded import placeholder as superseded_placeholder
from ..tokens import BLOCK_OVERHEAD, MESSAGE_OVERHEAD, Counter
from ..visibility import View

# token categories of the context panel
SYSTEM = "system"
TOOLS = "tools"
SCHEMA = "schema"
USER = "user"
ASSISTANT = "assistant"
THINKING = "thinking"
TOOL_CALLS = "tool_calls"
TOOL_RESULTS = "tool_results"
MARKERS = "markers"  # summaries, collapse/snip markers, placeholders
OUTPUT_RESERVE = "output_reserve"
FREE = "free"
CONVERSATION_CATEGORIES = (USER, ASSISTANT, THINKING, TOOL_CALLS, TOOL_RESULTS, MARKERS)
ALL_CATEGORIES = (SYSTEM, TOOLS, SCHEMA, *CONVERSATION_CATEGORIES, OUTPUT_RESERVE, FREE)

_BLOCK_CATEGORY = {
    "text": ASSISTANT,
    "thinking": THINKING,
    "redacted_thinking": THINKING,
    "tool_use": TOOL_CALLS,
}


@attrs.define(slots=True)
class Part:
    block: dict[str, Any]
    category: str
    tokens: int
    node: str | None = None  # the node it came from (tool results: the tool node)
    # tokens of the text a formatter sends instead of `block` (OpenAI: a block-list result or
    # a document), memoized here because parts are cached on their node
    alt_tokens: int | None = None


@attrs.define(slots=True)
class Message:
    role: str
    parts: list[Part]
    turn: int  # index of the turn in the viewer's own thread; -1 for the caller prefix
    kind: str = "turn"  # "turn" | "summary" | "collapse" | "snip" | "caller"

    @property
    def tokens(self) -> int:
        return MESSAGE_OVERHEAD + sum(p.tokens for p in self.parts)


@attrs.define
class Conversation:
    messages: list[Message]
    turns_total: int = 0  # turns on the own thread
    turns_shown: int = 0  # turns rendered in full

    @property
    def tokens(self) -> int:
        return sum(m.tokens for m in self.messages)


def summary_marker(
    data: dict[str, Any],
    turns: int,
    last_chars: int = SUMMARY_LAST_ASSISTANT_CHARS,
    last_handle: str | None = None,
) -> str:
    """The rolling summary as the model sees it: the provider's checkpoint, then — unless the
    checkpoint already quotes them — every user request it replaced, verbatim, and the latest
    assistant text before the cut (the checkpoint rules of the spec's final table), its first
    and last characters when it is over `last_chars` (with recall, the note names
    `last_handle`, which returns it whole). A summary inside a turn stands right after that
    turn's request, for the work done on it so far."""
    text = data.get("text", "")
    replaced = f"{turns} turn{'s' if turns != 1 else ''}"
    if data.get("through"):
        before = f" and of the {replaced} before it" if turns else ""
        what = (
            f"[compactd: summary of the work so far on the request above{before}; the newest "
            "steps follow verbatim, the originals are kept in the session graph]"
        )
    else:
        what = (
            f"[compactd: summary of the earlier conversation ({replaced}"
            " replaced; the originals are kept in the session graph)]"
        )
    out = [what, text]
    missing = [r for r in data.get("userRequests") or [] if r not in text]
    if missing:
        out.append("[the user's requests in that part, verbatim]")
        out.extend(f"- {r}" for r in missing)
    last = data.get("lastAssistant")
    if last and last not in text:
        kept = last_assistant_kept(last, last_chars, last_handle)
        out.append(
            "[the assistant's last message in that part, verbatim]"
            if kept == last
            else "[the assistant's last message in that part, its beginning and its end]"
        )
        out.append(kept)
    media = data.get("media") or []
    if media:
        names = ", ".join(_media_label(m) for m in media)
        if data.get("mediaDropped"):
            out.append(
                f"[images and documents of that part that the window cannot hold: {names}; "
                "the originals are kept in the session graph]"
            )
        else:
            out.append(f"[images and documents of that part, kept verbatim below: {names}]")
    return "\n\n".join(out)


def last_assistant_kept(text: str, max_chars: int, handle: str | None = None) -> str:
    """What a summary marker keeps of the last assistant text: all of it up to `max_chars`,
    else its head and tail (60/40) around Budget Reduction's note."""
    return middle_truncate(text, max_chars, max_chars * 6 // 10, max_chars * 4 // 10, handle)


def _media_label(ref: dict[str, Any]) -> str:
    where = f"returned by {ref['toolUseId']}" if ref.get("toolUseId") else "from the user"
    return f"{ref.get('name', ref.get('kind', 'media'))} ({where})"


def collapse_marker(text: str, turns: int) -> str:
    return (
        f"[compactd: {turns} turn{'s' if turns != 1 else ''} collapsed into this summary; the "
        "originals are kept and can be restored]\n\n" + text
    )


def snip_marker(turns: int) -> str:
    return (
        f"[compactd: {turns} earlier turn{'s' if turns != 1 else ''} removed here to fit the "
        "context window; the originals are kept in the session graph]"
    )


class _Builder:
    def __init__(
        self, graph: Graph, view: View, policy: Policy, counter: Counter, recall: bool = False
    ) -> None:
        self.graph = graph
        self.recall = recall
        self.view = view
        self.policy = policy
        self.counter = counter
        self.input_chars = policy.microcompact_input_chars
        self.trunc = (
            policy.max_tool_result_chars,
            policy.truncate_head_chars,
            policy.truncate_tail_chars,
        )
        self.messages: list[Message] = []

    # -- message assembly ---------------------------------------------------------------

    def emit(self, role: str, parts: list[Part], turn: int, kind: str = "turn") -> None:
        """Add parts; they join the previous message only within the same turn (formatters
        merge same-role neighbours on the wire), so every message knows its turn and kind."""
        if not parts:
            return
        last = self.messages[-1] if self.messages else None
        if (
            last is not None
            and last.role == role
            and last.turn == turn
            and last.kind == kind == "turn"
        ):
            last.parts.extend(parts)
        else:
            self.messages.append(Message(role, list(parts), turn, kind))

    def marker(self, text: str, turn: int, kind: str) -> None:
        block = {"type": "text", "text": text}
        # memoized by value: a marker is rebuilt on every render but its text only changes
        # with the records, so a summary is not tokenized again and again
        tokens = self.counter.request_text(text) + BLOCK_OVERHEAD
        self.emit("user", [Part(block, MARKERS, tokens)], turn, kind)

    # -- threads ------------------------------------------------------------------------

    def handle(self, node_id: str, part: str | None = None) -> str | None:
        """The recall handle of (a part of) a node's content, when the request carries the
        recall tool."""
        return handle_for(self.graph.session_id, node_id, part) if self.recall else None

    def range_note(self, node_ids: list[str]) -> str:
        """The handles of a removed range: its transcript's and its tool results' (empty
        without recall)."""
        if not self.recall or not node_ids:
            return ""
        entries = range_entries(self.graph, node_ids)
        return range_note(
            entries,
            handle_for(self.graph.session_id, node_ids[0], FROM),
            self.policy.recall_list_max,
        )

    def thread(self, path: Path, proj: Projection, own: bool) -> tuple[int, int]:
        ids = path.line.ids
        bounds = path.turn_bounds()
        hidden = self.hidden_ranges(path, proj) if self.recall else {}
        snip_nodes: list[str] = []
        # a summary inside a turn stands in that turn, after its request; else before the
        # first turn it replaces
        inside = proj.summary_through if proj.summary is not None else None
        summary_done = False
        snip_run = 0
        shown_collapses: set[str] = set()
        shown = 0
        head_id = ids[path.length - 1] if path.length else None
        summary_nodes = hidden.get("summary", [])
        # hidden turns come in runs (a long snipped prefix is one step, not thousands)
        at = 0
        for first, end, kind in (*hidden_runs(proj, path), (len(bounds), len(bounds), "")):
            for index in range(at, first):
                turn_no = index if own else -1
                if snip_run:
                    note = self.range_note(snip_nodes)
                    self.marker(snip_marker(snip_run) + note, turn_no, "snip")
                    snip_run = 0
                    snip_nodes = []
                shown += 1
                start = bounds[index][0]
                self.turn(
                    path,
                    proj,
                    bounds[index],
                    turn_no,
                    inside,
                    head_id if own else None,
                    summary_nodes,
                )
                if inside is not None and inside[0] == ids[start]:
                    summary_done = True
            if kind == SUMMARY_KIND:
                if not summary_done and proj.summary is not None and inside is None:
                    self.summary(proj, first if own else -1, summary_nodes)
                    summary_done = True
            elif kind == SNIP_KIND:
                snip_run += end - first
                if self.recall:  # the run's nodes, for the marker's note (one slice)
                    snip_nodes.extend(ids[bounds[first][0] : bounds[end - 1][1]])
            elif kind == COLLAPSE_KIND:
                for index in range(first, end):
                    turn_no = index if own else -1
                    if snip_run:
                        note = self.range_note(snip_nodes)
                        self.marker(snip_marker(snip_run) + note, turn_no, "snip")
                        snip_run = 0
                        snip_nodes = []
                    collapse = proj.collapsed[ids[bounds[index][0]]]
                    if collapse.id not in shown_collapses:
                        shown_collapses.add(collapse.id)
                        self.marker(
                            collapse_marker(
                                collapse.data.get("text", ""), len(collapse.data.get("turns", []))
                            )
                            + self.range_note(hidden.get(collapse.id, [])),
                            turn_no,
                            "collapse",
                        )
            at = max(at, end)
        if snip_run:
            self.marker(snip_marker(snip_run) + self.range_note(snip_nodes), len(bounds), "snip")
        return len(bounds), shown

    def turn(
        self,
        path: Path,
        proj: Projection,
        bounds: tuple[int, int],
        turn_no: int,
        inside: tuple[str, str] | None,
        head_id: str | None,
        summary_nodes: list[str],
    ) -> None:
        """One turn shown in full (after its request, the summary of its earlier part when a
        summary cuts inside it). `head_id`: the path's head on the viewer's own thread."""
        ids = path.line.ids
        start, end = bounds
        start_id = ids[start]
        nodes = ids[start:end]
        if inside is not None and inside[0] == start_id:
            first = self.graph.nodes[start_id]
            if first.kind == "user":  # the request stays, before the work done on it
                self.emit("user", self.user_parts(first), turn_no)
            self.summary(proj, turn_no, summary_nodes)
            nodes = ids[path.index(inside[1]) + 1 : end]
        for node_id in nodes:
            node = self.graph.nodes[node_id]
            if node.kind == "user":
                self.emit("user", self.user_parts(node), turn_no)
            else:
                self.emit("assistant", self.assistant_parts(node, proj), turn_no)
                if node.calls:
                    at_head = node_id == head_id
                    self.emit("user", self.result_parts(node, proj, at_head), turn_no)

    def summary(self, proj: Projection, turn: int, nodes: list[str] | None = None) -> None:
        assert proj.summary is not None
        data = proj.summary.data
        last = data.get("lastAssistantNode")
        text = summary_marker(
            data,
            len(proj.summary_turns),
            self.policy.summary_last_assistant_chars,
            self.handle(last) if isinstance(last, str) and last in self.graph.nodes else None,
        )
        self.marker(text + self.range_note(nodes or []), turn, "summary")
        if not data.get("mediaDropped"):
            self.emit("user", self.media_parts(data.get("media") or []), turn, "summary")

    def media_parts(self, refs: list[dict[str, Any]]) -> list[Part]:
        """The images and documents a summary replaced the turns of, from their nodes: the
        checkpoint never discards multimodal content (spec, final table)."""
        parts = []
        for ref in refs:
            node = self.graph.nodes.get(ref.get("node") or "")
            if node is None:
                continue
            source = node.result if node.kind == "tool" else node.content
            index = ref.get("block", -1)
            if not isinstance(source, list) or not 0 <= index < len(source):
                continue
            block = source[index]
            category = TOOL_RESULTS if node.kind == "tool" else USER
            parts.append(Part(block, category, self.counter.block(block), node.id))
        return parts

    def hidden_ranges(self, path: Path, proj: Projection) -> dict[str, list[str]]:
        """The thread nodes behind each summary (key "summary") and collapse (its record
        id) on this thread, so a marker can name their results before its turns are walked."""
        ids = path.line.ids
        out: dict[str, list[str]] = {}
        inside = proj.summary_through if proj.summary is not None else None
        for start, end in path.turn_bounds():
            start_id = ids[start]
            if start_id in proj.summary_turns:
                out.setdefault("summary", []).extend(ids[start:end])
            elif start_id in proj.collapsed and start_id not in proj.snipped:
                out.setdefault(proj.collapsed[start_id].id, []).extend(ids[start:end])
            if inside is not None and inside[0] == start_id:
                out.setdefault("summary", []).extend(ids[start + 1 : path.index(inside[1]) + 1])
        return out

    # -- nodes --------------------------------------------------------------------------

    def user_parts(self, node: Node) -> list[Part]:
        parts = node.cache.get("p")
        if parts is None:
            parts = [Part(b, USER, self.counter.block(b), node.id) for b in node.content]
            node.cache["p"] = parts
        return parts

    def assistant_parts(self, node: Node, proj: Projection) -> list[Part]:
        """The assistant message: its own blocks with its calls back at their positions.
        Each part is memoized on its node, per variant (a call whose long inputs a Tier 1
        clear shortened is a variant), so nothing is tokenized twice."""
        content = node.cache.get("c")
        if content is None:
            content = [
                Part(b, _BLOCK_CATEGORY.get(b["type"], ASSISTANT), self.counter.block(b), node.id)
                for b in node.content
            ]
            node.cache["c"] = content
        if not node.calls:
            return content
        parts = list(content)
        tail = []
        for call in self.graph.calls_of(node):
            part = self.call_part(call, call.id in proj.cleared_inputs)
            if call.kind == "tool" and call.index is not None and call.index <= len(parts):
                parts.insert(call.index, part)
            else:
                tail.append(part)
        parts.extend(tail)
        return parts

    @staticmethod
    def call_block(call: Node) -> dict[str, Any]:
        if call.kind == "tool":
            block = {
                "type": "tool_use",
                "id": call.tool_use_id,
                "name": call.name,
                "input": call.input,
            }
            if call.extra:
                block.update(call.extra)
            return block
        # a function the model did not call as a tool: a synthetic, deterministic call
        inp = call.input if isinstance(call.input, dict) else {"input": call.input}
        return {"type": "tool_use", "id": f"fn_{call.id}", "name": call.name, "input": inp}

    def call_part(self, call: Node, shortened: bool) -> Part:
        key = ("u", shortened, self.input_chars if shortened else 0, shortened and self.recall)
        part = call.cache.get(key)
        if part is None:
            block = self.call_block(call)
            if shortened:
                handle = self.handle(call.id, INPUT)
                block["input"] = shorten_input(block["input"], self.input_chars, handle)
            part = Part(block, TOOL_CALLS, self.counter.block(block), call.id)
            call.cache[key] = part
        return part

    def result_parts(self, node: Node, proj: Projection, at_head: bool) -> list[Part]:
        parts = []
        pending = []
        for call in self.graph.calls_of(node):
            part = self.result_part(call, proj, at_head)
            if part is None:
                pending.append(call.tool_use_id)
            else:
                parts.append(part)
        if pending:
            raise PendingToolResults(
                f"cannot render: the head still waits for tool results: {', '.join(pending)}",
                pendingToolUseIds=pending,
            )
        return parts

    def result_part(self, call: Node, proj: Projection, at_head: bool) -> Part | None:
        """The result of one call as the projection shows it (memoized on the call, per
        variant); None for a call the head still waits on."""
        use_id = call.tool_use_id if call.kind == "tool" else f"fn_{call.id}"
        fn = (
            self.graph.nodes[call.function]
            if call.function
            else call
            if call.kind == "function"
            else None
        )
        if call.id in proj.evidence:
            rec = proj.evidence[call.id]
            variant: tuple[Any, ...] = ("evidence", rec.id, self.recall)
            content, is_error, cat = rec.data.get("text", ""), call.is_error, MARKERS
            if self.recall:
                content += (
                    f"\n[compactd_recall with handle {self.handle(call.id)} returns the "
                    "original result]"
                )
        elif call.id in proj.cleared:
            why = proj.superseded.get(call.id)
            variant = ("cleared", self.recall, why)
            content = superseded_placeholder(why) if why else CLEARED_PLACEHOLDER
            is_error, cat = call.is_error, MARKERS
            if self.recall:
                content = cleared_note(self.handle(call.id) or "", call.result, why)
        elif fn is not None:
            mode = self.view.expose_mode(fn)
            variant = ("fn", fn.status, mode, fn.result_seq, self.trunc, self.recall)
            content, is_error, cat = None, fn.is_error, TOOL_RESULTS
        elif not call.answered:
            if at_head and call.id not in proj.abandoned:
                return None
            variant = ("none",)
            content, is_error, cat = NO_RESULT_PLACEHOLDER, True, MARKERS
        else:
            variant = ("raw", call.result_seq, self.trunc, self.recall)
            content, is_error, cat = None, call.is_error, TOOL_RESULTS
        key = ("r", variant)
        part = call.cache.get(key)
        if part is None:
            if content is None:
                content = (
                    self.function_content(fn, variant[2], self.handle(call.id, CUT))
                    if fn is not None
                    else truncate_result(call.result, *self.trunc, self.handle(call.id, CUT))
                )
            block: dict[str, Any] = {
                "type": "tool_result",
                "tool_use_id": use_id,
                "content": content,
            }
            if is_error:
                block["is_error"] = True
            part = Part(block, cat, self.counter.block(block), call.id)
            call.cache[key] = part
        return part

    def function_content(self, fn: Node, mode: str, handle: str | None = None) -> Any:
        if fn.status == "running":
            return RUNNING_FUNCTION_PLACEHOLDER
        if mode == "none":
            return HIDDEN_OUTPUT_PLACEHOLDER
        output = truncate_result(fn.result if fn.result is not None else "", *self.trunc, handle)
        if mode != "full":
            return output
        text = (
            output
            if isinstance(output, str)
            else "\n".join(b.get("text", "") for b in output if b.get("type") == "text")
        )
        return f"{text}\n\n[internal transcript of {fn.name}]\n{self.transcript(fn)}"

    def transcript(self, fn: Node) -> str:
        """A function's internal thread as plain text (for `expose="full"`)."""
        lines = []
        for node_id in self.graph.function_path(fn.id).ids:
            node = self.graph.nodes[node_id]
            for block in node.content:
                if block.get("type") == "text":
                    lines.append(f"{node.kind}: {block['text']}")
            for call in self.graph.calls_of(node):
                if call.kind == "tool":
                    result = truncate_result(
                        call.result if call.answered else NO_RESULT_PLACEHOLDER,
                        *self.trunc,
                        self.handle(call.id, CUT) if call.answered else None,
                    )
                    if not isinstance(result, str):
                        result = "\n".join(
                            b.get("text", "") for b in result if b.get("type") == "text"
                        )
                    lines.append(f"tool {call.name}({_short(call.input)}) -> {result}")
        return "\n".join(lines)


def _short(value: Any, limit: int = 200) -> str:
    import orjson

    text = orjson.dumps(value).decode()
    return text if len(text) <= limit else text[:limit] + "…"


def seen_conversation(
    graph: Graph,
    view: View,
    sent: Conversation,
    cleared: tuple[Collection[str], Collection[str]],
    seen_proj: Projection,
    policy: Policy,
    counter: Counter,
    recall: bool = False,
) -> Conversation:
    """The conversation the model sees once the provider applied Tier 1's server-side clears,
    from the one as sent: the same messages, with the parts of those calls (their results,
    their long inputs) swapped for what a build from `seen_proj` would emit — a render on the
    server path walks the thread once, not twice."""
    builder = _Builder(graph, view, policy, counter, recall)
    results, inputs = cleared  # the tool nodes whose results, and whose inputs, are cleared
    nodes = graph.nodes
    messages = []
    for msg in sent.messages:
        swapped: list[Part] | None = None
        if msg.kind != "caller":  # the caller's prefix has a projection of its own
            for i, part in enumerate(msg.parts):
                node = part.node
                if node is None or (node not in results and node not in inputs):
                    continue
                kind = part.block.get("type")
                new: Part | None = part
                if kind == "tool_result" and node in results:
                    new = builder.result_part(nodes[node], seen_proj, at_head=False)
                elif kind == "tool_use" and node in inputs:
                    new = builder.call_part(nodes[node], node in seen_proj.cleared_inputs)
                if new is not None and new is not part:
                    if swapped is None:
                        swapped = list(msg.parts)
                    swapped[i] = new
        messages.append(msg if swapped is None else Message(msg.role, swapped, msg.turn, msg.kind))
    return Conversation(messages, sent.turns_total, sent.turns_shown)


def build_conversation(
    graph: Graph,
    view: View,
    own: Projection,
    caller: Projection | None,
    policy: Policy,
    counter: Counter,
    recall: bool = False,
) -> Conversation:
    builder = _Builder(graph, view, policy, counter, recall)
    if view.caller is not None and caller is not None:
        builder.thread(view.caller, caller, own=False)
        for msg in builder.messages:
            msg.kind = "caller"
    total, shown = builder.thread(view.own, own, own=True)
    return Conversation(builder.messages, total, shown)
