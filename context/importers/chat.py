"""Chat messages as agents keep them — Anthropic Messages or OpenAI Chat Completions shapes,
one list — fed to a `ThreadBuilder`, for the formats that store such a list (a plain messages
file, Cline's task history, mini-swe-agent's trajectory).

Per message: `system`/`developer` text becomes the session's system prompt (the first one;
later ones become meta user messages); an assistant message becomes one model response, its
`tool_use` blocks or OpenAI `tool_calls` its calls (arguments parsed as `tool_input` does);
`tool_result` blocks and OpenAI `tool` messages answer them. Everything else a message holds
(ids, timestamps, token counts) is left to the format's own module.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from .builder import ThreadBuilder
from .jsonio import image_block, tool_input

__all__ = ["ChatFeed", "is_chat_message", "text_of"]

HISTORY_ROLES = frozenset({"user", "assistant", "tool", "system", "developer"})
Usage = dict[str, int] | None


def is_chat_message(value: Any) -> bool:
    """A dict shaped as an Anthropic or OpenAI chat message."""
    return (
        isinstance(value, dict)
        and isinstance(value.get("role"), str)  # an object is no role (nor hashable)
        and value["role"] in HISTORY_ROLES
        and ("content" in value or "tool_calls" in value)
    )


def text_of(content: Any) -> str:
    """The text of a string, or of the text parts of a list of blocks or parts."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(
            part["text"]
            for part in content
            if isinstance(part, dict) and isinstance(part.get("text"), str)
        )
    return ""


class ChatFeed:
    """Feeds one thread's chat messages to a builder; `system` is the first system text."""

    def __init__(self, builder: ThreadBuilder, warn: Callable[[str], None]) -> None:
        self.builder = builder
        self.warn = warn
        self.system: str | None = None
        self.model: str | None = None

    def message(
        self,
        message: dict[str, Any],
        *,
        timestamp: float | None = None,
        usage: Usage = None,
        model: str | None = None,
    ) -> None:
        role = message.get("role")
        content = message.get("content")
        if role in ("system", "developer"):
            text = text_of(content)
            if self.system is None:
                self.system = text
            elif text:
                self.builder.user(text, meta=True, timestamp=timestamp)
        elif role == "assistant":
            self.model = self.model or model
            blocks = _blocks(content) + [_call(c) for c in message.get("tool_calls") or []]
            self.builder.assistant(
                [b for b in blocks if b is not None],
                timestamp=timestamp,
                model=model,
                usage=usage,
            )
        elif role == "tool":
            call_id = message.get("tool_call_id")
            result = {"type": "tool_result", "tool_use_id": call_id, "content": text_of(content)}
            self.builder.result(result, timestamp=timestamp)
        elif role == "user":
            others = []
            for block in _blocks(content):
                if block.get("type") == "tool_result":
                    self.builder.result(block, timestamp=timestamp)
                else:
                    others.append(block)
            if others:
                self.builder.user(others, meta=bool(message.get("meta")), timestamp=timestamp)
        else:
            self.warn(f"skipped a message with role {role!r}")


def _blocks(content: Any) -> list[dict[str, Any]]:
    """Anthropic blocks from a string, Anthropic blocks, or OpenAI content parts."""
    if isinstance(content, str):
        return [{"type": "text", "text": content}] if content else []
    out: list[dict[str, Any]] = []
    for part in content if isinstance(content, list) else []:
        if not isinstance(part, dict):
            continue
        kind = part.get("type")
        if kind in ("text", "input_text", "output_text") and isinstance(part.get("text"), str):
            out.append({"type": "text", "text": part["text"]})
        elif kind == "image_url":  # OpenAI: {"image_url": {"url": ...}}
            url = part.get("image_url")
            url = url.get("url") if isinstance(url, dict) else url
            if isinstance(url, str):
                out.append(image_block(url))
        elif kind in (
            "tool_use",
            "tool_result",
            "image",
            "document",
            "thinking",
            "redacted_thinking",
        ):
            out.append(part)
    return out


def _call(call: Any) -> dict[str, Any] | None:
    function = call.get("function") if isinstance(call, dict) else None
    if not isinstance(function, dict):
        return None
    return {
        "type": "tool_use",
        "id": call.get("id"),
        "name": str(function.get("name") or "tool"),
        "input": tool_input(function.get("arguments")),
    }
