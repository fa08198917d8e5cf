"""Content blocks: the Anthropic block shapes the engine stores, checked once at the door.

Blocks are kept as the dicts the client sent (thinking blocks stay byte-exact); validation
only rejects what a provider would reject or what the engine could not render.
"""

from __future__ import annotations

from typing import Any

from .errors import InvalidContent

_IMAGE_MEDIA = {"image/png", "image/jpeg", "image/gif", "image/webp"}


def _need_str(block: dict[str, Any], key: str, where: str, *, allow_empty: bool = True) -> None:
    value = block.get(key)
    if not isinstance(value, str) or (not allow_empty and not value):
        raise InvalidContent(
            f"{where}: a {block.get('type')!r} block needs a string {key!r}",
            where=where,
            field=key,
        )


def _check_source(block: dict[str, Any], where: str) -> None:
    source = block.get("source")
    if not isinstance(source, dict) or not isinstance(source.get("type"), str):
        raise InvalidContent(f"{where}: {block['type']} block needs a 'source' object", where=where)
    if source["type"] == "base64":
        _need_str(source | {"type": block["type"]}, "data", where)
        if block["type"] == "image" and source.get("media_type") not in _IMAGE_MEDIA:
            raise InvalidContent(
                f"{where}: image media_type must be one of {sorted(_IMAGE_MEDIA)}", where=where
            )


def check_block(block: Any, where: str, *, allowed: frozenset[str] | None = None) -> None:
    """Raise `InvalidContent` naming the problem if `block` is not a well-formed block."""
    if not isinstance(block, dict):
        raise InvalidContent(f"{where}: a content block must be an object", where=where)
    kind = block.get("type")
    if not isinstance(kind, str) or not kind:
        raise InvalidContent(f"{where}: a content block needs a string 'type'", where=where)
    if allowed is not None and kind not in allowed:
        raise InvalidContent(
            f"{where}: a {kind!r} block is not allowed here (allowed: {sorted(allowed)})",
            where=where,
            type=kind,
        )
    if kind == "text":
        _need_str(block, "text", where)
    elif kind == "thinking":
        _need_str(block, "thinking", where)
        if "signature" in block and not isinstance(block["signature"], str):
            raise InvalidContent(f"{where}: thinking 'signature' must be a string", where=where)
    elif kind == "redacted_thinking":
        _need_str(block, "data", where)
    elif kind in ("image", "document"):
        _check_source(block, where)
    elif kind == "tool_use":
        _need_str(block, "id", where, allow_empty=False)
        _need_str(block, "name", where, allow_empty=False)
        if not isinstance(block.get("input"), dict):
            raise InvalidContent(f"{where}: tool_use 'input' must be an object", where=where)
    elif kind == "tool_result":
        _need_str(block, "tool_use_id", where, allow_empty=False)
        check_result_content(block.get("content", ""), where)
        if "is_error" in block and not isinstance(block["is_error"], bool):
            raise InvalidContent(f"{where}: tool_result 'is_error' must be a boolean", where=where)


RESULT_BLOCK_TYPES = frozenset({"text", "image", "document", "search_result", "tool_reference"})


def check_result_content(content: Any, where: str) -> None:
    """A tool result is a string or a list of text/image/document blocks."""
    if isinstance(content, str):
        return
    if not isinstance(content, list):
        raise InvalidContent(
            f"{where}: tool result content must be a string or a list of blocks", where=where
        )
    for i, block in enumerate(content):
        check_block(block, f"{where}.content[{i}]", allowed=RESULT_BLOCK_TYPES)


def as_blocks(content: Any, where: str) -> list[dict[str, Any]]:
    """A message's `content` as a list of blocks (a bare string becomes one text block)."""
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    if not isinstance(content, list):
        raise InvalidContent(
            f"{where}: message content must be a string or a list of blocks", where=where
        )
    for i, block in enumerate(content):
        check_block(block, f"{where}.content[{i}]")
    return content


def result_text_length(content: Any) -> int:
    """Characters of text in a tool result (what Budget Reduction measures)."""
    if isinstance(content, str):
        return len(content)
    return sum(len(b.get("text", "")) for b in content if b.get("type") == "text")


# ---- Tier 1's shortened inputs -------------------------------------------------------------


def shorten_input(value: Any, limit: int, handle: str | None = None) -> Any:
    """An old tool call's input with every string longer than `limit` characters replaced by
    a short note saying how long it was: the call keeps its shape and its small arguments (a
    file path, a pattern) while a written file's content or a long command goes. With a recall
    `handle` (of the call's input), the note names it."""
    if isinstance(value, str):
        if len(value) <= limit:
            return value
        if handle is None:
            return f"[{len(value):,} characters cleared by compactd; the original is kept]"
        return (
            f"[{len(value):,} characters cleared by compactd; compactd_recall with handle "
            f"{handle} returns the call's input]"
        )
    if isinstance(value, dict):
        return {k: shorten_input(v, limit, handle) for k, v in value.items()}
    if isinstance(value, list):
        return [shorten_input(v, limit, handle) for v in value]
    return value


def has_long_strings(value: Any, limit: int) -> bool:
    if isinstance(value, str):
        return len(value) > limit
    if isinstance(value, dict):
        return any(has_long_strings(v, limit) for v in value.values())
    if isinstance(value, list):
        return any(has_long_strings(v, limit) for v in value)
    return False
