"""The Gemini API (`generateContent`, `streamGenerateContent?alt=sse`, `countTokens`), read and
written: a request's `contents` as the session's messages (the Anthropic-shaped blocks
`session/append` takes) and compactd's rendering back as `contents`. Pure functions over the
provider's JSON; the engine decides what the messages are.

What maps: text parts to text blocks, `inlineData` pictures to image blocks, a `functionCall`
to a `tool_use` and the `functionResponse` that answers it (the API pairs them by order within
the next turn) to its `tool_result`. A call's `thoughtSignature`, its own `id` and the response's
original `response` object ride on the block (`gemini`) and come back byte for byte; a part the
engine has no block for (thoughts, `fileData`, `executableCode`, …) rides whole in an opaque
`gemini_part` block. A call without an `id` gets one from its place in the conversation, which
the client never sees (it is removed on the way back). `systemInstruction` and `tools` are the
prompt's fixed start: counted as the system prompt, sent as the client wrote them.
"""

from __future__ import annotations

import hashlib
import re
from typing import Any

import orjson

OPAQUE = "gemini_part"
PATH = re.compile(r"^/(?P<version>v1beta|v1|v1alpha)/models/(?P<model>[^/:]+):(?P<method>\w+)$")
OVERFLOW = re.compile(
    r"input token count \((\d+)\) exceeds the maximum number of tokens allowed \((\d+)\)"
)
_STATUS = {400: "INVALID_ARGUMENT", 404: "NOT_FOUND", 413: "INVALID_ARGUMENT", 500: "INTERNAL"}


class GeminiError(Exception):
    """A request the adapter refuses, in the API's error shape."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message

    def body(self) -> dict[str, Any]:
        return error_body(self.status, self.message)


def error_body(status: int, message: str) -> dict[str, Any]:
    """The Gemini API's error shape: `{"error": {code, message, status}}`."""
    return {"error": {"code": status, "message": message, "status": _STATUS.get(status, "UNKNOWN")}}


def _generated_id(content_index: int, part_index: int) -> str:
    return f"gemini_{content_index:05d}_{part_index:02d}"


def _text_blocks(part: dict[str, Any]) -> dict[str, Any]:
    return {"type": "text", "text": part["text"]}


def _image(part: dict[str, Any]) -> dict[str, Any] | None:
    data = part.get("inlineData")
    mime = str((data or {}).get("mimeType", ""))
    if not isinstance(data, dict) or not mime.startswith("image/") or set(part) != {"inlineData"}:
        return None
    return {
        "type": "image",
        "source": {"type": "base64", "media_type": mime, "data": data.get("data", "")},
    }


def _plain_text(part: dict[str, Any]) -> bool:
    return set(part) == {"text"} and isinstance(part["text"], str)


def _result_content(response: Any) -> Any:
    """A function response's `response` as the engine reads a result: its `output` (or
    `content`) text when it is one, else its JSON."""
    if isinstance(response, dict) and set(response) <= {"output", "content"}:
        value = response.get("output", response.get("content"))
        if isinstance(value, str):
            return value
    return orjson.dumps(response).decode()


def contents_to_messages(contents: list[Any]) -> list[dict[str, Any]]:
    """A request's `contents` as the session's messages (see the module docstring)."""
    messages: list[dict[str, Any]] = []
    pending: list[dict[str, Any]] = []  # the calls of the latest model turn, in order
    for ci, content in enumerate(contents):
        if not isinstance(content, dict):
            raise GeminiError(400, f"Invalid value at 'contents[{ci}]'")
        role = content.get("role", "user")
        parts = content.get("parts")
        if role not in ("user", "model"):
            raise GeminiError(400, "Please use a valid role: user, model.")
        if not isinstance(parts, list) or not parts:
            raise GeminiError(400, f"contents[{ci}].parts: contents.parts must not be empty.")
        blocks: list[dict[str, Any]] = []
        calls: list[dict[str, Any]] = []
        answered = 0
        for pi, part in enumerate(parts):
            if not isinstance(part, dict):
                raise GeminiError(400, f"Invalid value at 'contents[{ci}].parts[{pi}]'")
            image = _image(part) if role == "user" else None
            if _plain_text(part):
                blocks.append(_text_blocks(part))
            elif image is not None:
                blocks.append(image)
            elif role == "model" and isinstance(part.get("functionCall"), dict):
                call = part["functionCall"]
                extra = {k: v for k, v in part.items() if k != "functionCall"}
                block = {
                    "type": "tool_use",
                    "id": str(call.get("id") or _generated_id(ci, pi)),
                    "name": str(call.get("name", "")),
                    "input": call.get("args") if isinstance(call.get("args"), dict) else {},
                    "gemini": {"call": call, "part": extra, "order": list(part)},
                }
                blocks.append(block)
                calls.append(block)
            elif role == "user" and isinstance(part.get("functionResponse"), dict):
                if answered >= len(pending):
                    raise GeminiError(
                        400,
                        "Please ensure that function response turn comes immediately after a "
                        "function call turn.",
                    )
                response = part["functionResponse"]
                call = pending[answered]
                answered += 1
                blocks.append(
                    {
                        "type": "tool_result",
                        "tool_use_id": call["id"],
                        "content": _result_content(response.get("response")),
                        "gemini": {"part": part},
                    }
                )
            else:
                blocks.append({"type": OPAQUE, "part": part})
        if role == "user" and pending and answered != len(pending):
            raise GeminiError(
                400,
                "Please ensure that the number of function response parts is equal to the "
                "number of function call parts of the function call turn.",
            )
        pending = calls if role == "model" else []
        messages.append({"role": "assistant" if role == "model" else "user", "content": blocks})
    return messages


