"""Answers on their way to the client, and what the proxy does when one breaks.

Every wire's answer goes the same way (`relay_answer`, `whole_answer`): relayed as it arrives,
the calls to `compactd_recall` held back and answered by the proxy, which asks the upstream
again (at most `MAX_FOLLOW_UPS` rounds), the client seeing one answer. An answer that breaks —
a reset, a silence longer than the idle bound, an event that is not JSON, a stream that ends
before its last event, a follow-up the upstream refuses, a model that keeps recalling — reaches
the client as a failure in its API's own shape: a status (502, or the upstream's own refusal)
while the client still waits for one, else the wire's error event, so its SDK raises and the
agent retries instead of taking half an answer for a whole one. A failed answer records
nothing in its session. Each wire's relay (`Relay` here for the Messages API, `ChatStream` and
`ResponsesStream` in `openai`) says what its client sees of each event, when its answer has
ended, and how it reports a failure.

The Messages API's stream: forwarded event by event while the proxy assembles the message (its
usage, the context edits the provider applied, its calls). When a message calls nothing but
`compactd_recall`, its end is held: the next stream continues the same message for the client
(its `message_start` dropped, its blocks numbered on from the first one's). Thinking blocks and
their signatures pass through byte for byte.
"""

from __future__ import annotations

import asyncio
import copy
import logging
from collections.abc import Awaitable, Callable
from contextlib import AbstractAsyncContextManager
from typing import Any, Protocol

import aiohttp
import orjson
from aiohttp import web

from ..context.recall import TOOL_NAME as RECALL_TOOL
from ..context.secrets import scrub
from .anthropic import ApiError, error_event
from .http import broke, next_chunk, read_whole, refusal
from .sse import Event, EventSplitter, encode

log = logging.getLogger("compactd.proxy")

MAX_FOLLOW_UPS = 3
"""Recall rounds one client request may take (the model asking again and again is a loop)."""
FINISHED = "compactd.finished"
"""Set on a request once its client has the whole answer (or its failure): a client that
leaves after that lost nothing."""

Send = Callable[[dict[str, Any]], AbstractAsyncContextManager[aiohttp.ClientResponse]]
NextBody = Callable[[dict[str, Any], list[dict[str, Any]]], Awaitable[dict[str, Any]]]


class StreamedRelay(Protocol):
    """What each wire's stream relay tells the driver."""

    ended: bool  # this upstream stream reached its last event (held back or not)
    failed: bool  # the upstream reported a failure in it (relayed to the client)

    @property
    def whole_at_close(self) -> bool: ...  # a clean close now leaves a whole answer

    def event(self, event: Event) -> bytes | None: ...
    def follow_up_calls(self) -> list[dict[str, Any]]: ...
    def continue_with_next_stream(self) -> None: ...
    def failure(self, exc: ApiError) -> bytes: ...


class WholeRelay(Protocol):
    """What each wire's relay of a whole (non-streamed) answer tells the driver."""

    def take(self, answer: dict[str, Any]) -> None: ...
    def follow_up_calls(self) -> list[dict[str, Any]]: ...


class ClientStream:
    """The client's streamed answer. Its status and headers go out with its first bytes, so an
    upstream that breaks before then is still answered with an error status. Once the client
    has its whole answer (`finish`), it may leave — Codex hangs up on `response.completed` —
    and what is left (reading the upstream to its end, the usage) is the proxy's own: neither
    its handler's cancellation nor a closed connection stops it then."""

    def __init__(self, request: web.Request, headers: dict[str, str]) -> None:
        self.request = request
        self.response = web.StreamResponse(status=200, headers=headers)
        self.started = False
        self.gone = False  # the client left after its whole answer

    @property
    def finished(self) -> bool:
        return bool(self.request.get(FINISHED))

    def finish(self) -> None:
        self.request[FINISHED] = True

    async def write(self, data: bytes) -> None:
        if self.gone:
            return
        try:
            if not self.started:
                self.started = True
                await self.response.prepare(self.request)
            await self.response.write(data)
        except ConnectionResetError:
            if not self.finished:
                raise
            self._let_go(cancelled=False)
        except asyncio.CancelledError:
            if not self.finished:
                raise
            self._let_go(cancelled=True)

    async def outlast(self, read: Callable[[], Awaitable[bytes]]) -> bytes:
        """`read()`, again if the client leaves after its whole answer meanwhile."""
        while True:
            try:
                return await read()
            except asyncio.CancelledError:
                if not self.finished:
                    raise
                self._let_go(cancelled=True)

    async def end(self) -> web.StreamResponse:
        self.finish()
        try:
            if not self.started:
                self.started = True
                await self.response.prepare(self.request)
            if not self.gone:
                await self.response.write_eof()
        except ConnectionResetError:
            self._let_go(cancelled=False)
        except asyncio.CancelledError:
            self._let_go(cancelled=True)
        return self.response

    def _let_go(self, *, cancelled: bool) -> None:
        """A client gone after its whole answer is let go (the cancellation its going caused
        is taken back). Before then its going is raised — with a bare `raise`, so no frame
        holds the exception its traceback holds: such a cycle outlives its request for good
        once the engine's work has frozen the collector's view (`service.work`)."""
        if cancelled:
            task = asyncio.current_task()
            if task is not None:
                task.uncancel()
        if not self.gone:
            request = self.request
            log.debug("%s %s: the client left after its answer", request.method, request.path)
        self.gone = True


