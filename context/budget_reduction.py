"""Budget Reduction (spec §3): keep the head and the tail of an oversized tool result.

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


def middle_truncate(
    text: str,
    max_chars: int = MAX_TOOL_RESULT_CHARS,
    head: int = TRUNCATE_HEAD_CHARS,
    tail: int = TRUNCATE_TAIL_CHARS,
    handle: str | None = None,
    whole: tuple[str, int] | None = None,
) -> str:
    """`text` unchanged if it is at most `max_chars` long; otherwise its first `head` and last
    `tail` characters around a marker that says how much was cut — and, with a recall
    `handle`, which lines and how to get them back (`whole`: the whole content as recall
    serves it and where `text` starts in it, when `text` is one part of several)."""
    if len(text) <= max_chars:
        return text
    cut = len(text) - head - tail
    if handle is None:
        marker = f"\n\n[… {cut:,} characters truncated by compactd …]\n\n"
    else:
        full, at = whole if whole is not None else (text, 0)
        marker = cut_note(cut, handle, omitted_lines(full, at + head, at + len(text) - tail))
    return text[:head] + marker + text[len(text) - tail :]


def truncate_result(
    content: Any, max_chars: int, head: int, tail: int, handle: str | None = None
) -> Any:
    """Budget Reduction of a tool result's content: each text part over the limit is
    middle-truncated; images, documents and short text are kept as they are. With a recall
    `handle`, line numbers count in the parts joined by newlines, as recall serves them."""
    if isinstance(content, str):
        return middle_truncate(content, max_chars, head, tail, handle)
    if not isinstance(content, list):
        return content
    full = content_text(content) if handle is not None else ""
    at = 0  # where this part starts in `full`
    changed = False
    out = []
    for block in content:
        text = block.get("text", "") if block.get("type") == "text" else None
        if text is not None and len(text) > max_chars:
            cut = middle_truncate(text, max_chars, head, tail, handle, (full, at))
            block = {**block, "text": cut}
            changed = True
        if handle is not None:
            at += len(content_text([block if text is None else {"type": "text", "text": text}]))
            at += 1  # the newline joining the parts
        out.append(block)
    return out if changed else content


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
        f"{handle} returns them …]\n\n"
    )
