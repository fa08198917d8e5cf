"""Answers on their way to the client, and what the proxy does when one breaks.

Every wire's answer goes the same way (`relay_answer`, `whole_answer`): relayed as it arrives,
the calls to `compactd_recall` held back and answered by the proxy, which asks the upstream
again (at most `MAX_FOLLOW_UPS` rounds), the client seeing one answer. An answer that breaks —
a reset, a silence longer than the idle bound, an event that is not JSON, a stream that ends
before its last event, a follow-up the upstream refuses, a model that keeps recalling — reaches
the client as a failure in its API's own shape: a status (502, or the upstream's own refusal)
while the client still waits for one, else the wire's error event, so its SDK raises and the
agent retries instead of taking half an answer for a whole one. A failed answer records
nothing in its session. Each wire's relay (its adapter's: `wire.StreamedRelay`, `WholeRelay`)
says what its client sees of each event, when its answer has ended, and how it reports a
failure; this driver never reads an event itself.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from contextlib import AbstractAsyncContextManager
from typing import Any

import aiohttp
import orjson
from aiohttp import web

from .http import broke, next_chunk, read_whole, refusal
from .sse import EventSplitter
from .wire import ApiError, StreamedRelay, WholeRelay

log = logging.getLogger("compactd.proxy")

MAX_FOLLOW_UPS = 3
"""Recall rounds one client request may take (the model asking again and again is a loop)."""
FINISHED = web.RequestKey("compactd.finished", bool)
"""Set on a request once its client has the whole answer (or its failure): a client that
leaves after that lost nothing."""

Send = Callable[[dict[str, Any]], AbstractAsyncContextManager[aiohttp.ClientResponse]]
NextBody = Callable[[dict[str, Any], list[dict[str, Any]]], Awaitable[dict[str, Any]]]


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