def recall_loop() -> ApiError:
    return broke(
        f"the model called compactd_recall in {MAX_FOLLOW_UPS} rounds in a row without answering"
    )


async def pump(
    upstream: aiohttp.ClientResponse, relay: StreamedRelay, client: ClientStream, idle: float
) -> None:
    """One upstream stream through `relay` to the client, to its last event (else `ApiError`).
    Once the client's answer is whole, what the upstream does after (a reset before its close,
    say) costs the client nothing."""
    splitter = EventSplitter()
    try:
        while chunk := await client.outlast(lambda: next_chunk(upstream, idle)):
            for event in splitter.feed(chunk):
                if event.malformed:
                    raise broke("the upstream sent an event that is not JSON")
                out = relay.event(event)
                if not client.finished and _whole(relay):
                    client.finish()
                if out:
                    await client.write(out)
    except ApiError as exc:
        if not client.finished:
            raise
        log.debug("after the client's answer ended: %s", exc.message)
        return
    if not relay.whole_at_close:
        raise broke("the upstream's stream ended before its last event")
    rest = splitter.rest()
    if rest.strip():
        await client.write(rest)


def _whole(relay: StreamedRelay) -> bool:
    """The client has the end it waits for: the last event, with no recall round to follow
    (or the upstream's own error)."""
    return relay.ended and (relay.failed or not relay.follow_up_calls())


async def relay_answer(
    client: ClientStream,
    relay: StreamedRelay,
    upstream: aiohttp.ClientResponse,
    body: dict[str, Any],
    next_body: NextBody,
    send: Send,
    idle: float,
) -> bool:
    """A streamed answer to the client, recall rounds included. True when it ended as the
    upstream meant it to; False when the client got a failure instead (the upstream's own
    error event, or the proxy's). A failure before the client's first byte is raised (the
    client then gets it as an error status)."""
    try:
        await pump(upstream, relay, client, idle)
        rounds = 0
        while not relay.failed and (calls := relay.follow_up_calls()):
            if rounds == MAX_FOLLOW_UPS:
                raise recall_loop()
            rounds += 1
            body = await next_body(body, calls)
            relay.continue_with_next_stream()
            async with send(body) as follow:
                if follow.status != 200:
                    raise await refusal(follow, idle)
                await pump(follow, relay, client, idle)
    except ApiError as exc:
        if not client.started:
            raise
        log.warning("%s %s: %s", client.request.method, client.request.path, exc.message)
        await client.write(relay.failure(exc))
        return False
    return not relay.failed


async def answer_json(upstream: aiohttp.ClientResponse, idle: float) -> dict[str, Any]:
    """A whole answer's JSON object (one that is not JSON is the upstream's fault: a 502)."""
    data = await read_whole(upstream, idle)
    try:
        answer = orjson.loads(data)
    except orjson.JSONDecodeError:
        answer = None
    if not isinstance(answer, dict):
        raise broke("the upstream's answer is not a JSON object")
    return answer


async def whole_answer(
    relay: WholeRelay,
    upstream: aiohttp.ClientResponse,
    body: dict[str, Any],
    next_body: NextBody,
    send: Send,
    idle: float,
) -> None:
    """A whole answer, recall rounds included, into `relay`; a broken or refused round is
    raised (the client gets its status)."""
    relay.take(await answer_json(upstream, idle))
    rounds = 0
    while calls := relay.follow_up_calls():
        if rounds == MAX_FOLLOW_UPS:
            raise recall_loop()
        rounds += 1
        body = await next_body(body, calls)
        async with send(body) as follow:
            if follow.status != 200:
                raise await refusal(follow, idle)
            relay.take(await answer_json(follow, idle))


def scrubbed(raw: bytes) -> bytes:
    """Bytes of an error without any secret the proxy holds (an upstream may echo the key it
    refused); the same object when there was none."""
    text = raw.decode("utf-8", "replace")
    clean = scrub(text)
    return raw if clean == text else clean.encode()


# ---- the Messages API ----------------------------------------------------------------------


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


class Relay:
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
    def reported(self) -> Assembly:
        """The stream whose usage describes the request compactd rendered."""
        return self.first or self.assembly

    @property
    def follow_up_usages(self) -> list[dict[str, Any]]:
        """The usage of each recall follow-up the proxy made (compactd's own calls)."""
        return [*self.usages, self.assembly.usage][1:]


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

    def follow_up_calls(self) -> list[dict[str, Any]]:
        return follow_up_calls(self.latest.get("content") or [], self.recall)

    def answer(self) -> dict[str, Any]:
        return {**self.latest, "content": visible_content(self.content, self.recall)}
