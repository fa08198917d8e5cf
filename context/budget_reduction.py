"""Budget Reduction (spec §3): keep the head and the tail of an oversized tool result.

A result is cut as a whole: its text blocks count together against the limit, and the cut is
made once, over their text end to end.

The cut's arithmetic (the 60/40 split of `maxToolResultChars`) and the note that stands in the
middle (how much went, which lines, and — with recall — the handle that returns them) are one
rule, so they live together; recall owns only handles and paging (`recall.line_starts`,
`recall.content_text`).
"""

from __future__ import annotations

from bisect import bisect_right
from typing import Any

from .policy import MAX_TOOL_RESULT_CHARS, TRUNCATE_HEAD_CHARS, TRUNCATE_TAIL_CHARS
from .recall import content_text, line_starts

NOTE_ROOM = 200
"""The most a cut's note takes (~170 characters with recall's handle and line numbers): a cut
that removes no more than this is not made — the result would not get shorter — whether or not
the request carries recall, so recall changes only the notes."""


def middle_truncate(
    text: str,
    max_chars: int = MAX_TOOL_RESULT_CHARS,
    head: int = TRUNCATE_HEAD_CHARS,
    tail: int = TRUNCATE_TAIL_CHARS,
    handle: str | None = None,
) -> str:
    """`text` unchanged if it is at most `max_chars` long; otherwise its first `head` and last
    `tail` characters around a marker that says how much was cut — and, with a recall
    `handle`, which lines and how to get them back. A cut of no more than `NOTE_ROOM`
    characters is not made."""
    out = truncate_result(text, max_chars, head, tail, handle)
    return out if isinstance(out, str) else text


def truncate_result(
    content: Any, max_chars: int, head: int, tail: int, handle: str | None = None
) -> Any:
    """Budget Reduction of one tool result: over `max_chars` characters of text in all (a
    result of many text blocks, as MCP tools return, is one result), the first `head` and the
    last `tail` characters of its text are kept and the middle gives way to one marker. Block
    boundaries outside the cut stay where they were; images and documents are kept as they
    are. With a recall `handle`, the marker's line numbers count in the result as recall
    serves it (`recall.content_text`: the parts joined by newlines)."""
    if isinstance(content, str):
        parts: list[Any] = [{"type": "text", "text": content}]
    elif isinstance(content, list):
        parts = content
    else:
        return content
    texts = [_text_of(b) for b in parts]
    total = sum(len(t) for t in texts if t is not None)
    if total <= max_chars:
        return content
    cut_from, cut_to = head, total - tail  # in the result's text, every block's end to end
    if cut_to - cut_from <= NOTE_ROOM:
        return content  # the note would be as long as what it replaces
    marker = _marker(parts, texts, cut_from, cut_to, handle)
    out: list[Any] = []
    at = 0  # where the current block starts in the result's text
    for block, text in zip(parts, texts, strict=True):
        if text is None:
            out.append(block)
            continue
        start, end = at, at + len(text)
        at = end
        kept_head = text[: max(0, min(end, cut_from) - start)]
        kept_tail = text[max(0, cut_to - start) :] if end > cut_to else ""
        holds_cut = start <= cut_from < end or (start == end == cut_from)
        if holds_cut:
            out.append({**block, "text": kept_head + marker + kept_tail})
        elif end <= cut_from or start >= cut_to:
            out.append(block)
        elif kept_tail:
            out.append({**block, "text": kept_tail})
        # else: wholly inside the cut, gone
    if isinstance(content, str):
        return out[0]["text"]
    return out


def _text_of(block: Any) -> str | None:
    if isinstance(block, dict) and block.get("type") == "text":
        return str(block.get("text", ""))
    return None


def _marker(
    parts: list[Any], texts: list[str | None], cut_from: int, cut_to: int, handle: str | None
) -> str:
    cut = cut_to - cut_from
    if handle is None:
        return f"\n\n[… {cut:,} characters truncated by compactd …]\n\n"
    full, start, stop = _span(parts, texts, cut_from, cut_to)
    return cut_note(cut, handle, omitted_lines(full, start, stop))


def _span(
    parts: list[Any], texts: list[str | None], cut_from: int, cut_to: int
) -> tuple[str, int, int]:
    """The result as recall serves it (text parts and a line naming each other part, joined by
    newlines) and where the cut lies in it."""
    full = content_text(parts)
    at_text = at_full = 0
    start = stop = None
    for block, text in zip(parts, texts, strict=True):
        size = len(text) if text is not None else 0
        if text is not None:
            if start is None and cut_from < at_text + size:
                start = at_full + (cut_from - at_text)
            if stop is None and cut_to <= at_text + size:
                stop = at_full + (cut_to - at_text)
        at_text += size
        at_full += len(content_text([block])) + 1
    return full, len(full) if start is None else start, len(full) if stop is None else stop


def first_cut_line(content: Any, max_chars: int, head: int, tail: int) -> int | None:
    """The first line (1-based, as recall counts them) of a result that Budget Reduction's cut
    leaves out; None when it is not cut."""
    parts: list[Any] = [{"type": "text", "text": content}] if isinstance(content, str) else content
    if not isinstance(parts, list):
        return None
    texts = [_text_of(b) for b in parts]
    total = sum(len(t) for t in texts if t is not None)
    if total <= max_chars or total - tail - head <= NOTE_ROOM:
        return None
    full, start, _ = _span(parts, texts, head, total - tail)
    return bisect_right(line_starts(full), start)


def omitted_lines(text: str, start: int, stop: int) -> tuple[int, int, int] | None:
    """The lines (first, last, total; 1-based) that characters `start:stop` touch, or None
    when the text is a single line (nothing line-oriented to say)."""
    starts = line_starts(text)
    if len(starts) < 2 or stop <= start:
        return None
    return bisect_right(starts, start), bisect_right(starts, stop - 1), len(starts)


def cut_note(cut: int, handle: str, lines: tuple[int, int, int] | None) -> str:
    """Budget Reduction's marker when the request carries `compactd_recall`."""
    where = f" (lines {lines[0]}–{lines[1]} of {lines[2]} omitted)" if lines else ""
    return (
        f"\n\n[… {cut:,} characters{where} truncated by compactd; compactd_recall with handle "
        f"{handle} returns them, or with search the lines that match …]\n\n"
    )
