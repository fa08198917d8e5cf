"""A summary asked as a fork of the cached request (`types.Fork`): where the range ends in the
request as rendered, and how the fork's instruction names it.

The fork is the request compactd rendered for this step, unchanged, with one more user turn:
the provider reads everything before that turn from its prompt cache (the previous request
wrote it), so the summary's input costs a tenth of a transcript of the range sent afresh.
The model must be told which part its checkpoint replaces: everything before the last
messages the summary keeps, named by how many they are and how the first begins.
"""

from __future__ import annotations

from collections.abc import Collection
from typing import Any

from ..render.anthropic import wire_groups
from ..render.conversation import Conversation, Part
from .instructions import quoted


def kept_tail(conversation: Conversation, covers: Collection[str]) -> tuple[int, Part] | None:
    """How many wire messages of the request come after the range `covers` names (a prefix of
    the thread), and the first part of the thread's own that the range does not cover; None
    when the range covers all of it (nothing would be left to name)."""
    groups = wire_groups(conversation)
    for index, group in enumerate(groups):
        for message in group:
            if message.turn < 0 or message.kind != "turn":
                continue  # a caller's prefix, a marker: not the thread's own nodes
            for part in message.parts:
                if part.node is not None and part.node not in covers:
                    return len(groups) - index, part
    return None


def describe(parts: list[Part]) -> str:
    """How the kept messages begin, in words the model can find: the first text quoted, or
    what the first block is (a call by its tool and id, a result by its call's id)."""
    for part in parts:
        block: dict[str, Any] = part.block
        kind = block.get("type")
        if kind == "text" and block.get("text", "").strip():
            return quoted(block["text"])
        if kind == "tool_use":
            return f"a call to {block.get('name')} (id {block.get('id')})"
        if kind == "tool_result":
            return f"the result of call {block.get('tool_use_id')}"
        if kind in ("image", "document"):
            return f"an {kind}" if kind == "image" else "a document"
    return "a message"


def first_parts(conversation: Conversation, first: Part) -> list[Part]:
    """`first` and the parts after it in its message (a thinking block says nothing the
    model can find: what follows it does)."""
    for message in conversation.messages:
        for i, part in enumerate(message.parts):
            if part is first:
                return message.parts[i:]
    return [first]
