"""Cline and Roo Code task histories (`…/globalStorage/<extension>/tasks/<task id>/
api_conversation_history.json`).

The file is the conversation exactly as the extension sends it: a JSON array of Anthropic
`MessageParam`s, each stamped with `ts` (milliseconds), the assistant's also with `modelInfo`
(`modelId`) and `metrics.tokens` (`prompt`, `completion`, `cached`) in newer versions. Native
`tool_use` / `tool_result` blocks pair as everywhere else; older versions wrote the tools as
XML in the assistant's text and their results as user text (`[read_file for 'x'] Result:`),
which stays text. The first `<task>…</task>` is the title; the task folder's name its id.
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


def load(path: Path) -> list[ImportedSession]:
    """Import one task's `api_conversation_history.json`."""
    path = Path(path)
    messages = read_json_document(path)
    if not isinstance(messages, list):
        raise InvalidContent(f"{path}: a task history is a JSON array", path=str(path))
    warnings: list[str] = []
    feed = ChatFeed(ThreadBuilder(MAIN, warn=warnings.append), warnings.append)
    title = None
    for index, message in enumerate(messages):
        if not is_chat_message(message):
            raise InvalidContent(
                f"{path}: message {index} is not a chat message", path=str(path), index=index
            )
        if title is None and message.get("role") == "user":
            found = _TASK.search(text_of(message.get("content")))
            title = found.group(1).splitlines()[0][:80] if found else None
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
