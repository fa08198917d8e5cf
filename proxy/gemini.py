"""The Gemini API's adapter (`/v1beta/models/{model}:generateContent`,
`:streamGenerateContent?alt=sse`, `:countTokens`: what Gemini CLI speaks): a request's
`contents` read as the session's messages (the Anthropic-shaped blocks `session/append` takes)
and compactd's rendering written back as `contents`; its answers relayed chunk by chunk, its
failures in its own shape (`{"error": {code, message, status}}`, also as an SSE event in a
stream, which the SDKs raise on), its `usageMetadata` with the implicit cache, its "input token
count exceeds" refusal. The engine decides what the messages are.

What maps: text parts to text blocks, `inlineData` pictures to image blocks, a `functionCall`
to a `tool_use` and the `functionResponse` that answers it (the API pairs them by order within
the next turn) to its `tool_result`. A call's `thoughtSignature`, its own `id` and the response's
original `response` object ride on the block (`gemini`) and come back byte for byte; a part the
engine has no block for (thoughts, `fileData`, `executableCode`, …) rides whole in an opaque
`gemini_part` block. A second function response to a call its turn answered already (by the
call's id: Gemini CLI's `--resume` sends each one twice) is dropped, the first kept: the API
pairs responses with calls by count. A call without
an `id` gets one from its place in the conversation, which
the client never sees (it is removed on the way back). `systemInstruction` and `tools` are the
prompt's fixed start: counted as the system prompt, sent as the client wrote them.

`compactd_recall` is not offered on this wire (an answer's calls are relayed as they come, so
none can be held back); old results are cleared in the body (the API has no context edits), and
the prefix left untouched keeps the implicit cache's hits.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

import attrs
import orjson

from ..context.errors import CannotFit
from ..context.summarizer.types import SummaryFailure, SummaryRequest, SummaryResult
from ..context.tiers.reactive import Overflow
from ..service.stats import Usage
from .http import post_json, scrubbed
from .openai import SESSION_CONFIG
from .sse import Event
from .wire import (
    ApiError,
    Credentials,
    Incoming,
    Route,
    SessionKey,
    Turn,
    Wire,
    invalid,
    json_content,
    json_object,
    opening,
    over_window,
)

OPAQUE = "gemini_part"
VERSIONS = "v1beta|v1|v1alpha"
PATH = re.compile(rf"^/(?:{VERSIONS})/models/[^/:]+:\w+$")
OVERFLOW = re.compile(
    r"input token count \((\d+)\) exceeds the maximum number of tokens allowed \((\d+)\)"
)
STATUS = {
    "invalid_request_error": "INVALID_ARGUMENT",
    "request_too_large": "INVALID_ARGUMENT",
    "not_found_error": "NOT_FOUND",
    "timeout_error": "DEADLINE_EXCEEDED",
    "rate_limit_error": "RESOURCE_EXHAUSTED",
    "api_error": "INTERNAL",
}
"""The API's `error.status` for each of the proxy's kinds of failure."""
KEY_HEADER = "x-goog-api-key"


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
            raise invalid(f"Invalid value at 'contents[{ci}]'")
        role = content.get("role", "user")
        parts = content.get("parts")
        if role not in ("user", "model"):
            raise invalid("Please use a valid role: user, model.")
        if not isinstance(parts, list) or not parts:
            raise invalid(f"contents[{ci}].parts: contents.parts must not be empty.")
        blocks: list[dict[str, Any]] = []
        calls: list[dict[str, Any]] = []
        answered = 0
        seen: set[str] = set()  # the call ids this turn's function responses answered
        for pi, part in enumerate(parts):
            if not isinstance(part, dict):
                raise invalid(f"Invalid value at 'contents[{ci}].parts[{pi}]'")
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
                response_id = part["functionResponse"].get("id")
                if response_id and response_id in seen:
                    continue  # a second response to a call answered already: the first kept
                if response_id:
                    seen.add(str(response_id))
                if answered >= len(pending):
                    raise invalid(
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
            raise invalid(
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


def session_key(body: dict[str, Any]) -> SessionKey:
    """The Gemini API sends nothing stable per conversation, so its start names it: the
    system instruction and the first content."""
    contents = body.get("contents") or [None]
    return opening(body.get("systemInstruction"), contents[0])


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


def counted(metadata: Any) -> Usage | None:
    """`usageMetadata` in the stats' terms: the prompt less the implicit cache's read, that
    read, and the output (thoughts included: they are billed as output)."""
    read = usage(metadata)
    if read is None:
        return None
    out = sum(
        metadata.get(k) or 0
        for k in ("candidatesTokenCount", "thoughtsTokenCount")
        if isinstance(metadata.get(k), int)
    )
    return Usage(input=read["input_tokens"], cache_read=read["cache_read_input_tokens"], output=out)


def error_body(exc: ApiError) -> dict[str, Any]:
    """`exc` in the API's error shape (the upstream's own body where it said it)."""
    own = exc.own_body()
    if isinstance(own, dict) and isinstance(own.get("error"), dict):
        return own
    status = STATUS.get(exc.kind, "UNKNOWN")
    if exc.kind == "api_error" and exc.status in (502, 503):
        status = "UNAVAILABLE"
    return {"error": {"code": exc.status, "message": exc.message, "status": status}}


def _answer_text(answer: dict[str, Any]) -> tuple[str, str]:
    """The first candidate's text (thoughts left out) and its finish reason."""
    candidate = (answer.get("candidates") or [{}])[0] or {}
    parts = (candidate.get("content") or {}).get("parts") or []
    text = "".join(
        str(p.get("text", "")) for p in parts if isinstance(p, dict) and not p.get("thought")
    )
    return text, str(candidate.get("finishReason") or "")


