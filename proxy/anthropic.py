"""The Anthropic Messages API, read and written: what the proxy takes from a client's request and
what it sends upstream in its place. Pure functions over the provider's JSON; the engine decides
what the messages are.

What a request keeps as the client sent it: everything but `messages` — the model, `thinking`,
`metadata`, `output_config`, `tool_choice`, `stream`, its own `context_management` edits (merged
with Tier 1's, `clear_thinking` first as the API requires). What compactd places: the messages,
and every `cache_control` breakpoint (the client's are removed from what is stored and from the
system and tools, so the request never holds more than the API's four).
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping
from typing import Any

import attrs
import orjson

from ..context.errors import CannotFit
from ..context.recall import TOOL_NAME as RECALL_TOOL
from ..service.stats import Usage
from .sse import encode

CLEAR_THINKING = "clear_thinking_20251015"
PER_TURN_CONTROL = "per-turn-control-2026-07-01"
"""The beta under which a client may send `role: "system"` turns; the proxy sends none (see
`system_turn`), so it does not ask for it."""
SESSION_HEADER = "x-claude-code-session-id"
_SESSION_IN_USER_ID = re.compile(r"session_([0-9a-fA-F-]{8,64})")


class ApiError(Exception):
    """An answer in the API's own error shape: `{"type":"error","error":{type, message}}`
    (`code`: OpenAI's `error.code`, where its APIs have one)."""

    def __init__(self, status: int, kind: str, message: str, code: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.kind = kind
        self.message = message
        self.code = code

    def body(self) -> dict[str, Any]:
        return {"type": "error", "error": {"type": self.kind, "message": self.message}}

    def own_body(self) -> Any:
        """The upstream's own error body when the upstream said it (None: the proxy's)."""
        return None


def invalid(message: str) -> ApiError:
    return ApiError(400, "invalid_request_error", message)


def error_envelope(exc: ApiError) -> dict[str, Any]:
    """`exc` in this API's error shape: the upstream's own words where it refused in it."""
    own = exc.own_body()
    if isinstance(own, dict) and own.get("type") == "error" and isinstance(own.get("error"), dict):
        return own
    return exc.body()


def error_event(exc: ApiError) -> bytes:
    """A failure inside a stream, as the Messages API reports one: an `error` event (the SDKs
    raise on it; a stream that just ends would be taken for a whole message)."""
    return encode("error", error_envelope(exc))


def is_anthropic_request(headers: Mapping[str, str]) -> bool:
    """A request written for the Messages API: its SDKs send `anthropic-version` (and
    `x-api-key`, or a bearer token); OpenAI's send neither."""
    return "anthropic-version" in headers or "x-api-key" in headers


def check_content_type(value: str | None, wire: str) -> None:
    """A body the APIs read is JSON: another content type is refused as they refuse it (a
    400 naming it) before anything is kept; no header at all is taken as JSON."""
    media = (value or "application/json").split(";", 1)[0].strip().lower()
    if media == "application/json" or (
        media.startswith("application/") and media.endswith("+json")
    ):
        return
    if wire == "anthropic":
        raise invalid(
            f"Unsupported content type: {value!r}. This API accepts 'application/json' requests."
        )
    raise ApiError(
        400,
        "invalid_request_error",
        f"Unsupported content type: {value!r}. This API method only accepts "
        f"'application/json' requests, but you specified the header 'Content-Type: {value}'. "
        "Please try again with a supported content type.",
        "unsupported_content_type",
    )


def too_long(exc: CannotFit, wire: str) -> ApiError:
    """The proxy's own "cannot fit" in the words each API uses for a prompt over the window,
    so the agent's reaction to it — its own compaction — runs: `prompt is too long: N tokens
    > M maximum` (Messages), or `context_length_exceeded` (Chat Completions, Responses)."""
    limit = int(exc.data.get("limit") or 0)
    tokens = max(int(exc.data.get("tokens") or exc.data.get("reported") or 0), limit + 1)
    if wire == "chat":
        return ApiError(
            400,
            "invalid_request_error",
            f"This model's maximum context length is {limit} tokens. However, your messages "
            f"resulted in {tokens} tokens. Please reduce the length of the messages.",
            "context_length_exceeded",
        )
    if wire == "responses":
        return ApiError(
            400,
            "invalid_request_error",
            "Your input exceeds the context window of this model. Please adjust your input "
            "and try again.",
            "context_length_exceeded",
        )
    return invalid(f"prompt is too long: {tokens} tokens > {limit} maximum")


@attrs.frozen
class MessagesRequest:
    """A client's `/v1/messages` body, read: `messages` as the session stores them (no
    `cache_control`, `system` turns as user annotations), `system` and `tools` as the render
    takes them."""

    body: dict[str, Any]
    messages: list[dict[str, Any]]
    model: str
    max_tokens: int
    system: str | list[dict[str, Any]] | None
    tools: list[dict[str, Any]] | None
    cache_ttl: str | None
    stream: bool


def strip_cache_control(value: Any) -> Any:
    """`value` without any `cache_control` key, at any depth (the breakpoints are compactd's to
    place; a stored copy with them would differ from the next request's copy)."""
    if isinstance(value, dict):
        return {k: strip_cache_control(v) for k, v in value.items() if k != "cache_control"}
    if isinstance(value, list):
        return [strip_cache_control(v) for v in value]
    return value


def _ttl_of(value: Any) -> str | None:
    """The longest TTL the client's own breakpoints ask for (compactd's keep it)."""
    found: str | None = None
    if isinstance(value, dict):
        control = value.get("cache_control")
        if isinstance(control, dict) and control.get("ttl") == "1h":
            return "1h"
        for v in value.values():
            found = found or _ttl_of(v)
    elif isinstance(value, list):
        for v in value:
            found = found or _ttl_of(v)
    return found


def system_turn(message: dict[str, Any]) -> dict[str, Any]:
    """A mid-conversation `role: "system"` turn as a user annotation, the way Claude Code itself
    sends it when a server refuses the role: its text inside `<system-reminder>` tags."""
    content = message.get("content")
    texts = (
        [content]
        if isinstance(content, str)
        else [b.get("text", "") for b in content or [] if isinstance(b, dict)]
    )
    text = "\n".join(t for t in texts if t)
    return {
        "role": "user",
        "meta": True,
        "content": [{"type": "text", "text": f"<system-reminder>\n{text}\n</system-reminder>"}],
    }


def read_messages_request(body: Any) -> MessagesRequest:
    """The parts of a Messages body the proxy needs; `ApiError` (400) naming the first field
    that is not what the API takes."""
    if not isinstance(body, dict):
        raise invalid("body: Input should be a valid dictionary")
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise invalid("model: Field required")
    max_tokens = body.get("max_tokens")
    if not isinstance(max_tokens, int) or isinstance(max_tokens, bool) or max_tokens < 0:
        raise invalid("max_tokens: Input should be a valid integer greater than or equal to 0")
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise invalid("messages: Input should be a non-empty list")
    stored = []
    for i, message in enumerate(messages):
        if not isinstance(message, dict):
            raise invalid(f"messages.{i}: Input should be a valid dictionary")
        if message.get("role") == "system":
            stored.append(system_turn(message))
        else:
            stored.append(strip_cache_control(message))
    system = body.get("system")
    if system is not None and not isinstance(system, str | list):
        raise invalid("system: Input should be a valid string or list")
    tools = body.get("tools")
    if tools is not None and not isinstance(tools, list):
        raise invalid("tools: Input should be a valid list")
    return MessagesRequest(
        body=body,
        messages=stored,
        model=model,
        max_tokens=max_tokens,
        system=strip_cache_control(system),
        tools=strip_cache_control(tools),
        cache_ttl=_ttl_of([system, tools, messages]),
        stream=body.get("stream") is True,
    )


@attrs.frozen
class SessionKey:
    """Which session a request belongs to: `value` is the session the client names
    (`named`), or a digest of how its conversation starts — conversations that start alike
    are then told apart by the proxy (`Proxy._keyless`)."""

    value: str
    named: bool


def opening(*parts: Any) -> SessionKey:
    """The key of a conversation that names no session: a digest of how it starts."""
    return SessionKey("h" + hashlib.sha256(orjson.dumps(parts)).hexdigest()[:31], False)


def session_key(headers: Mapping[str, str], body: dict[str, Any]) -> SessionKey:
    """Claude Code's session header, else the session id inside `metadata.user_id`, else the
    system prompt and the first message (`opening`)."""
    header = headers.get(SESSION_HEADER)
    if header:
        return SessionKey(header, True)
    metadata = body.get("metadata")
    user_id = metadata.get("user_id") if isinstance(metadata, dict) else None
    if isinstance(user_id, str) and user_id:
        try:
            parsed = orjson.loads(user_id)
        except orjson.JSONDecodeError:
            parsed = None
        if isinstance(parsed, dict) and isinstance(parsed.get("session_id"), str):
            return SessionKey(parsed["session_id"], True)
        found = _SESSION_IN_USER_ID.search(user_id)
        if found:
            return SessionKey(found.group(1), True)
    first = (body.get("messages") or [None])[0]
    return opening(strip_cache_control(body.get("system")), strip_cache_control(first))


def merge_context_management(client: Any, ours: dict[str, Any] | None) -> dict[str, Any] | None:
    """The client's edits and Tier 1's in one list, `clear_thinking` first (the API requires
    it). Where both clear tool uses, compactd's edit is the one sent: its accounting of what
    the model sees depends on it."""
    client_edits = list(client.get("edits") or []) if isinstance(client, dict) else []
    our_edits = list((ours or {}).get("edits") or [])
    if not client_edits and not our_edits:
        return client if isinstance(client, dict) else None
    our_types = {e.get("type") for e in our_edits}
    kept = [e for e in client_edits if not (isinstance(e, dict) and e.get("type") in our_types)]
    edits = [*kept, *our_edits]
    edits.sort(key=lambda e: not (isinstance(e, dict) and e.get("type") == CLEAR_THINKING))
    merged = dict(client) if isinstance(client, dict) else {}
    merged["edits"] = edits
    return merged


def merge_betas(client: str | None, ours: str | None) -> str | None:
    """One `anthropic-beta` header: the client's betas, then any of compactd's it lacks, less
    the one for system turns (none are sent)."""
    names: list[str] = []
    for header in (client, ours):
        for name in (header or "").split(","):
            name = name.strip()
            if name and name not in names and name != PER_TURN_CONTROL:
                names.append(name)
    return ",".join(names) or None


def upstream_body(
    request: MessagesRequest, rendered: dict[str, Any], *, max_tokens: int | None = None
) -> dict[str, Any]:
    """The client's body with compactd's messages, system and tools (breakpoints placed as its
    render placed them) and the merged context edits."""
    body = dict(request.body)
    body["messages"] = rendered["messages"]
    if "system" in rendered:
        body["system"] = rendered["system"]
    else:
        body.pop("system", None)
    if "tools" in rendered:
        body["tools"] = rendered["tools"]
    merged = merge_context_management(
        request.body.get("context_management"), rendered.get("context_management")
    )
    if merged is not None:
        body["context_management"] = merged
    if max_tokens is not None:
        body["max_tokens"] = max_tokens
    return body


def recall_calls(content: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], bool]:
    """The `compactd_recall` calls among a message's blocks, and whether it also calls a tool
    of the client's."""
    ours = [b for b in content if b.get("type") == "tool_use" and b.get("name") == RECALL_TOOL]
    theirs = any(b.get("type") == "tool_use" and b.get("name") != RECALL_TOOL for b in content)
    return ours, theirs


def prompt_tokens(usage: Mapping[str, Any]) -> int:
    """The whole prompt a response's usage counts (input + cache creation + cache read)."""
    return sum(
        int(usage.get(k) or 0)
        for k in ("input_tokens", "cache_creation_input_tokens", "cache_read_input_tokens")
    )


def counted(usage: Any) -> Usage | None:
    """A Messages answer's `usage` in the stats' terms: uncached input, cache reads
    (`cache_read_input_tokens`), cache writes (`cache_creation_input_tokens`), output."""
    if not isinstance(usage, Mapping) or not isinstance(usage.get("input_tokens"), int):
        return None
    return Usage(
        input=int(usage.get("input_tokens") or 0),
        cache_read=int(usage.get("cache_read_input_tokens") or 0),
        cache_write=int(usage.get("cache_creation_input_tokens") or 0),
        output=int(usage.get("output_tokens") or 0),
    )


def fit_thinking(body: dict[str, Any]) -> None:
    """An `enabled` thinking budget must stay under `max_tokens` (the API refuses it otherwise),
    so when the proxy lowers `max_tokens` to a capped window's reserve the budget follows; with
    no room for the API's minimum budget (1,024) thinking is left adaptive."""
    thinking = body.get("thinking")
    if not isinstance(thinking, dict) or thinking.get("type") != "enabled":
        return
    budget = thinking.get("budget_tokens")
    max_tokens = body.get("max_tokens", 0)
    if isinstance(budget, int) and budget >= max_tokens:
        if max_tokens > 1024:
            body["thinking"] = {**thinking, "budget_tokens": max_tokens - 1}
        else:
            body["thinking"] = {"type": "adaptive"}


def with_notes(messages: list[dict[str, Any]], notes: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """`messages` with text blocks added at the end of the last (user) message: what a recall
    made beside the client's own calls returned."""
    if not messages or messages[-1].get("role") != "user":
        return messages
    last = messages[-1]
    content = last.get("content")
    blocks = [{"type": "text", "text": content}] if isinstance(content, str) else list(content)
    return [*messages[:-1], {**last, "content": [*blocks, *notes]}]
