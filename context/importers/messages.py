"""Your own agent's log: the messages it sent, exactly as `session/append` takes them.

Three shapes, each a list of Anthropic Messages or OpenAI Chat Completions messages (the two may
not mix in one message, but a file may hold either):

* a JSON array of messages;
* a JSON object with `messages` (and, optionally, `system`: a string or text blocks) — the
  body of a Messages or Chat Completions request;
* chat JSONL: one message per line.

Each assistant message is one model response; its calls are answered by the `tool_result`
blocks or `tool` messages that follow (see `chat.py`). A `system` message (or the object's
`system`) is the session's system prompt. The file has no ids or times, so the session's id is
the file's name.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson

from ..errors import InvalidContent
from .builder import ThreadBuilder
from .chat import ChatFeed, is_chat_message, text_of
from .files import read_regular
from .jsonio import read_jsonl
from .plan import MAIN, ImportedSession


def load(path: Path) -> list[ImportedSession]:
    """Import one messages file (JSON array, `{"messages": …}` or chat JSONL)."""
    path = Path(path)
    system, messages = _messages(path)
    warnings: list[str] = []
    feed = ChatFeed(ThreadBuilder(MAIN, warn=warnings.append), warnings.append)
    feed.system = system
    for index, message in enumerate(messages):
        if not is_chat_message(message):
            raise InvalidContent(
                f"{path}: message {index} is not a chat message (an object with a `role` of "
                "user, assistant, tool or system, and its `content`)",
                path=str(path),
                index=index,
            )
        feed.message(message)
    return [
        ImportedSession(
            source_format="messages",
            source_id=path.stem,
            ops=feed.builder.finish(),
            system=feed.system,
            title=_title(messages),
            warnings=warnings,
        )
    ]


def _messages(path: Path) -> tuple[str | None, list[Any]]:
    try:
        document = orjson.loads(read_regular(path))
    except orjson.JSONDecodeError:  # not one document: chat JSONL, one message a line
        return None, read_jsonl(path)
    if isinstance(document, list):
        return None, document
    if isinstance(document, dict) and isinstance(document.get("messages"), list):
        system = document.get("system")
        return (text_of(system) or None) if system else None, document["messages"]
    if is_chat_message(document):
        return None, [document]  # a JSONL file of one line
    raise InvalidContent(
        f"{path}: a messages file is a list of messages or an object with `messages`",
        path=str(path),
    )


def _title(messages: list[Any]) -> str | None:
    for message in messages:
        if isinstance(message, dict) and message.get("role") == "user":
            text = text_of(message.get("content")).strip()
            if text:
                return text.splitlines()[0][:80]
    return None