def _blocked(feedback: Any) -> bool:
    """A prompt the API blocked: its answer ends with no candidate to finish."""
    return isinstance(feedback, dict) and bool(feedback.get("blockReason"))


# ---- the answer --------------------------------------------------------------------------------


class GeminiAnswer:
    """A Gemini answer, streamed or whole: each chunk passes through as it comes, the usage is
    read from the chunk that finishes the candidate (it carries the whole count), and an
    `error` chunk is the API's own failure, relayed. No recall rounds (see the module)."""

    def __init__(self) -> None:
        self.rounds: list[Usage | None] = []
        self.reported: dict[str, Any] | None = None
        self.ended = False
        self.failed = False
        self._answer: dict[str, Any] = {}

    @property
    def applied_edits(self) -> list[dict[str, Any]] | None:
        return None

    def _used(self, metadata: Any) -> None:
        self.reported = usage(metadata)
        self.rounds = [counted(metadata)]

    def event(self, event: Event) -> bytes | None:
        data = event.data
        if not isinstance(data, dict):
            return event.raw
        if isinstance(data.get("error"), dict):
            self.ended = self.failed = True
            return scrubbed(event.raw)
        if isinstance(data.get("usageMetadata"), dict):
            self._used(data["usageMetadata"])
        if any(
            isinstance(c, dict) and c.get("finishReason") for c in data.get("candidates") or []
        ) or _blocked(data.get("promptFeedback")):
            self.ended = True
        return event.raw

    @property
    def whole_at_close(self) -> bool:
        return self.ended

    def continue_with_next_stream(self) -> None:
        raise AssertionError("no recall rounds on the Gemini API")

    def failure(self, exc: ApiError) -> bytes:
        """A failure as the API says one mid-stream: an event holding only `error` (the SDKs
        raise it as the API's error)."""
        return b"data: " + orjson.dumps(error_body(exc)) + b"\r\n\r\n"

    def take(self, answer: dict[str, Any]) -> None:
        self._answer = answer
        self._used(answer.get("usageMetadata"))

    def answer(self) -> dict[str, Any]:
        return self._answer

    def follow_up_calls(self) -> list[dict[str, Any]]:
        return []

    def follow_up(self, body: dict[str, Any], results: list[dict[str, Any]]) -> dict[str, Any]:
        raise AssertionError("no recall rounds on the Gemini API")

    def mixed_calls(self) -> list[dict[str, Any]]:
        return []


# ---- the adapter -------------------------------------------------------------------------------


def _route(method: str, verb: str, action: str) -> Route:
    return Route(
        method, f"/{{version:{VERSIONS}}}/models/{{model:[^/:]+}}:{{method:{verb}}}", action
    )


