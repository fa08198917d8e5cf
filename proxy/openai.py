"""What OpenAI's two APIs share, for their adapters (`responses`, `chat`): the error shape, the
session key, the content-type refusal, a context-length refusal read, usage in the stats' terms,
and a summary asked of the client's own model.

Tier 1 clears client-side on these sessions (the provider has no context-editing API to clear
server-side), and a request carries no `cache_control`. The instructions and the leading
developer/system messages are the prompt's fixed start: counted by the budget as the system
prompt, sent as the client wrote them, never compacted.
"""

from __future__ import annotations

import abc
from collections.abc import Mapping
from typing import Any

import orjson

from ..context.recall import RECALL_TOOL
from ..context.recall import TOOL_NAME as RECALL_NAME
from ..context.summarizer.types import SummaryFailure, SummaryRequest, SummaryResult
from ..context.tiers.reactive import Overflow, parse_overflow
from ..service.stats import Usage
from .http import post_json
from .wire import (
    ApiError,
    Credentials,
    Incoming,
    SessionKey,
    Turn,
    Wire,
    invalid,
    json_content,
    json_object,
    opening,
)

SESSION_CONFIG = {"microcompactMode": "time"}
"""What a session the OpenAI APIs fill is opened with: client-side clears (no server path)."""
SESSION_HEADERS = ("session-id", "session_id", "conversation_id", "thread-id")
NOTHING_TO_KEEP = "it holds only the instructions, no conversation to keep"

_OPENAI_TYPES = {
    "invalid_request_error": "invalid_request_error",
    "not_found_error": "invalid_request_error",
    "request_too_large": "invalid_request_error",
    "api_error": "server_error",
}


def error_body(exc: ApiError) -> dict[str, Any]:
    """OpenAI's error shape: `{"error": {message, type, param, code}}`."""
    return {
        "error": {
            "message": exc.message,
            "type": _OPENAI_TYPES.get(exc.kind, exc.kind),
            "param": None,
            "code": exc.code or ("not_found" if exc.status == 404 else None),
        }
    }


def error_envelope(exc: ApiError) -> dict[str, Any]:
    """`exc` in OpenAI's error shape: the upstream's own words where it refused in it."""
    own = exc.own_body()
    if isinstance(own, dict) and isinstance(own.get("error"), dict):
        return own
    return error_body(exc)


def session_key(headers: Mapping[str, str], body: dict[str, Any], opens: list[Any]) -> SessionKey:
    """Codex's session (a header, or `prompt_cache_key`), else what starts the conversation
    (`opening`: its instructions and first message, the same in every request of it)."""
    for name in SESSION_HEADERS:
        value = headers.get(name)
        if value:
            return SessionKey(str(value), True)
    for key in ("prompt_cache_key", "user"):
        if isinstance(body.get(key), str) and body[key]:
            return SessionKey(body[key], True)
    return opening(*opens)


def text_of(parts: Any) -> str:
    if isinstance(parts, str):
        return parts
    return "\n".join(
        str(p.get("text", "")) for p in parts or [] if isinstance(p, dict) and "text" in p
    )


def arguments(raw: Any) -> dict[str, Any]:
    """A call's `arguments` string as the input the session keeps."""
    if isinstance(raw, str):
        try:
            value = orjson.loads(raw) if raw.strip() else {}
        except orjson.JSONDecodeError:
            return {"arguments": raw}
        return value if isinstance(value, dict) else {"arguments": raw}
    return raw if isinstance(raw, dict) else {}


def recall_call(call_id: Any, raw_arguments: Any) -> dict[str, Any]:
    """A `compactd_recall` call as the `tool_use` block the proxy answers."""
    return {
        "type": "tool_use",
        "id": call_id,
        "name": RECALL_NAME,
        "input": arguments(raw_arguments),
    }


def recall_function() -> dict[str, Any]:
    """`compactd_recall`'s name, description and parameters as an OpenAI function."""
    return {
        "name": RECALL_NAME,
        "description": RECALL_TOOL["description"],
        "parameters": RECALL_TOOL["input_schema"],
    }


def counted(usage: Any, prompt: str, details: str, output: str) -> Usage | None:
    """An OpenAI usage in the stats' terms: `prompt` holds the cached tokens (`details`
    `.cached_tokens`); OpenAI bills no cache write."""
    if not isinstance(usage, dict) or not isinstance(usage.get(prompt), int):
        return None
    found = usage.get(details)
    cached = found.get("cached_tokens") if isinstance(found, dict) else None
    cached = cached if isinstance(cached, int) else 0
    out = usage.get(output)
    return Usage(
        input=usage[prompt] - cached, cache_read=cached, output=out if isinstance(out, int) else 0
    )


def recorded(usage: Any, prompt: str) -> dict[str, Any] | None:
    """An OpenAI usage as the session records it (the prompt's count, for calibration)."""
    if not isinstance(usage, dict) or not isinstance(usage.get(prompt), int):
        return None
    return {"input_tokens": usage[prompt]}


