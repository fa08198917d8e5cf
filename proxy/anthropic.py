"""The Anthropic Messages API's adapter (`/v1/messages`, `/v1/messages/count_tokens`): what the
proxy takes from a client's request, what it sends upstream in its place, and how the answer's
stream reaches the client. The engine decides what the messages are.

What a request keeps as the client sent it: everything but `messages` — the model, `thinking`,
`metadata`, `output_config`, `tool_choice`, `stream`, its own `context_management` edits (merged
with Tier 1's, `clear_thinking` first as the API requires). What compactd places: the messages,
and every `cache_control` breakpoint (the client's are removed from what is stored and from the
system and tools, so the request never holds more than the API's four).

The stream is forwarded event by event while the adapter assembles the message (its usage, the
context edits the provider applied, its calls). When a message calls nothing but
`compactd_recall`, its end is held: the next stream continues the same message for the client
(its `message_start` dropped, its blocks numbered on from the first one's). Thinking blocks and
their signatures pass through byte for byte.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Mapping
from typing import Any

import attrs
import orjson
from anthropic import Omit

from ..context.errors import CannotFit
from ..context.recall import TOOL_NAME as RECALL_TOOL
from ..context.summarizer.types import SummaryRequest, SummaryResult
from ..context.tiers.reactive import Overflow, parse_overflow
from ..service.providers.anthropic_provider import AnthropicSummaryProvider
from ..service.stats import Usage
from .http import scrubbed
from .sse import Event, encode
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

CLEAR_THINKING = "clear_thinking_20251015"
PER_TURN_CONTROL = "per-turn-control-2026-07-01"
"""The beta under which a client may send `role: "system"` turns; the proxy sends none (see
`system_turn`), so it does not ask for it."""
SESSION_HEADER = "x-claude-code-session-id"
_SESSION_IN_USER_ID = re.compile(r"session_([0-9a-fA-F-]{8,64})")


def is_anthropic_request(headers: Mapping[str, str]) -> bool:
    """A request written for the Messages API: its SDKs send `anthropic-version` (and
    `x-api-key`, or a bearer token); OpenAI's send neither."""
    return "anthropic-version" in headers or "x-api-key" in headers


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


_CACHE_CONTROL = b'"cache_control"'


def _has_cache_control(value: Any) -> bool:
    """Whether `cache_control` may be a key anywhere in `value`: orjson writes a long history
    out far faster than Python walks it, so most messages are passed over unwalked (a string
    that merely mentions the key only costs the walk)."""
    try:
        return _CACHE_CONTROL in orjson.dumps(value)
    except orjson.JSONEncodeError:
        return True


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
    marked = []  # the messages with breakpoints: the rest are kept as they came
    for i, message in enumerate(messages):
        if not isinstance(message, dict):
            raise invalid(f"messages.{i}: Input should be a valid dictionary")
        breakpoints = _has_cache_control(message)
        if breakpoints:
            marked.append(message)
        if message.get("role") == "system":
            stored.append(system_turn(message))
        else:
            stored.append(strip_cache_control(message) if breakpoints else message)
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
        cache_ttl=_ttl_of([system, tools, marked]),
        stream=body.get("stream") is True,
    )


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


BETA = "anthropic-beta"
"""The header that names the betas a request uses."""


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
    return client_body(request.body, rendered, max_tokens=max_tokens)


def client_body(
    fields: dict[str, Any], rendered: dict[str, Any], *, max_tokens: int | None = None
) -> dict[str, Any]:
    """`fields` (a client's body, its messages aside) with compactd's rendered messages,
    system and tools and the merged context edits: what goes upstream."""
    body = dict(fields)
    body["messages"] = rendered["messages"]
    if "system" in rendered:
        body["system"] = rendered["system"]
    else:
        body.pop("system", None)
    if "tools" in rendered:
        body["tools"] = rendered["tools"]
    merged = merge_context_management(
        fields.get("context_management"), rendered.get("context_management")
    )
    if merged is not None:
        body["context_management"] = merged
    if max_tokens is not None:
        body["max_tokens"] = max_tokens
    return body


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


# ---- the answer, streamed or whole --------------------------------------------------------


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


