"""Cline and Roo Code task histories (`…/globalStorage/<extension>/tasks/<task id>/
api_conversation_history.json`).

The file is the conversation as the extension keeps it: a JSON array of Anthropic
`MessageParam`s, stamped with `ts` (milliseconds) in newer versions, the assistant's also with
`modelInfo` (`modelId`) and `metrics.tokens` (`prompt`, `completion`, `cached`). The first
`<task>…</task>` is the title; the task folder's name its id.

Tool results come in three shapes: `tool_result` blocks; text blocks `[read_file for 'x']
Result:` (or `Tool [x] was not executed …`) answering native `tool_use` blocks in order — what
real task histories of 2026 hold — which become the calls' results; and, in the oldest
versions, tools written as XML in the assistant's text, whose results stay text. The text the
extension adds to a message that answers calls (`<environment_details>`, progress reminders)
is meta: a tool round trip is not a new user turn.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from ..errors import InvalidContent
from .builder import ThreadBuilder
from .chat import ChatFeed, is_chat_message, text_of
from .jsonio import as_int, read_json_document
from .plan import MAIN, ImportedSession

_TASK = re.compile(r"<task>\s*(.*?)\s*</task>", re.S)
# a tool's result as Cline writes it in text: `[read_file for 'x'] Result:` or a refusal
# (the quoted argument may hold brackets and line breaks: `[ask_followup_question for '## …'`)
_RESULT_TEXT = re.compile(
    r"\[[\w-]+(?: for '.*?')?\] Result:|Tool \[[\w-]+\] was not executed", re.S
)


def load(path: Path) -> list[ImportedSession]:
    """Import one task's `api_conversation_history.json`."""
    path = Path(path)
    messages = read_json_document(path)
    if not isinstance(messages, list):
        raise InvalidContent(f"{path}: a task history is a JSON array", path=str(path))
    warnings: list[str] = []
    feed = ChatFeed(ThreadBuilder(MAIN, warn=warnings.append), warnings.append)
    title = None
    calls: list[str] = []  # the open assistant message's tool_use ids
    for index, message in enumerate(messages):
        if not is_chat_message(message):
            raise InvalidContent(
                f"{path}: message {index} is not a chat message", path=str(path), index=index
            )
        if title is None and message.get("role") == "user":
            found = _TASK.search(text_of(message.get("content")))
            title = found.group(1).splitlines()[0][:80] if found else None
        if message.get("role") == "assistant":
            calls = [b["id"] for b in _blocks_of(message) if b.get("type") == "tool_use"]
        elif message.get("role") == "user":
            message, calls = answering(message, calls), []
        info = message.get("modelInfo")
        model = info.get("modelId") if isinstance(info, dict) else None
        feed.message(
            message,
            timestamp=_seconds(message.get("ts")),
            usage=_usage(message.get("metrics")),
            model=model if isinstance(model, str) else None,
        )
    task_id = path.parent.name if path.name == "api_conversation_history.json" else path.stem
    return [
        ImportedSession(
            source_format="cline",
            source_id=task_id,
            ops=feed.builder.finish(),
            system=feed.system,
            model=feed.model,
            title=title,
            warnings=warnings,
        )
    ]


def answering(message: dict[str, Any], calls: list[str]) -> dict[str, Any]:
    """A user message after an assistant message with `calls`: its result texts become the
    calls' `tool_result` blocks, in order, and the rest of it is meta (the extension's own
    context, not the user's next request). Unchanged when it answers nothing."""
    blocks = _blocks_of(message)
    answered = {b.get("tool_use_id") for b in blocks if b.get("type") == "tool_result"}
    waiting = [call for call in calls if call not in answered]
    out: list[dict[str, Any]] = []
    for block in blocks:
        text = block.get("text") if block.get("type") == "text" else None
        if waiting and isinstance(text, str) and _RESULT_TEXT.match(text):
            refused = text.startswith("Tool [")
            out.append(
                {"type": "tool_result", "tool_use_id": waiting.pop(0), "content": text}
                | ({"is_error": True} if refused else {})
            )
            answered.add(out[-1]["tool_use_id"])
        else:
            out.append(block)
    if not answered & set(calls):
        return message
    return {**message, "content": out, "meta": True}


def _blocks_of(message: dict[str, Any]) -> list[dict[str, Any]]:
    content = message.get("content")
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    return [b for b in content or [] if isinstance(b, dict)]


def _seconds(ts: Any) -> float | None:
    return ts / 1000 if isinstance(ts, int | float) and not isinstance(ts, bool) else None


def _usage(metrics: Any) -> dict[str, int] | None:
    tokens = metrics.get("tokens") if isinstance(metrics, dict) else None
    if not isinstance(tokens, dict):
        return None
    return {
        "input_tokens": as_int(tokens.get("prompt")),
        "cache_read_input_tokens": as_int(tokens.get("cached")),
        "output_tokens": as_int(tokens.get("completion")),
    }
