"""An Anthropic message stream on its way to the client: forwarded event by event as it arrives,
while the proxy assembles the message (its usage, the context edits the provider applied, its
calls) and holds back the one thing the client must not see — a `compactd_recall` call, which
the proxy answers itself.

When a message calls nothing but `compactd_recall`, its end is held too: the proxy asks the
upstream again with the answers, and the next stream continues the same message for the client
(its `message_start` dropped, its blocks numbered on from the first one's), so the client sees
one answer. Thinking blocks and their signatures pass through byte for byte.
"""

from __future__ import annotations

import copy
from typing import Any

import orjson

from ..context.recall import TOOL_NAME as RECALL_TOOL
from .sse import Event, encode


class Assembly:
    """A streamed message, built from its events as the SDK builds it."""

    def __init__(self) -> None:
        self.message: dict[str, Any] = {}
        self.blocks: dict[int, dict[str, Any]] = {}
        self._json: dict[int, str] = {}
        self.usage: dict[str, Any] = {}
        self.context_management: dict[str, Any] | None = None
        self.stop_reason: str | None = None
        self.error: dict[str, Any] | None = None

    def apply(self, data: dict[str, Any]) -> None:
        kind = data.get("type")
        if kind == "message_start":
            self.message = dict(data.get("message") or {})
            self.usage.update(self.message.get("usage") or {})
        elif kind == "content_block_start":
            self.blocks[data["index"]] = copy.deepcopy(data.get("content_block") or {})
        elif kind == "content_block_delta":
            self._delta(data["index"], data.get("delta") or {})
        elif kind == "content_block_stop":
            index = data["index"]
            if index in self._json:
                text = self._json.pop(index)
                try:
                    self.blocks[index]["input"] = orjson.loads(text) if text else {}
                except orjson.JSONDecodeError:
                    self.blocks[index]["input"] = {}
        elif kind == "message_delta":
            self.usage.update(data.get("usage") or {})
            self.stop_reason = (data.get("delta") or {}).get("stop_reason", self.stop_reason)
            if data.get("context_management") is not None:
                self.context_management = data["context_management"]
        elif kind == "error":
            self.error = data.get("error") or {}

    def _delta(self, index: int, delta: dict[str, Any]) -> None:
        block = self.blocks.setdefault(index, {})
        kind = delta.get("type")
        if kind == "text_delta":
            block["text"] = block.get("text", "") + delta.get("text", "")
        elif kind == "thinking_delta":
            block["thinking"] = block.get("thinking", "") + delta.get("thinking", "")
        elif kind == "signature_delta":
            block["signature"] = block.get("signature", "") + delta.get("signature", "")
        elif kind == "input_json_delta":
            self._json[index] = self._json.get(index, "") + delta.get("partial_json", "")
        elif kind == "citations_delta":
            block.setdefault("citations", []).append(delta.get("citation"))

    @property
    def content(self) -> list[dict[str, Any]]:
        return [self.blocks[i] for i in sorted(self.blocks)]

    def final(self) -> dict[str, Any]:
        """The whole message, as a non-streaming answer would have been."""
        return {
            **self.message,
            "content": self.content,
            "stop_reason": self.stop_reason,
            "usage": self.usage,
        }


def is_recall_call(block: dict[str, Any]) -> bool:
    return block.get("type") == "tool_use" and block.get("name") == RECALL_TOOL


class Relay:
    """Decides, event by event, what of the upstream's streams the client gets."""

    def __init__(self, *, recall: bool) -> None:
        self.recall = recall
        self.next_index = 0  # the client's next content block index
        self.continuing = False  # a follow-up stream: the client has its message_start
        self.assembly = Assembly()
        self.first: Assembly | None = None  # the first stream's message (what usage is of)
        self._index: dict[int, int | None] = {}  # upstream index -> the client's, None: held
        self._holding_end = False

    def event(self, event: Event) -> bytes | None:
        """The bytes to forward for `event` (None: nothing, now)."""
        data = event.data
        if not isinstance(data, dict):
            return event.raw
        self.assembly.apply(data)
        kind = data.get("type")
        if kind == "message_start":
            return None if self.continuing else event.raw
        if kind in ("content_block_start", "content_block_delta", "content_block_stop"):
            index = data.get("index")
            if kind == "content_block_start":
                held = self.recall and is_recall_call(data.get("content_block") or {})
                self._index[index] = None if held else self.next_index
                if not held:
                    self.next_index += 1
            target = self._index.get(index, index)
            if target is None:
                return None
            if target == index:
                return event.raw
            return encode(event.name, {**data, "index": target})
        if kind == "message_delta" and self.follow_up_calls():
            self._holding_end = True
            return None
        if kind == "message_stop" and self._holding_end:
            return None
        return event.raw

    def follow_up_calls(self) -> list[dict[str, Any]]:
        """The recall calls to answer before the client may see the message end."""
        return follow_up_calls(self.assembly.content, self.recall)

    def continue_with_next_stream(self) -> None:
        """The next upstream stream carries on this message for the client."""
        if self.first is None:
            self.first = self.assembly
        self.assembly = Assembly()
        self._index = {}
        self._holding_end = False
        self.continuing = True

    @property
    def reported(self) -> Assembly:
        """The stream whose usage describes the request compactd rendered."""
        return self.first or self.assembly


def follow_up_calls(content: list[dict[str, Any]], recall: bool) -> list[dict[str, Any]]:
    """A message's calls when every one of them is `compactd_recall` (the proxy answers them
    and asks again), else none."""
    calls = [b for b in content if b.get("type") == "tool_use"]
    if not recall or not calls or not all(is_recall_call(b) for b in calls):
        return []
    return calls


def mixed_recall_calls(content: list[dict[str, Any]], recall: bool) -> list[dict[str, Any]]:
    """Recall calls made beside the client's own (answered in the next request)."""
    calls = [b for b in content if b.get("type") == "tool_use"]
    if not recall or all(is_recall_call(b) for b in calls):
        return []
    return [b for b in calls if is_recall_call(b)]


def visible_content(content: list[dict[str, Any]], recall: bool) -> list[dict[str, Any]]:
    """A non-streamed message's content as the client gets it (no `compactd_recall` calls)."""
    return [b for b in content if not (recall and is_recall_call(b))]
