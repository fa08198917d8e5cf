"""The OpenAI APIs, read and written: the Responses API (what Codex speaks) and Chat Completions.

A session holds one shape of message, the Anthropic-shaped blocks `session/append` takes, so the
adapters convert both ways: Chat Completions messages through the engine's own `from_openai`
and its OpenAI renderer; Responses items by hand, where everything the engine has no block for
(reasoning with its encrypted content, images, a developer message in mid-conversation) rides
in an opaque `openai_item` block and comes back byte for byte. A function call keeps its
arguments string unless Tier 1 shortened its input. The instructions and the leading
developer/system messages are the prompt's fixed start: counted by the budget as the system
prompt, sent as the client wrote them, never compacted.

Tier 1 clears client-side on these sessions (the provider has no context-editing API to clear
server-side), and a request carries no `cache_control`.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import aiohttp
import attrs
import orjson
from aiohttp import web

from ..context.decompose import Spec, from_anthropic, from_openai
from ..context.recall import RECALL_TOOL
from ..context.recall import TOOL_NAME as RECALL_NAME
from ..service.stats import Usage
from .anthropic import ApiError, SessionKey, check_content_type, invalid, opening
from .history import PassThrough
from .http import response_headers
from .relay import ClientStream, relay_answer, scrubbed, whole_answer
from .sse import Event, encode

OPENAI_PATHS = ("/v1/chat/completions", "/v1/responses")
SESSION_CONFIG = {"microcompactMode": "time"}
"""What a session the OpenAI APIs fill is opened with: client-side clears (no server path)."""
OPAQUE = "openai_item"
ASSISTANT_ITEMS = ("reasoning", "function_call", "custom_tool_call")
OUTPUT_ITEMS = {
    "function_call_output": "function_call",
    "custom_tool_call_output": "custom_tool_call",
}
SESSION_HEADERS = ("session-id", "session_id", "conversation_id", "thread-id")


_NOTHING_TO_KEEP = "it holds only the instructions, no conversation to keep"


def is_openai_path(path: str) -> bool:
    return path.startswith(OPENAI_PATHS)


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


def recall_function(kind: str) -> dict[str, Any]:
    """`compactd_recall` as an OpenAI tool (`responses` or `chat`)."""
    if kind == "chat":
        return {
            "type": "function",
            "function": {
                "name": RECALL_NAME,
                "description": RECALL_TOOL["description"],
                "parameters": RECALL_TOOL["input_schema"],
            },
        }
    return {
        "type": "function",
        "name": RECALL_NAME,
        "description": RECALL_TOOL["description"],
        "parameters": RECALL_TOOL["input_schema"],
        "strict": False,
    }


def session_key(headers: Any, body: dict[str, Any], conversation: list[Any]) -> SessionKey:
    """Codex's session (a header, or `prompt_cache_key`), else what starts the conversation
    (`opening`: its instructions and first message, the same in every request of it)."""
    for name in SESSION_HEADERS:
        value = headers.get(name)
        if value:
            return SessionKey(str(value), True)
    for key in ("prompt_cache_key", "user"):
        if isinstance(body.get(key), str) and body[key]:
            return SessionKey(body[key], True)
    return opening(*conversation)


def _text(parts: Any) -> str:
    if isinstance(parts, str):
        return parts
    return "\n".join(
        str(p.get("text", "")) for p in parts or [] if isinstance(p, dict) and "text" in p
    )


# ---- Responses: items <-> the session's messages -------------------------------------------


def _arguments(raw: Any) -> dict[str, Any]:
    if isinstance(raw, str):
        try:
            value = orjson.loads(raw) if raw.strip() else {}
        except orjson.JSONDecodeError:
            return {"arguments": raw}
        return value if isinstance(value, dict) else {"arguments": raw}
    return raw if isinstance(raw, dict) else {}


def _output_content(output: Any) -> Any:
    if isinstance(output, str):
        return output
    if isinstance(output, list):
        return [
            {"type": "text", "text": p.get("text", "")}
            if isinstance(p, dict) and p.get("type") in ("input_text", "output_text")
            else {"type": OPAQUE, "item": p}
            for p in output
        ]
    return orjson.dumps(output).decode()


IMAGE_TYPES = ("image/png", "image/jpeg", "image/gif", "image/webp")


def _image_block(part: dict[str, Any]) -> dict[str, Any] | None:
    """An `input_image` of inline bytes as the session's image block, so it is priced as an
    image (by its size), not as its base64 text; its other keys ride along for the way back.
    None for any other image (a URL, a file id): it stays an opaque item."""
    url = part.get("image_url")
    if not (isinstance(url, str) and url.startswith("data:") and ";base64," in url):
        return None
    media, data = url[5:].split(";base64,", 1)
    if media not in IMAGE_TYPES:
        return None
    rest = {k: v for k, v in part.items() if k not in ("type", "image_url")}
    block = {"type": "image", "source": {"type": "base64", "media_type": media, "data": data}}
    return {**block, "openai": rest} if rest else block


def _user_blocks(content: Any) -> list[dict[str, Any]]:
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    blocks = []
    for part in content or []:
        if isinstance(part, dict) and part.get("type") in ("input_text", "output_text"):
            blocks.append({"type": "text", "text": str(part.get("text", ""))})
        elif isinstance(part, dict) and part.get("type") == "input_image" and _image_block(part):
            blocks.append(_image_block(part) or {})
        else:
            blocks.append({"type": OPAQUE, "item": part})
    return blocks


def split_instructions(items: list[Any]) -> tuple[list[Any], list[Any]]:
    """The leading developer/system messages (the prompt's fixed start) and the rest."""
    n = 0
    while (
        n < len(items)
        and isinstance(items[n], dict)
        and items[n].get("role") in ("developer", "system")
        and items[n].get("type", "message") == "message"
    ):
        n += 1
    return items[:n], items[n:]


def items_to_messages(items: list[Any]) -> list[dict[str, Any]]:
    """Responses input items as the session's messages (see the module docstring): the items
    of one assistant turn (reasoning, text, calls) in one assistant message, each run of call
    outputs in one user message of results, every other item a message of its own."""
    messages: list[dict[str, Any]] = []

    def assistant(blocks: list[dict[str, Any]]) -> None:
        if messages and messages[-1]["role"] == "assistant":
            messages[-1]["content"].extend(blocks)
        else:
            messages.append({"role": "assistant", "content": blocks})

    results_open = False
    for i, item in enumerate(items):
        if not isinstance(item, dict):
            raise invalid(f"input[{i}]: Input should be a valid dictionary")
        kind = item.get("type", "message")
        role = item.get("role")
        is_result = kind in OUTPUT_ITEMS
        if kind == "message" and role == "user":
            messages.append({"role": "user", "content": _user_blocks(item.get("content"))})
        elif kind == "message" and role == "assistant":
            content = item.get("content")
            parts = (
                [{"type": "output_text", "text": content}] if isinstance(content, str) else content
            )
            assistant(
                [
                    {"type": "text", "text": str(part.get("text", ""))}
                    if isinstance(part, dict) and part.get("type") == "output_text"
                    else {"type": OPAQUE, "item": part}
                    for part in parts or []
                ]
            )
        elif kind == "message":  # a developer or system message in mid-conversation
            messages.append(
                {"role": "user", "meta": True, "content": [{"type": OPAQUE, "item": item}]}
            )
        elif kind in ("function_call", "custom_tool_call"):
            call_id = item.get("call_id")
            if not isinstance(call_id, str) or not call_id:
                raise invalid(f"input[{i}]: a {kind} needs a call_id")
            raw = item.get("arguments") if kind == "function_call" else item.get("input")
            args = _arguments(raw) if kind == "function_call" else {"input": raw}
            extra = {k: v for k, v in item.items() if k not in ("type", "call_id", "name")}
            assistant(
                [
                    {
                        "type": "tool_use",
                        "id": call_id,
                        "name": str(item.get("name", "")),
                        "input": args,
                        "openai": {"type": kind, **extra},
                    }
                ]
            )
        elif is_result:
            call_id = item.get("call_id")
            if not isinstance(call_id, str) or not call_id:
                raise invalid(f"input[{i}]: a {kind} needs a call_id")
            block = {
                "type": "tool_result",
                "tool_use_id": call_id,
                "content": _output_content(item.get("output")),
            }
            if results_open:
                messages[-1]["content"].append(block)
            else:
                messages.append({"role": "user", "content": [block]})
        elif kind in ASSISTANT_ITEMS or kind.endswith("_call"):
            assistant([{"type": OPAQUE, "item": item}])
        else:
            messages.append(
                {"role": "user", "meta": True, "content": [{"type": OPAQUE, "item": item}]}
            )
        results_open = is_result
    return messages


def _call_item(block: dict[str, Any]) -> dict[str, Any]:
    openai = dict(block.get("openai") or {"type": "function_call"})
    kind = openai.pop("type", "function_call")
    if kind == "custom_tool_call":
        value = block.get("input", {}).get("input", "")
        return {
            "type": kind,
            **openai,
            "call_id": block["id"],
            "name": block["name"],
            "input": value if isinstance(value, str) else orjson.dumps(value).decode(),
        }
    raw = openai.pop("arguments", None)
    if not (isinstance(raw, str) and _arguments(raw) == block.get("input")):
        raw = orjson.dumps(block.get("input", {})).decode()  # Tier 1 shortened it
    return {"type": kind, **openai, "call_id": block["id"], "name": block["name"], "arguments": raw}


def _result_output(content: Any) -> Any:
    if isinstance(content, str):
        return content
    if all(isinstance(b, dict) and b.get("type") == "text" for b in content or []):
        return "\n".join(b.get("text", "") for b in content)
    return [
        {"type": "input_text", "text": b.get("text", "")}
        if b.get("type") == "text"
        else b.get("item", {"type": "input_text", "text": f"[{b.get('type')} omitted]"})
        for b in content
    ]


def _text_item(role: str, texts: list[str]) -> dict[str, Any]:
    if role == "assistant":
        parts = [{"type": "output_text", "text": t, "annotations": []} for t in texts]
    else:
        parts = [{"type": "input_text", "text": t} for t in texts]
    return {"type": "message", "role": role, "content": parts}


def messages_to_items(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The rendered messages back as Responses input items, in their order: each run of text
    one message item, opaque items as they came, calls and their outputs as items."""
    items: list[dict[str, Any]] = []
    kinds: dict[str, str] = {}  # call id -> the kind of call (its output's kind follows)
    for message in messages:
        role = str(message.get("role"))
        texts: list[str] = []
        for block in message.get("content") or []:
            kind = block.get("type")
            if kind == "text":
                texts.append(block.get("text", ""))
                continue
            if kind == "thinking" or kind == "redacted_thinking":
                continue  # no place for them in this API
            if texts:
                items.append(_text_item(role, texts))
                texts = []
            if kind == OPAQUE:
                item = block.get("item") or {}
                if item.get("type") in ("input_image", "input_file", "refusal"):
                    item = {"type": "message", "role": role, "content": [item]}
                items.append(item)
            elif kind == "tool_use":
                call = _call_item(block)
                kinds[block["id"]] = call["type"]
                items.append(call)
            elif kind == "tool_result":
                use_id = block.get("tool_use_id", "")
                items.append(
                    {
                        "type": f"{kinds.get(use_id, 'function_call')}_output",
                        "call_id": use_id,
                        "output": _result_output(block.get("content", "")),
                    }
                )
            elif kind == "image":
                source = block.get("source") or {}
                url = f"data:{source.get('media_type')};base64,{source.get('data')}"
                part = {"type": "input_image", "image_url": url, **(block.get("openai") or {})}
                items.append({"type": "message", "role": "user", "content": [part]})
        if texts:
            items.append(_text_item(role, texts))
    return items


# ---- the handlers ------------------------------------------------------------------------


@attrs.frozen
class _Turn:
    """A request of an OpenAI API, placed in its session and rendered."""

    placed: Any
    params: Any
    rendered: Any
    max_out: int | None


async def _placed(
    proxy: Any,
    request: web.Request,
    body: dict[str, Any],
    *,
    seed: Any,
    messages: list[dict[str, Any]],
    decompose: Callable[[Any], list[Spec]],
    wire: str,
    system: str | None,
    max_out: Any,
    format: str,
    recall: bool | None = None,
) -> _Turn:
    """The steps both OpenAI APIs share: the upstream reachable, the history in its session
    (a client-side-clearing one) and rendered (no breakpoints). `PassThrough` when the
    history cannot be kept (the request then goes on as the client wrote it)."""
    await proxy.reachable(proxy.settings.openai_upstream)
    model = body["model"]
    limit = max_out if isinstance(max_out, int) and max_out > 0 else None
    tools = body.get("tools") if isinstance(body.get("tools"), list) else None

    def params(branch: str) -> Any:
        made = proxy._params(model, limit or 0, system, tools, None, branch, format)
        spec = attrs.evolve(made.spec, cache=False, recall=recall, server_edits=False)
        return attrs.evolve(made, spec=spec)

    placed, rendered_params, rendered = await proxy.place(
        session_key(request.headers, body, seed),
        messages,
        request,
        model,
        params,
        decompose=decompose,
        config=SESSION_CONFIG,
        wire=wire,
    )
    return _Turn(placed, rendered_params, rendered, limit)


def _capped(proxy: Any, out: dict[str, Any], key: str, turn: _Turn, rendered: Any) -> None:
    """With `--window`, the output limit the client asked for lowered to the reserve."""
    if proxy.settings.window is not None and turn.max_out is not None:
        out[key] = min(turn.max_out, rendered.budget.output_reserve)


async def responses(proxy: Any, request: web.Request) -> web.StreamResponse:
    body = await _body(request)
    if not isinstance(body.get("model"), str) or not body["model"]:
        raise invalid("model: a model is required")
    raw_input = body.get("input")
    items: list[Any] = (
        [{"type": "message", "role": "user", "content": raw_input}]
        if isinstance(raw_input, str)
        else raw_input
        if isinstance(raw_input, list)
        else []
    )
    if not items:
        raise invalid("input: Input should be a non-empty list of items or a string")
    fixed, rest = split_instructions(items)
    messages = items_to_messages(rest)
    if not messages:
        return await proxy._plain(request, body, _NOTHING_TO_KEEP, kind="no conversation")
    instructions = [body.get("instructions") or "", *(_text(i.get("content")) for i in fixed)]
    try:
        turn = await _placed(
            proxy,
            request,
            body,
            seed=[body.get("instructions"), *fixed, *rest[:1]],
            messages=messages,
            decompose=from_anthropic,
            wire="responses",
            system="\n\n".join(t for t in instructions if t) or None,
            max_out=body.get("max_output_tokens"),
            format="anthropic",
        )
    except PassThrough as why:
        return await proxy._plain(request, body, why.reason, why.session_id)
    recall = turn.placed.recall
    tools = body.get("tools") if isinstance(body.get("tools"), list) else []

    def build(rendered: Any) -> dict[str, Any]:
        out = dict(body)
        out["input"] = [*fixed, *messages_to_items(rendered.request["messages"])]
        if recall:
            out["tools"] = [*tools, recall_function("responses")]
        _capped(proxy, out, "max_output_tokens", turn, rendered)
        return out

    return await _exchange(
        proxy,
        request,
        turn,
        body["model"],
        build,
        ResponsesStream,
        stream=body.get("stream") is True,
        recall=recall,
    )


async def chat_completions(proxy: Any, request: web.Request) -> web.StreamResponse:
    body = await _body(request)
    if not isinstance(body.get("model"), str) or not body["model"]:
        raise invalid("model: a model is required")
    raw = body.get("messages")
    if not isinstance(raw, list) or not raw:
        raise invalid("messages: Input should be a non-empty list")
    n = 0
    while (
        n < len(raw) and isinstance(raw[n], dict) and raw[n].get("role") in ("system", "developer")
    ):
        n += 1
    fixed, rest = raw[:n], [_chat_system_turn(m) for m in raw[n:]]
    if not rest:
        return await proxy._plain(request, body, _NOTHING_TO_KEEP, kind="no conversation")
    stream = body.get("stream") is True
    try:
        turn = await _placed(
            proxy,
            request,
            body,
            seed=[*fixed, *rest[:1]],
            messages=rest,
            decompose=from_openai,
            wire="chat",
            system="\n\n".join(_text(m.get("content")) for m in fixed) or None,
            max_out=body.get("max_completion_tokens") or body.get("max_tokens"),
            format="openai",
            recall=False if stream else None,  # a streamed call cannot be held back here
        )
    except PassThrough as why:
        return await proxy._plain(request, body, why.reason, why.session_id)
    recall = turn.placed.recall and not stream
    tools = body.get("tools") if isinstance(body.get("tools"), list) else []

    def build(rendered: Any) -> dict[str, Any]:
        out = dict(body)
        sent = [m for m in rendered.request["messages"] if m.get("role") != "system"]
        out["messages"] = [*fixed, *sent]
        if recall:
            out["tools"] = [*tools, recall_function("chat")]
        key = "max_completion_tokens" if "max_completion_tokens" in body else "max_tokens"
        _capped(proxy, out, key, turn, rendered)
        return out

    return await _exchange(
        proxy,
        request,
        turn,
        body["model"],
        build,
        ChatStream,
        stream=stream,
        recall=recall,
    )


def _chat_system_turn(message: Any) -> Any:
    if isinstance(message, dict) and message.get("role") in ("system", "developer"):
        text = _text(message.get("content"))
        return {"role": "user", "content": f"<system-reminder>\n{text}\n</system-reminder>"}
    return message


async def _body(request: web.Request) -> dict[str, Any]:
    raw = await request.read()
    check_content_type(request.headers.get("content-type"), "openai")
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError:
        raise invalid("We could not parse the JSON body of your request.") from None
    if not isinstance(body, dict):
        raise invalid("The body of your request must be a JSON object.")
    return body


async def _exchange(
    proxy: Any,
    request: web.Request,
    turn: _Turn,
    model: str,
    build: Callable[[Any], dict[str, Any]],
    stream_kind: type[StreamRelay],
    *,
    stream: bool,
    recall: bool,
) -> web.StreamResponse:
    """Send, retry once after Tier 5 with fewer bytes, relay; the usage goes to the session,
    and what the request wrote is kept once the upstream took it (`Proxy._settle`)."""
    placed, rendered = turn.placed, turn.rendered
    base = proxy.settings.openai_upstream
    outgoing = build(rendered)
    for attempt in (0, 1):
        async with (
            proxy._answer(placed) as settle,
            proxy._send("POST", base, request, outgoing, {}) as upstream,
        ):
            if upstream.status != 200:
                data = await upstream.read()
                overflow = overflow_of(upstream.status, data)
                if overflow is not None and attempt == 0:
                    retried = await proxy._rerender(placed, turn.params, overflow)
                    if retried is not None and proxy.smaller(build(retried), outgoing, placed):
                        rendered, outgoing = retried, build(retried)
                        continue
                await settle(upstream.status)
                proxy.counts["upstream_errors"] += 1
                return web.Response(status=upstream.status, body=data, headers=_headers(upstream))
            await settle(200)
            relay = stream_kind(recall=recall)
            return await _answer(
                proxy, request, upstream, placed, model, rendered, outgoing, relay, stream=stream
            )
    raise AssertionError("unreachable")


async def _answer(
    proxy: Any,
    request: web.Request,
    upstream: aiohttp.ClientResponse,
    placed: Any,
    model: str,
    rendered: Any,
    outgoing: dict[str, Any],
    relay: StreamRelay,
    *,
    stream: bool,
) -> web.StreamResponse:
    """The upstream's answer to the client, recall rounds included (see `relay`); a failed
    answer records nothing."""
    base = proxy.settings.openai_upstream

    async def next_body(body: dict[str, Any], calls: list[dict[str, Any]]) -> dict[str, Any]:
        return relay.follow_up(body, await proxy.answers(placed, calls))

    def send(body: dict[str, Any]) -> Any:
        return proxy._send("POST", base, request, body, {})

    if stream:
        client = ClientStream(request, _headers(upstream))
        done = await relay_answer(
            client, relay, upstream, outgoing, next_body, send, proxy.settings.upstream_idle_seconds
        )
        response = await client.end()
    else:
        await whole_answer(
            relay, upstream, outgoing, next_body, send, proxy.settings.upstream_idle_seconds
        )
        done = True
        response = web.json_response(
            relay.answer(),
            dumps=lambda v: orjson.dumps(v).decode(),
            headers={k: v for k, v in _headers(upstream).items() if k.lower() != "content-type"},
        )
    if done:
        first, *follow_ups = relay.rounds or [None]
        for used in follow_ups:
            proxy.followed_up(placed, model, used)
        await asyncio.shield(
            proxy.report(placed, model, rendered, relay.usage, None, counted=first)
        )
    return response


def _headers(upstream: aiohttp.ClientResponse) -> dict[str, str]:
    return response_headers(upstream)


def overflow_of(status: int, data: bytes) -> Any:
    """A context-length refusal from an OpenAI API, as the engine's `Overflow`."""
    from ..context.tiers.reactive import parse_overflow

    try:
        error = (orjson.loads(data) or {}).get("error") or {}
    except (orjson.JSONDecodeError, AttributeError):
        return None
    if not isinstance(error, dict):
        return None
    message = str(error.get("message") or "")
    if error.get("code") == "context_length_exceeded" and "context" not in message.lower():
        message = f"{message} (context_length_exceeded)"
    return parse_overflow(status, message)


# ---- relaying answers ------------------------------------------------------------------------


class StreamRelay:
    """What every OpenAI relay does (streamed, or a whole answer taken in rounds); the two
    APIs fill in their shapes (see `relay` for what the driver asks of them)."""

    def __init__(self, *, recall: bool) -> None:
        self.recall = recall
        self.usage: dict[str, Any] | None = None
        self.continuing = False
        self.rounds: list[Usage | None] = []  # each upstream answer's usage, the stats' terms
        self.ended = False  # this upstream stream reached its last event
        self.failed = False  # the upstream reported a failure in it

    def event(self, event: Event) -> bytes | None:
        raise NotImplementedError

    def failure(self, exc: ApiError) -> bytes:
        raise NotImplementedError

    def follow_up_calls(self) -> list[dict[str, Any]]:
        return []

    def follow_up(self, body: dict[str, Any], results: list[dict[str, Any]]) -> dict[str, Any]:
        raise NotImplementedError

    @property
    def whole_at_close(self) -> bool:
        """A clean close now leaves the client a whole answer."""
        return self.ended

    def continue_with_next_stream(self) -> None:
        self.continuing = True
        self.ended = False

    def take(self, answer: dict[str, Any]) -> None:
        raise NotImplementedError

    def answer(self) -> dict[str, Any]:
        raise NotImplementedError


class ResponsesStream(StreamRelay):
    """A Responses answer: `compactd_recall` calls are held back, and when a response makes
    no other call the next response continues it — one `response.completed` for the client,
    its `output` the items the client saw, the events numbered on."""

    def __init__(self, *, recall: bool) -> None:
        super().__init__(recall=recall)
        self.output: list[dict[str, Any]] = []  # this round's items, as the upstream sent them
        self.visible: list[dict[str, Any]] = []  # every item the client saw
        self._index: dict[int, int | None] = {}
        self._next = 0
        self._sequence = 0
        self._completed: dict[str, Any] | None = None
        self._held_end: Event | None = None
        self._id: str | None = None  # the first response's id, the one the client knows
        self._snapshot: dict[str, Any] = {}  # the response as the client last saw it whole

    def _renumbered(self, event: Event, data: dict[str, Any]) -> bytes:
        data = dict(data)
        if "sequence_number" in data:
            data["sequence_number"] = self._sequence
        self._sequence += 1
        return encode(event.name, data)

    def event(self, event: Event) -> bytes | None:
        data = event.data
        if not isinstance(data, dict):
            return event.raw
        kind = data.get("type", "")
        if kind in ("response.created", "response.in_progress", "response.queued"):
            if self.continuing:
                return None
            self._snapshot = dict(data.get("response") or {})
            self._id = self._snapshot.get("id", self._id)
            return self._renumbered(event, data)
        if kind == "error":  # the API's own report of a failure mid-stream
            self.ended = self.failed = True
            return scrubbed(self._renumbered(event, data))
        if "output_index" in data:
            index = data["output_index"]
            if kind == "response.output_item.added":
                item = data.get("item") or {}
                held = self.recall and item.get("name") == RECALL_NAME
                self._index[index] = None if held else self._next
                if not held:
                    self._next += 1
            if kind == "response.output_item.done":
                item = data.get("item") or {}
                self.output.append(item)
                if self._index.get(index) is not None:
                    self.visible.append(item)
            target = self._index.get(index, index)
            if target is None:
                return None
            return self._renumbered(event, {**data, "output_index": target})
        if kind in ("response.completed", "response.incomplete", "response.failed"):
            self.ended = True
            self.failed = kind == "response.failed"
            response = dict(data.get("response") or {})
            self.usage = _responses_usage(response.get("usage"))
            self.rounds.append(responses_counted(response.get("usage")))
            self._completed = response
            if not self.output:  # the stream carried no item events: take the final output
                self.output = list(response.get("output") or [])
                self.visible = [i for i in self.output if i.get("name") != RECALL_NAME]
            if kind == "response.completed" and self.follow_up_calls():
                self._held_end = event
                return None
            response["output"] = self.visible if self.recall else response.get("output")
            if self._id is not None:  # one response for the client, whatever the rounds
                response["id"] = self._id
            out = self._renumbered(event, {**data, "response": response})
            return scrubbed(out) if self.failed else out
        return self._renumbered(event, data) if "sequence_number" in data else event.raw

    def failure(self, exc: ApiError) -> bytes:
        """A failure as the Responses API ends a stream with one: `response.failed`, the
        response carrying its `error` (Codex retries on it; a stream that just stops is an
        error to it too, but one it cannot tell apart)."""
        error = error_envelope(exc)["error"]
        code = error.get("code") or _FAILED_CODES.get(str(error.get("type")), "server_error")
        response = {
            **self._snapshot,
            "object": "response",
            "status": "failed",
            "error": {"code": code, "message": str(error.get("message") or exc.message)},
            "output": self.visible,
        }
        if self._id is not None:
            response["id"] = self._id
        failed = {"type": "response.failed", "response": response, "sequence_number": 0}
        return self._renumbered(Event(b"", "response.failed", failed), failed)

    def follow_up_calls(self) -> list[dict[str, Any]]:
        calls = [i for i in self.output if i.get("type") in ("function_call", "custom_tool_call")]
        if not self.recall or not calls or any(c.get("name") != RECALL_NAME for c in calls):
            return []
        return [
            {
                "type": "tool_use",
                "id": c.get("call_id"),
                "name": RECALL_NAME,
                "input": _arguments(c.get("arguments")),
            }
            for c in calls
        ]

    def follow_up(self, body: dict[str, Any], results: list[dict[str, Any]]) -> dict[str, Any]:
        outputs = [
            {"type": "function_call_output", "call_id": r["tool_use_id"], "output": r["content"]}
            for r in results
        ]
        return {**body, "input": [*body["input"], *self.output, *outputs]}

    def continue_with_next_stream(self) -> None:
        super().continue_with_next_stream()
        self.output = []
        self._index = {}
        self._held_end = None

    def take(self, message: dict[str, Any]) -> None:
        self.output = list(message.get("output") or [])
        self.visible.extend(
            i for i in self.output if not (self.recall and i.get("name") == RECALL_NAME)
        )
        self.usage = _responses_usage(message.get("usage"))
        self.rounds.append(responses_counted(message.get("usage")))
        self._completed = message

    def answer(self) -> dict[str, Any]:
        return {**(self._completed or {}), "output": self.visible}


_FAILED_CODES = {"rate_limit_error": "rate_limit_exceeded"}
"""A `response.failed` error's `code` for an error `type` that has its own (else server_error)."""


def _responses_usage(usage: Any) -> dict[str, Any] | None:
    if not isinstance(usage, dict) or not isinstance(usage.get("input_tokens"), int):
        return None
    return {"input_tokens": usage["input_tokens"]}


def _cached(details: Any) -> int:
    cached = details.get("cached_tokens") if isinstance(details, dict) else None
    return cached if isinstance(cached, int) else 0


def _counted(usage: Any, prompt: str, details: str, output: str) -> Usage | None:
    if not isinstance(usage, dict) or not isinstance(usage.get(prompt), int):
        return None
    cached = _cached(usage.get(details))
    out = usage.get(output)
    return Usage(
        input=usage[prompt] - cached, cache_read=cached, output=out if isinstance(out, int) else 0
    )


def responses_counted(usage: Any) -> Usage | None:
    """A Responses answer's usage in the stats' terms: `input_tokens` holds the cached ones
    (`input_tokens_details.cached_tokens`); OpenAI bills no cache write."""
    return _counted(usage, "input_tokens", "input_tokens_details", "output_tokens")


def chat_counted(usage: Any) -> Usage | None:
    """A Chat Completions answer's usage in the stats' terms (`prompt_tokens` holds
    `prompt_tokens_details.cached_tokens`)."""
    return _counted(usage, "prompt_tokens", "prompt_tokens_details", "completion_tokens")


class ChatStream(StreamRelay):
    """A Chat Completions answer: streamed chunks pass through as they come (the recall tool is
    not offered on a stream); a whole answer that calls only `compactd_recall` is followed up."""

    def __init__(self, *, recall: bool) -> None:
        super().__init__(recall=recall)
        self._message: dict[str, Any] | None = None
        self._answer: dict[str, Any] | None = None
        self.finish_seen = False

    def event(self, event: Event) -> bytes | None:
        data = event.data
        if event.done:
            self.ended = True
        if not isinstance(data, dict):
            return event.raw
        if data.get("error"):  # the API's own report of a failure mid-stream
            self.ended = self.failed = True
            return scrubbed(event.raw)
        if isinstance(data.get("usage"), dict):
            self.usage = _chat_usage(data["usage"])
            self.rounds.append(chat_counted(data["usage"]))
        if any(isinstance(c, dict) and c.get("finish_reason") for c in data.get("choices") or []):
            self.finish_seen = True  # the usage and `[DONE]` may follow
        return event.raw

    @property
    def whole_at_close(self) -> bool:
        """`[DONE]`, or a close after the finish chunk (some servers leave `[DONE]` out)."""
        return self.ended or self.finish_seen

    def failure(self, exc: ApiError) -> bytes:
        """A failure as Chat Completions reports one mid-stream: a chunk holding only `error`
        (the SDKs raise on it)."""
        return encode(None, error_envelope(exc))

    def take(self, answer: dict[str, Any]) -> None:
        choices = answer.get("choices") or [{}]
        message = dict((choices[0] or {}).get("message") or {})
        if self._answer is None:
            self.usage = _chat_usage(answer.get("usage"))
        self.rounds.append(chat_counted(answer.get("usage")))
        self._message = message
        self._answer = answer

    def follow_up_calls(self) -> list[dict[str, Any]]:
        calls = (self._message or {}).get("tool_calls") or []
        if not self.recall or not calls:
            return []
        if any((c.get("function") or {}).get("name") != RECALL_NAME for c in calls):
            return []
        return [
            {
                "type": "tool_use",
                "id": c.get("id"),
                "name": RECALL_NAME,
                "input": _arguments((c.get("function") or {}).get("arguments")),
            }
            for c in calls
        ]

    def follow_up(self, body: dict[str, Any], results: list[dict[str, Any]]) -> dict[str, Any]:
        tool_messages = [
            {"role": "tool", "tool_call_id": r["tool_use_id"], "content": r["content"]}
            for r in results
        ]
        return {**body, "messages": [*body["messages"], self._message, *tool_messages]}

    def answer(self) -> dict[str, Any]:
        answer = dict(self._answer or {})
        if self.recall and self._message is not None:
            message = dict(self._message)
            calls = [
                c
                for c in message.get("tool_calls") or []
                if (c.get("function") or {}).get("name") != RECALL_NAME
            ]
            if calls:
                message["tool_calls"] = calls
            else:
                message.pop("tool_calls", None)
            choices = list(answer.get("choices") or [{}])
            choices[0] = {**(choices[0] or {}), "message": message}
            answer["choices"] = choices
        return answer


def _chat_usage(usage: Any) -> dict[str, Any] | None:
    if not isinstance(usage, dict) or not isinstance(usage.get("prompt_tokens"), int):
        return None
    return {"input_tokens": usage["prompt_tokens"]}