class MessagesStream:
    """Decides, event by event, what of the upstream's streams the client gets."""

    def __init__(self, *, recall: bool) -> None:
        self.recall = recall
        self.next_index = 0  # the client's next content block index
        self.continuing = False  # a follow-up stream: the client has its message_start
        self.assembly = Assembly()
        self.first: Assembly | None = None  # the first stream's message (what usage is of)
        self.usages: list[dict[str, Any]] = []  # each finished round's usage, in order
        self.ended = False
        self.failed = False
        self._index: dict[int, int | None] = {}  # upstream index -> the client's, None: held
        self._holding_end = False

    def event(self, event: Event) -> bytes | None:
        """The bytes to forward for `event` (None: nothing, now)."""
        data = event.data
        if not isinstance(data, dict):
            return event.raw
        self.assembly.apply(data)
        kind = data.get("type")
        if kind == "message_stop":
            self.ended = True
        elif kind == "error":
            self.ended = self.failed = True
            return scrubbed(event.raw)
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
        self.usages.append(self.assembly.usage)
        self.assembly = Assembly()
        self._index = {}
        self._holding_end = False
        self.continuing = True
        self.ended = False

    @property
    def whole_at_close(self) -> bool:
        return self.ended

    def failure(self, exc: ApiError) -> bytes:
        return error_event(exc)

    @property
    def _first(self) -> Assembly:
        """The stream whose usage describes the request compactd rendered."""
        return self.first or self.assembly

    @property
    def rounds(self) -> list[Usage | None]:
        return [counted(u) for u in [*self.usages, self.assembly.usage]]

    @property
    def reported(self) -> dict[str, Any] | None:
        return self._first.usage

    @property
    def applied_edits(self) -> list[dict[str, Any]] | None:
        return (self._first.context_management or {}).get("applied_edits")

    def follow_up(self, body: dict[str, Any], results: list[dict[str, Any]]) -> dict[str, Any]:
        return _follow_up(body, self.assembly.content, results)

    def mixed_calls(self) -> list[dict[str, Any]]:
        return mixed_recall_calls(self.assembly.content, self.recall)


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


class WholeMessage:
    """A whole (non-streamed) Messages answer across its recall rounds: the first message's
    usage, every round's content, the last round's fields."""

    def __init__(self, *, recall: bool) -> None:
        self.recall = recall
        self.first: dict[str, Any] = {}
        self.latest: dict[str, Any] = {}
        self.content: list[dict[str, Any]] = []
        self.usages: list[Any] = []  # each round's usage, in order

    def take(self, message: dict[str, Any]) -> None:
        if not self.first:
            self.first = message
        self.latest = message
        self.usages.append(message.get("usage"))
        self.content += list(message.get("content") or [])

    @property
    def rounds(self) -> list[Usage | None]:
        return [counted(u) for u in self.usages]

    @property
    def reported(self) -> dict[str, Any] | None:
        usage = self.first.get("usage")
        return usage if isinstance(usage, dict) else None

    @property
    def applied_edits(self) -> list[dict[str, Any]] | None:
        return (self.first.get("context_management") or {}).get("applied_edits")

    def follow_up_calls(self) -> list[dict[str, Any]]:
        return follow_up_calls(self.latest.get("content") or [], self.recall)

    def follow_up(self, body: dict[str, Any], results: list[dict[str, Any]]) -> dict[str, Any]:
        return _follow_up(body, self.latest.get("content") or [], results)

    def mixed_calls(self) -> list[dict[str, Any]]:
        return mixed_recall_calls(self.latest.get("content") or [], self.recall)

    def answer(self) -> dict[str, Any]:
        return {**self.latest, "content": visible_content(self.content, self.recall)}


def _follow_up(
    body: dict[str, Any], content: list[dict[str, Any]], results: list[dict[str, Any]]
) -> dict[str, Any]:
    """The request that answers the model's recall calls: the one just sent, its answer, and
    the results (neither reaches the client nor the session)."""
    messages = [
        *body["messages"],
        {"role": "assistant", "content": content},
        {"role": "user", "content": results},
    ]
    return {**body, "messages": messages}


# ---- failures ------------------------------------------------------------------------------


def error_body(exc: ApiError) -> dict[str, Any]:
    """The Messages API's error shape: `{"type": "error", "error": {type, message}}`."""
    return {"type": "error", "error": {"type": exc.kind, "message": exc.message}}


def error_envelope(exc: ApiError) -> dict[str, Any]:
    """`exc` in this API's error shape: the upstream's own words where it refused in it."""
    own = exc.own_body()
    if isinstance(own, dict) and own.get("type") == "error" and isinstance(own.get("error"), dict):
        return own
    return error_body(exc)


def error_event(exc: ApiError) -> bytes:
    """A failure inside a stream, as the Messages API reports one: an `error` event (the SDKs
    raise on it; a stream that just ends would be taken for a whole message)."""
    return encode("error", error_envelope(exc))


def overflow(status: int, data: bytes) -> Overflow | None:
    """The API's "prompt is too long" refusal, read."""
    error = (json_object(data) or {}).get("error")
    message = str(error.get("message") or "") if isinstance(error, dict) else ""
    return parse_overflow(status, message)


# ---- the adapter ---------------------------------------------------------------------------