class GeminiWire(Wire):
    """The Gemini API (what Gemini CLI speaks; its key in `x-goog-api-key` or `?key=`)."""

    name = "gemini"
    upstream = "gemini"
    session_config = SESSION_CONFIG  # client-side clears: no context edits on this API
    own_headers = ("x-goog-",)
    auth_headers = (KEY_HEADER,)

    def routes(self) -> list[Route]:
        return [
            _route("POST", "generateContent", "generate"),
            _route("POST", "streamGenerateContent", "generate"),
            _route("POST", "countTokens", "count"),
            Route("GET", "/{version:v1beta|v1alpha}/models", "forward"),
            Route("GET", "/{version:v1beta|v1alpha}/models/{model}", "forward"),
        ]

    def owns(self, path: str) -> bool:
        return bool(PATH.match(path)) or path.startswith(("/v1beta/", "/v1alpha/"))

    def check_content_type(self, value: str | None) -> None:
        if not json_content(value):
            raise invalid(f"Invalid JSON payload received. Unsupported content type {value!r}.")

    def not_json(self) -> ApiError:
        return invalid("Invalid JSON payload received. Unexpected token.")

    def read(self, incoming: Incoming) -> Turn:
        body = incoming.body
        if not isinstance(body, dict):
            raise invalid(
                'Invalid JSON payload received. Unknown name "": Root element must be a message.'
            )
        contents = body.get("contents")
        if not isinstance(contents, list) or not contents:
            raise invalid("* GenerateContentRequest.contents: contents is not specified")
        config = body.get("generationConfig")
        limit = config.get("maxOutputTokens") if isinstance(config, dict) else None
        return Turn(
            body=body,
            model=str(incoming.params.get("model", "")),
            messages=contents_to_messages(contents),
            key=session_key(body),
            system=system_text(body),
            tools=tools_of(body),
            max_output=limit if isinstance(limit, int) and limit > 0 else 0,
            stream=incoming.params.get("method") == "streamGenerateContent",
            recall=False,
        )

    def read_count(self, incoming: Incoming) -> Turn | None:
        body = incoming.body
        if not isinstance(body, dict):
            raise invalid(
                'Invalid JSON payload received. Unknown name "": Root element must be a message.'
            )
        inner = body.get("generateContentRequest")
        request = inner if isinstance(inner, dict) else body
        try:
            turn = self.read(attrs.evolve(incoming, body=request))
        except ApiError:
            return None  # counted as the client sent it (the upstream says what is wrong)
        return attrs.evolve(turn, body=body)

    def outgoing(
        self,
        turn: Turn,
        rendered: dict[str, Any],
        *,
        recall: bool,
        notes: list[dict[str, Any]] | None,
        reserve: int | None,
    ) -> dict[str, Any]:
        out = {**turn.body, "contents": messages_to_contents(rendered["messages"])}
        if reserve is not None and turn.max_output > 0:
            out["generationConfig"] = {
                **turn.body["generationConfig"],
                "maxOutputTokens": min(turn.max_output, reserve),
            }
        return out

    def counted_body(
        self, turn: Turn, rendered: dict[str, Any], tail: list[dict[str, Any]]
    ) -> dict[str, Any]:
        contents = messages_to_contents([*rendered["messages"], *tail])
        inner = turn.body.get("generateContentRequest")
        if isinstance(inner, dict):
            return {**turn.body, "generateContentRequest": {**inner, "contents": contents}}
        return {**turn.body, "contents": contents}

    def stream_relay(self, recall: bool) -> GeminiAnswer:
        return GeminiAnswer()

    def whole_relay(self, recall: bool) -> GeminiAnswer:
        return GeminiAnswer()

    def error_body(self, exc: ApiError) -> dict[str, Any]:
        return error_body(exc)

    def too_long(self, exc: CannotFit) -> ApiError:
        limit, tokens = over_window(exc)
        return invalid(
            f"The input token count ({tokens}) exceeds the maximum number of tokens allowed "
            f"({limit})."
        )

    def overflow(self, status: int, data: bytes) -> Overflow | None:
        error = (json_object(data) or {}).get("error")
        if status != 400 or not isinstance(error, dict):
            return None
        message = str(error.get("message") or "")
        numbers = overflow_numbers(message)
        if numbers is None:
            return None
        return Overflow(status, message, numbers[0], numbers[1])

    def secrets(self, headers: Mapping[str, str], query: Mapping[str, str]) -> list[str]:
        return [v for v in (headers.get(KEY_HEADER), query.get("key")) if v]

    def credentials(self, headers: Mapping[str, str], query: Mapping[str, str]) -> dict[str, str]:
        key = headers.get(KEY_HEADER) or query.get("key")
        return {KEY_HEADER: key} if key else {}

    async def summarize(
        self, held: Credentials, request: SummaryRequest, *, model: str, timeout: float
    ) -> SummaryResult:
        """One summary from `generateContent`, with the client's key; an answer cut short by
        its token limit is a failure."""
        url = f"{held.upstream.rstrip('/')}/v1beta/models/{model}:generateContent"
        body = {
            "systemInstruction": {"parts": [{"text": request.system}]},
            "contents": [{"role": "user", "parts": [{"text": request.prompt}]}],
            "generationConfig": {"maxOutputTokens": request.max_output_tokens},
        }
        headers = {KEY_HEADER: held.headers.get(KEY_HEADER, "")}
        status, answer = await post_json(url, headers, body, timeout)
        if status != 200:
            error = answer.get("error") if isinstance(answer.get("error"), dict) else {}
            message = str(error.get("message") or f"HTTP {status}")[:300]
            kind = {401: "auth", 403: "auth", 429: "rate_limited"}.get(status, "other")
            if overflow_numbers(message):
                kind = "prompt_too_long"
            raise SummaryFailure(
                kind, f"the upstream refused the summary: {message}", status=status
            )
        text, finish = _answer_text(answer)
        if finish == "MAX_TOKENS":
            raise SummaryFailure("other", "the summary stopped at its token limit (incomplete)")
        if not text.strip():
            raise SummaryFailure("empty", "the model returned no summary text")
        metadata = answer.get("usageMetadata") or {}
        return SummaryResult(
            text=text.strip(),
            model=str(answer.get("modelVersion") or model),
            input_tokens=int(metadata.get("promptTokenCount") or 0),
            output_tokens=int(metadata.get("candidatesTokenCount") or 0),
        )
