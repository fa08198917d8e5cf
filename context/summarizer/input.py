"""The summarizer's input: a range of whole turns, as the request rendered them.

The input starts at the range's first message and holds the prior summary that applies to
this branch with every user request it replaced (verbatim: a chain of summaries must not
leave the user's words to a paraphrase), every original user request (also of snipped turns)
and every visible tool result as rendered; `Range.covers` and the input describe the same
range (the spec's rolling-summary constraints). A line longer than one chunk of the smallest
size is split, so chunked generation can always make progress.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from typing import Any

import attrs
import orjson

from ..budget_reduction import middle_truncate
from ..graph import Graph, Path
from ..projection import Projection, thread_index
from ..render.conversation import Conversation
from ..tokens import Counter
from ..turns import Turn

MIN_CHUNK_TOKENS = 2000
LINE_PIECE_TOKENS = MIN_CHUNK_TOKENS * 3 // 4  # a chunk of the smallest size takes any piece
TOOL_INPUT_CHARS = 2000  # tool inputs in summarizer input are middle-truncated like results


@attrs.frozen
class Range:
    """What one summary replaces: whole turns, and maybe the earlier part of the next one."""

    turns: list[Turn]  # every whole turn replaced, oldest first
    new_turns: list[Turn]  # those not already wholly under the prior summary
    covers: list[str]
    partial: Turn | None = None  # a turn replaced through `through` (its request stays)
    through: int | None = None  # path index of the last node of `partial` replaced


@attrs.frozen
class SummaryInput:
    lines: list[str]
    line_tokens: list[int]
    items: list[dict[str, Any]]
    user_requests: list[str]
    last_assistant: str | None
    prior_text: str | None
    digest: str  # hash of the whole input (the source prefix)
    continued: list[bool] = attrs.field(factory=list)  # a piece of the line before it
    # images and documents of the range, named in the input and kept in the request after
    # the checkpoint: {"name", "kind", "node", "block", "toolUseId"?} (a prior summary's first)
    media: list[dict[str, Any]] = attrs.field(factory=list)
    last_assistant_node: str | None = None  # the message `last_assistant` is the text of

    @property
    def tokens(self) -> int:
        return sum(self.line_tokens)

    def text(self, lo: int = 0, hi: int | None = None) -> str:
        """Lines `lo`..`hi` as one text (pieces of a split line join back seamlessly)."""
        hi = len(self.lines) if hi is None else hi
        out: list[str] = []
        for i in range(lo, hi):
            if out and not (self.continued and self.continued[i]):
                out.append("\n")
            out.append(self.lines[i])
        return "".join(out)


def _text_of(content: Any) -> str:
    if isinstance(content, str):
        return content
    out = []
    for block in content or []:
        if block.get("type") == "text":
            out.append(block["text"])
        elif block.get("type") in MEDIA_KINDS:
            # named, not said to be kept: whether it stays is decided after the summary
            out.append(f"[{block['type']}]")
        else:
            out.append(f"[{block.get('type', 'content')}]")
    return "\n".join(out)


def user_request_texts(graph: Graph, path: Path, turn: Turn) -> list[str]:
    """The human's own words in a turn (meta content excluded)."""
    out = []
    for node_id in path.line.ids[turn.start : turn.end]:
        node = graph.nodes[node_id]
        if node.kind == "user" and not node.meta:
            text = _text_of(node.content).strip()
            if text:
                out.append(text)
    return out


def build_input(
    graph: Graph,
    path: Path,
    proj: Projection,
    conv: Conversation,
    rng: Range,
    counter: Counter,
    evidence: Mapping[str, str] | None = None,
    originals: Mapping[str, str] | None = None,
) -> SummaryInput:
    """The summarizer's input: the range from its first message, as rendered — with
    `evidence` (tool node id -> what its result showed) in place of those raw results, and
    `originals` (tool node id -> its result as the tool returned it) in place of what Budget
    Reduction left of them."""
    lines: list[str] = []
    items: list[dict[str, Any]] = []
    requests: list[str] = []
    last_assistant: str | None = None
    last_node: str | None = None
    prior_text: str | None = None
    media: list[dict[str, Any]] = []

    def describe(role: str, part: Any) -> None:
        """One part into the input; the last assistant text said so far follows it."""
        nonlocal last_assistant, last_node
        said = _describe(
            graph, role, part, lines, items, last_assistant, evidence, media, originals
        )
        if said is not last_assistant:
            last_assistant, last_node = said, part.node

    starts = {t.start_id for t in rng.turns} | ({rng.partial.start_id} if rng.partial else set())
    inside = proj.summary_through[0] if proj.summary_through else None
    if proj.summary is not None and (bool(starts & proj.summary_turns) or inside in starts):
        prior_text = proj.summary.data.get("text", "")
        earlier = list(proj.summary.data.get("userRequests", []))
        requests.extend(earlier)
        media.extend(proj.summary.data.get("media") or [])
        lines.append(f"<previous_checkpoint>\n{prior_text}\n</previous_checkpoint>")
        items.append({"type": "summary", "text": prior_text})
        # the user's own words of what the prior summary replaced, not only its paraphrase
        for text in earlier:
            lines.append(f"USER (an earlier request, verbatim): {text}")
            items.append({"type": "user", "text": text, "earlier": True})
    by_turn: dict[int, list[Any]] = {}
    for msg in conv.messages:
        if msg.turn >= 0:
            by_turn.setdefault(msg.turn, []).append(msg)
    shown_collapses: set[str] = set()
    for turn in rng.new_turns:
        asked = user_request_texts(graph, path, turn)
        requests.extend(asked)
        collapse = proj.collapsed.get(turn.start_id)
        if turn.start_id in proj.snipped:
            for text in asked:
                lines.append(f"USER: {text}")
                items.append({"type": "user", "text": text})
            lines.append("[the work of this turn was removed earlier to fit the window]")
            continue
        if collapse is not None:
            for text in asked:
                lines.append(f"USER: {text}")
                items.append({"type": "user", "text": text})
            if collapse.id not in shown_collapses:
                shown_collapses.add(collapse.id)
                text = collapse.data.get("text", "")
                lines.append(f"<segment_summary>\n{text}\n</segment_summary>")
                items.append({"type": "summary", "text": text})
            continue
        for msg in by_turn.get(turn.index, []):
            if msg.kind != "turn":
                continue
            for part in msg.parts:
                describe(msg.role, part)
    if rng.partial is not None and rng.through is not None:
        # the turn's request stays verbatim in the request: here it is context for the work on
        # it so far (what the summary replaces), not one of the requests the summary quotes
        request = graph.nodes[rng.partial.start_id]
        if request.kind == "user":
            lines.append(f"USER (kept verbatim after this summary): {_text_of(request.content)}")
        for msg in by_turn.get(rng.partial.index, []):
            if msg.kind != "turn":
                continue
            for part in msg.parts:
                at = thread_index(graph, part.node, path) if part.node else None
                if at is not None and rng.partial.start < at <= rng.through:
                    describe(msg.role, part)
    digest = hashlib.sha256("\n".join(lines).encode()).hexdigest()
    pieces = [(i > 0, p) for line in lines for i, p in enumerate(_split_line(line, counter))]
    return SummaryInput(
        [p for _, (p, _) in pieces],
        [t for _, (_, t) in pieces],
        items,
        requests,
        last_assistant,
        prior_text,
        digest,
        [cont for cont, _ in pieces],
        media,
        last_node,
    )


