"""Budget Reduction: keep the head and the tail of an oversized tool result (spec §3)."""

from __future__ import annotations

from typing import Any

from .policy import MAX_TOOL_RESULT_CHARS, TRUNCATE_HEAD_CHARS, TRUNCATE_TAIL_CHARS
from .recall import content_text, cut_note, omitted_lines


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


def shorten_input(value: Any, limit: int) -> Any:
    """An old tool call's input with every string longer than `limit` characters replaced by
    a short note saying how long it was: the call keeps its shape and its small arguments (a
    file path, a pattern) while a written file's content or a long command goes."""
    if isinstance(value, str):
        if len(value) <= limit:
            return value
        return f"[{len(value):,} characters cleared by compactd; the original is kept]"
    if isinstance(value, dict):
        return {k: shorten_input(v, limit) for k, v in value.items()}
    if isinstance(value, list):
        return [shorten_input(v, limit) for v in value]
    return value


def has_long_strings(value: Any, limit: int) -> bool:
    if isinstance(value, str):
        return len(value) > limit
    if isinstance(value, dict):
        return any(has_long_strings(v, limit) for v in value.values())
    if isinstance(value, list):
        return any(has_long_strings(v, limit) for v in value)
    return False