def _call_part(block: dict[str, Any]) -> dict[str, Any]:
    """The client's own call while its arguments are as it sent them; else the engine's (a
    shortened input), its signature and id kept."""
    gemini = block.get("gemini") or {}
    sent = gemini.get("call") if isinstance(gemini.get("call"), dict) else {}
    call = sent
    if sent.get("args") != block.get("input"):
        call = {"name": block.get("name", ""), "args": block.get("input", {})}
        if sent.get("id"):
            call["id"] = sent["id"]
    part = dict(gemini.get("part") or {})
    order = gemini.get("order") or ["functionCall", *part]
    whole = {"functionCall": call, **part}
    return {key: whole[key] for key in order if key in whole}


def _response_part(block: dict[str, Any], name: str) -> dict[str, Any]:
    """The client's own part while the result is as it sent it; else the engine's content
    (a cleared or shortened result) as the response's `output`."""
    original = (block.get("gemini") or {}).get("part")
    content = block.get("content", "")
    if original is not None:
        sent = original.get("functionResponse", {}).get("response")
        if _result_content(sent) == content:
            return original
        call_id = original.get("functionResponse", {}).get("id")
    else:
        call_id = None
    if not isinstance(content, str):
        content = "\n".join(
            b.get("text", "") for b in content or [] if isinstance(b, dict) and "text" in b
        )
    response: dict[str, Any] = {"name": name, "response": {"output": content}}
    if call_id:
        response["id"] = call_id
    return {"functionResponse": response}


def messages_to_contents(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The rendered messages back as `contents`, in their order (see the module docstring)."""
    contents: list[dict[str, Any]] = []
    names: dict[str, str] = {}
    for message in messages:
        role = "model" if message.get("role") == "assistant" else "user"
        raw = message.get("content")
        blocks = [{"type": "text", "text": raw}] if isinstance(raw, str) else raw or []
        parts: list[dict[str, Any]] = []
        for block in blocks:
            kind = block.get("type")
            if kind == "text":
                parts.append({"text": block.get("text", "")})
            elif kind == OPAQUE:
                parts.append(block.get("part") or {})
            elif kind == "image":
                source = block.get("source") or {}
                parts.append(
                    {
                        "inlineData": {
                            "mimeType": source.get("media_type"),
                            "data": source.get("data"),
                        }
                    }
                )
            elif kind == "tool_use":
                names[block["id"]] = block.get("name", "")
                parts.append(_call_part(block))
            elif kind == "tool_result":
                use_id = block.get("tool_use_id", "")
                parts.append(_response_part(block, names.get(use_id, "")))
        if not parts:
            continue
        if contents and contents[-1]["role"] == role and not _turn_boundary(contents[-1], parts):
            contents[-1]["parts"].extend(parts)
        else:
            contents.append({"role": role, "parts": parts})
    return contents


def _turn_boundary(previous: dict[str, Any], parts: list[dict[str, Any]]) -> bool:
    """Two user contents stay apart where one is a function response turn and the other not
    (the API pairs a call turn with the response turn right after it)."""
    was = any("functionResponse" in p for p in previous["parts"])
    now = any("functionResponse" in p for p in parts)
    return was != now


def system_text(body: dict[str, Any]) -> str | None:
    """`systemInstruction` as the budget counts it (it is sent as the client wrote it)."""
    system = body.get("systemInstruction")
    if isinstance(system, str):
        return system or None
    parts = (system or {}).get("parts") if isinstance(system, dict) else None
    text = "\n".join(str(p.get("text", "")) for p in parts or [] if isinstance(p, dict))
    return text or None


def tools_of(body: dict[str, Any]) -> list[dict[str, Any]] | None:
    """The function declarations, in the shape the budget counts tools in."""
    out = [
        {
            "name": d.get("name"),
            "description": d.get("description", ""),
            "input_schema": d.get("parametersJsonSchema") or d.get("parameters") or {},
        }
        for tool in body.get("tools") or []
        if isinstance(tool, dict)
        for d in tool.get("functionDeclarations") or []
        if isinstance(d, dict)
    ]
    return out or None


def session_key(body: dict[str, Any]) -> str:
    """The Gemini API sends nothing stable per conversation, so its start names it: the
    system instruction and the first content."""
    contents = body.get("contents") or [None]
    seed = orjson.dumps([body.get("systemInstruction"), contents[0]])
    return "h" + hashlib.sha256(seed).hexdigest()[:31]


def usage(metadata: Any) -> dict[str, int] | None:
    """`usageMetadata` as the engine records usage: the prompt less what the implicit cache
    read, and that read (Gemini counts cached tokens inside `promptTokenCount`)."""
    if not isinstance(metadata, dict) or not isinstance(metadata.get("promptTokenCount"), int):
        return None
    cached = metadata.get("cachedContentTokenCount")
    cached = cached if isinstance(cached, int) else 0
    return {
        "input_tokens": metadata["promptTokenCount"] - cached,
        "cache_read_input_tokens": cached,
    }


def overflow_numbers(message: str) -> tuple[int, int] | None:
    """(prompt tokens, limit) from the API's "input token count exceeds" refusal."""
    found = OVERFLOW.search(message or "")
    return (int(found.group(1)), int(found.group(2))) if found else None