class AnthropicWire(Wire):
    """The Messages API (what Claude Code speaks)."""

    name = "anthropic"
    upstream = "anthropic"
    cache = True
    server_edits = True
    own_headers = ("x-api-key", "anthropic-")
    auth_headers = ("x-api-key", "authorization")
    # the betas go with a summary asked as a fork: they are part of the request it continues
    relayed_headers = ("anthropic-version", "anthropic-beta")

    def routes(self) -> list[Route]:
        return [
            Route("POST", "/v1/messages", "generate"),
            Route("POST", "/v1/messages/count_tokens", "count"),
            Route("GET", "/v1/models", "forward"),
            Route("GET", "/v1/models/{model}", "forward"),
        ]

    def owns(self, path: str) -> bool:
        return path.startswith("/v1/messages")

    def claims(self, headers: Mapping[str, str]) -> bool:
        """A model list asked for by the Messages API's SDKs: they send `anthropic-version`
        (and `x-api-key`, or a bearer token); OpenAI's send neither."""
        return is_anthropic_request(headers)

    def check_content_type(self, value: str | None) -> None:
        if not json_content(value):
            raise invalid(
                f"Unsupported content type: {value!r}. This API accepts 'application/json' "
                "requests."
            )

    def not_json(self) -> ApiError:
        return invalid("There was an error parsing the body of your request: invalid JSON")

    def read(self, incoming: Incoming) -> Turn:
        req = read_messages_request(incoming.body)
        return Turn(
            body=req.body,
            model=req.model,
            messages=req.messages,
            key=session_key(incoming.headers, req.body),
            system=req.system,
            tools=req.tools,
            max_output=req.max_tokens,
            cache_ttl=req.cache_ttl,
            stream=req.stream,
            kept=req,
        )

    def read_count(self, incoming: Incoming) -> Turn | None:
        body = incoming.body
        if not isinstance(body, dict):
            raise invalid("body: Input should be a valid dictionary")
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            return None
        try:
            turn = self.read(attrs.evolve(incoming, body={**body, "max_tokens": 1}))
        except ApiError:
            return None
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
        req: MessagesRequest = turn.kept
        limit = min(req.max_tokens, reserve) if reserve else None
        body = upstream_body(req, rendered, max_tokens=limit)
        if reserve is not None:
            fit_thinking(body)
        if notes:
            body["messages"] = with_notes(body["messages"], notes)
        return body

    def headers(
        self, turn: Turn, client: Mapping[str, str], rendered: Any
    ) -> dict[str, str | None]:
        """One `anthropic-beta`: the client's betas and compactd's."""
        ours = rendered.headers.get("anthropic-beta")
        return {"anthropic-beta": merge_betas(client.get("anthropic-beta"), ours)}

    def counted_body(
        self, turn: Turn, rendered: dict[str, Any], tail: list[dict[str, Any]]
    ) -> dict[str, Any]:
        counted_ = {**turn.body, "messages": [*rendered["messages"], *tail]}
        if "system" in rendered:
            counted_["system"] = rendered["system"]
        return strip_cache_control(counted_)

    def stream_relay(self, recall: bool) -> MessagesStream:
        return MessagesStream(recall=recall)

    def whole_relay(self, recall: bool) -> WholeMessage:
        return WholeMessage(recall=recall)

    def error_body(self, exc: ApiError) -> dict[str, Any]:
        return error_body(exc)

    def too_long(self, exc: CannotFit) -> ApiError:
        limit, tokens = over_window(exc)
        return invalid(f"prompt is too long: {tokens} tokens > {limit} maximum")

    def overflow(self, status: int, data: bytes) -> Overflow | None:
        return overflow(status, data)

    async def summarize(
        self, held: Credentials, request: SummaryRequest, *, model: str, timeout: float
    ) -> SummaryResult:
        """Through the Anthropic SDK, with the client's key or bearer token. A summary asked
        as a fork goes as the client's own request would: its fields (thinking, tool_choice,
        metadata, its context edits) with compactd's messages, and its betas with compactd's;
        a plain one without the client's betas."""
        skipped = ("x-api-key", "authorization", BETA)
        headers: dict[str, Any] = {k: v for k, v in held.headers.items() if k not in skipped}
        api_key = held.headers.get("x-api-key")
        bearer = held.headers.get("authorization", "")
        token = bearer[7:].strip() if bearer.lower().startswith("bearer ") else None
        if not api_key:  # the SDK would otherwise add the environment's key beside the token
            headers["X-Api-Key"] = Omit()
        fork = request.fork
        if fork is not None and fork.format == "anthropic":
            betas = merge_betas(held.headers.get(BETA), fork.headers.get(BETA))
            request = attrs.evolve(
                request,
                fork=attrs.evolve(
                    fork,
                    request=client_body(held.fields, fork.request),
                    headers={**fork.headers, **({BETA: betas} if betas else {})},
                ),
            )
        provider = AnthropicSummaryProvider(
            model=model,
            api_key=api_key or None,
            auth_token=None if api_key else token,
            base_url=held.upstream,
            default_headers=headers,
            timeout_seconds=timeout,
            wall_seconds=timeout,
        )
        try:
            return await provider.summarize(request)
        finally:
            await provider.aclose()