def _split_line(line: str, counter: Counter) -> list[tuple[str, int]]:
    """A line longer than `LINE_PIECE_TOKENS` (one huge message) in pieces, so chunking —
    and a retry with smaller chunks — can always make progress."""
    tokens = counter.text(line)
    if tokens <= LINE_PIECE_TOKENS:
        return [(line, tokens)]
    parts = -(-tokens // LINE_PIECE_TOKENS)
    size = -(-len(line) // parts)
    return [
        (line[i : i + size], counter.text(line[i : i + size])) for i in range(0, len(line), size)
    ]


def _describe(
    graph: Graph,
    role: str,
    part: Any,
    lines: list[str],
    items: list[dict[str, Any]],
    last_assistant: str | None,
    evidence: Mapping[str, str] | None,
    media: list[dict[str, Any]],
    originals: Mapping[str, str] | None = None,
) -> str | None:
    block = part.block
    kind = block.get("type")
    if kind == "text":
        text = block["text"]
        if role == "user":
            lines.append(f"USER: {text}")
            items.append({"type": "user", "text": text})
        else:
            lines.append(f"ASSISTANT: {text}")
            items.append({"type": "assistant", "text": text})
            return text
    elif kind == "tool_use":
        args = middle_truncate(
            orjson.dumps(block["input"]).decode(),
            TOOL_INPUT_CHARS,
            TOOL_INPUT_CHARS * 6 // 10,
            TOOL_INPUT_CHARS * 4 // 10,
        )
        lines.append(f"TOOL CALL {block['name']} ({block['id']}): {args}")
        items.append(
            {"type": "tool", "id": block["id"], "name": block["name"], "input": block["input"]}
        )
    elif kind == "tool_result":
        flag = " [error]" if block.get("is_error") else ""
        content = block.get("content")
        if evidence and part.node in evidence:
            text = f"[tool evidence] {evidence[part.node]}"
        elif originals and part.node in originals:
            text = originals[part.node]
        elif isinstance(content, list):
            out = []
            for i, sub in enumerate(content):
                if sub.get("type") == "text":
                    out.append(sub["text"])
                elif sub.get("type") in MEDIA_KINDS:
                    ref = {"toolUseId": block["tool_use_id"]}
                    out.append(_name_media(media, sub["type"], part.node, i, ref))
                else:
                    out.append(f"[{sub.get('type', 'content')}]")
            text = "\n".join(out)
        else:
            text = _text_of(content)
        lines.append(f"TOOL RESULT ({block['tool_use_id']}){flag}: {text}")
        for item in reversed(items):
            if item.get("type") == "tool" and item.get("id") == block["tool_use_id"]:
                item["isError"] = bool(block.get("is_error"))
                item["resultChars"] = len(text)
                break
    elif kind in MEDIA_KINDS:
        node = graph.nodes.get(part.node or "")
        index = next((i for i, b in enumerate(node.content) if b is block), -1) if node else -1
        lines.append(f"{role.upper()}: {_name_media(media, kind, part.node, index, {})}")
    return last_assistant


MEDIA_KINDS = ("image", "document")


def _name_media(
    media: list[dict[str, Any]], kind: str, node: str | None, block: int, extra: dict[str, Any]
) -> str:
    """Name an image or document of the range (`image #2`), remember where it is, and say in
    the input that it stays in the request — never a bare "[image]"."""
    name = f"{kind} #{len(media) + 1}"
    media.append({"name": name, "kind": kind, "node": node, "block": block, **extra})
    return f"[{name}: kept in the request after the checkpoint]"