class OpenAIWire(Wire):
    """What both OpenAI adapters share."""

    upstream = "openai"
    session_config = SESSION_CONFIG
    auth_headers = ("authorization",)

    def check_content_type(self, value: str | None) -> None:
        if not json_content(value):
            raise ApiError(
                400,
                "invalid_request_error",
                f"Unsupported content type: {value!r}. This API method only accepts "
                f"'application/json' requests, but you specified the header 'Content-Type: "
                f"{value}'. Please try again with a supported content type.",
                "unsupported_content_type",
            )

    def not_json(self) -> ApiError:
        return invalid("We could not parse the JSON body of your request.")

    def body_of(self, incoming: Incoming) -> dict[str, Any]:
        """The body as a JSON object with a model, or the API's refusal."""
        body = incoming.body
        if not isinstance(body, dict):
            raise invalid("The body of your request must be a JSON object.")
        if not isinstance(body.get("model"), str) or not body["model"]:
            raise invalid("model: a model is required")
        return body

    @staticmethod
    def capped(out: dict[str, Any], key: str, turn: Turn, reserve: int | None) -> None:
        """With `--window`, the output limit the client asked for lowered to the reserve."""
        if reserve is not None and turn.max_output > 0:
            out[key] = min(turn.max_output, reserve)

    def error_body(self, exc: ApiError) -> dict[str, Any]:
        return error_body(exc)

    def overflow(self, status: int, data: bytes) -> Overflow | None:
        """A context-length refusal, as the engine's `Overflow`."""
        error = (json_object(data) or {}).get("error")
        if not isinstance(error, dict):
            return None
        message = str(error.get("message") or "")
        if error.get("code") == "context_length_exceeded" and "context" not in message.lower():
            message = f"{message} (context_length_exceeded)"
        return parse_overflow(status, message)

    @abc.abstractmethod
    def summary_request(self, request: SummaryRequest, model: str) -> tuple[str, dict[str, Any]]:
        """The path and body of a summary request on this API."""

    @abc.abstractmethod
    def summary_answer(self, answer: dict[str, Any]) -> tuple[str, bool, int, int]:
        """(text, whether it stopped at its token limit, input tokens, output tokens)."""

    async def summarize(
        self, held: Credentials, request: SummaryRequest, *, model: str, timeout: float
    ) -> SummaryResult:
        """One summary, non-streamed; an answer cut short by its token limit is a failure."""
        path, body = self.summary_request(request, model)
        headers = {"authorization": held.headers.get("authorization", "")}
        status, answer = await post_json(held.upstream.rstrip("/") + path, headers, body, timeout)
        if status != 200:
            error = answer.get("error")
            error = error if isinstance(error, dict) else {}
            message = str(error.get("message") or f"HTTP {status}")[:300]
            kind = {401: "auth", 403: "auth", 429: "rate_limited"}.get(status, "other")
            if error.get("code") == "context_length_exceeded":
                kind = "prompt_too_long"
            raise SummaryFailure(
                kind, f"the upstream refused the summary: {message}", status=status
            )
        if not answer:
            raise SummaryFailure("other", "the upstream's answer is not a JSON object")
        text, cut, tokens_in, tokens_out = self.summary_answer(answer)
        if cut:
            raise SummaryFailure("other", "the summary stopped at its token limit (incomplete)")
        if not text.strip():
            raise SummaryFailure("empty", "the model returned no summary text")
        return SummaryResult(
            text=text.strip(),
            model=str(answer.get("model") or model),
            input_tokens=int(tokens_in or 0),
            output_tokens=int(tokens_out or 0),
        )


class OpenAIRelay:
    """What both OpenAI relays keep across an answer's rounds: each round's usage in the
    stats' terms, the first one's as the session records it."""

    def __init__(self, *, recall: bool) -> None:
        self.recall = recall
        self.rounds: list[Usage | None] = []
        self.reported: dict[str, Any] | None = None
        self.continuing = False  # a follow-up stream carries on the client's answer
        self.ended = False  # this upstream stream reached its last event
        self.failed = False  # the upstream reported a failure in it

    def round_used(self, usage: Any, prompt: str, details: str, output: str) -> None:
        if not self.rounds:
            self.reported = recorded(usage, prompt)
        self.rounds.append(counted(usage, prompt, details, output))

    @property
    def applied_edits(self) -> list[dict[str, Any]] | None:
        return None  # no context edits on these APIs

    @property
    def whole_at_close(self) -> bool:
        """A clean close now leaves the client a whole answer."""
        return self.ended

    def continue_with_next_stream(self) -> None:
        self.continuing = True
        self.ended = False

    def mixed_calls(self) -> list[dict[str, Any]]:
        return []  # a recall beside the client's own calls is not answered on these APIs
