"""Gemini CLI sessions (`~/.gemini/tmp/<project hash>/chats/session-*.json`).

One JSON object: `sessionId`, `startTime`, and `messages`, each with a `type`:

* `user` — the person's message (`content`: text, or parts with `text`);
* `gemini` — one model response: `content` (its text), `toolCalls` (each with `id`, `name`,
  `args` and its `result`, a list of `functionResponse` parts whose `response.output` (or
  `error`) is what the model read back), `thoughts` (the model's reasoning summaries: kept as
  a Note, since they are no thinking blocks a request could carry), `tokens` (the request's
  counts: `input` includes `cached`), and `model`;
* `info`, `warning`, `error` — the CLI's own notices: kept as Notes, never conversation.

The calls of one response are answered, in order, by their recorded results right after it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson

from ..errors import InvalidContent
from .builder import ThreadBuilder
from .chat import text_of
from .jsonio import as_int, iso_to_unix, openai_usage_to_anthropic, read_json_document
from .plan import MAIN, ImportedSession, Note


def load(path: Path) -> list[ImportedSession]:
    """Import one Gemini CLI session file."""
    path = Path(path)
    document = read_json_document(path)
    messages = document.get("messages") if isinstance(document, dict) else None
    if not isinstance(messages, list):
        raise InvalidContent(f"{path}: a Gemini CLI session holds `messages`", path=str(path))
    warnings: list[str] = []
    builder = ThreadBuilder(MAIN, warn=warnings.append)
    model = None
    title = None
    for message in messages:
        if not isinstance(message, dict):
            continue
        kind = message.get("type")
        timestamp = iso_to_unix(message.get("timestamp"))
        if kind == "user":
            text = text_of(message.get("content"))
            title = title or (text.strip().splitlines() or [None])[0]
            builder.user(text, timestamp=timestamp)
        elif kind == "gemini":
            model = model or message.get("model")
            _response(builder, message, timestamp)
        else:
            data = {"type": kind, "content": message.get("content")}
            builder.note(Note("gemini_cli_notice", data, timestamp))
    session_id = document.get("sessionId")
    return [
        ImportedSession(
            source_format="gemini-cli",
            source_id=session_id if isinstance(session_id, str) else path.stem,
            ops=builder.finish(),
            model=model if isinstance(model, str) else None,
            title=title[:80] if title else None,
            warnings=warnings,
        )
    ]


def _response(builder: ThreadBuilder, message: dict[str, Any], timestamp: float | None) -> None:
    blocks: list[dict[str, Any]] = []
    text = text_of(message.get("content"))
    if text:
        blocks.append({"type": "text", "text": text})
    calls = [c for c in message.get("toolCalls") or [] if isinstance(c, dict)]
    for call in calls:
        args = call.get("args")
        blocks.append(
            {
                "type": "tool_use",
                "id": call.get("id"),
                "name": str(call.get("name") or "tool"),
                "input": args if isinstance(args, dict) else {"raw": args},
            }
        )
    model = message.get("model")
    builder.assistant(
        blocks,
        message_id=message.get("id") if isinstance(message.get("id"), str) else None,
        timestamp=timestamp,
        model=model if isinstance(model, str) else None,
        usage=_usage(message.get("tokens")),
    )
    thoughts = [t for t in message.get("thoughts") or [] if isinstance(t, dict)]
    if thoughts:
        data = {"thoughts": [{k: t.get(k) for k in ("subject", "description")} for t in thoughts]}
        builder.note_before_message(Note("gemini_cli_thoughts", data, timestamp))
    for call in calls:
        builder.result(_result(call), timestamp=iso_to_unix(call.get("timestamp")))


def _result(call: dict[str, Any]) -> dict[str, Any]:
    """The call's recorded result as the model read it: each function response's output."""
    outputs: list[str] = []
    failed = call.get("status") == "error"
    for part in call.get("result") or []:
        response = part.get("functionResponse") if isinstance(part, dict) else None
        body = response.get("response") if isinstance(response, dict) else None
        if isinstance(body, dict) and "output" in body:
            outputs.append(_as_text(body["output"]))
        elif isinstance(body, dict) and "error" in body:
            failed = True
            outputs.append(_as_text(body["error"]))
        elif body is not None:
            outputs.append(_as_text(body))
    block: dict[str, Any] = {
        "type": "tool_result",
        "tool_use_id": call.get("id"),
        "content": "\n".join(outputs),
    }
    if failed:
        block["is_error"] = True
    return block


def _as_text(value: Any) -> str:
    return value if isinstance(value, str) else orjson.dumps(value).decode()


def _usage(tokens: Any) -> dict[str, int] | None:
    """Gemini's `input` counts the cached part too, as OpenAI's prompt count does."""
    if not isinstance(tokens, dict):
        return None
    output = as_int(tokens.get("output")) + as_int(tokens.get("thoughts"))
    return openai_usage_to_anthropic(
        as_int(tokens.get("input")), as_int(tokens.get("cached")), output
    )
