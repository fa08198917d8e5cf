"""`compactd proxy`: an HTTP server between an agent and its provider, on the same engine, store
and services as the daemon.

This is the shared path, and it never reads a provider's shapes: each wire's adapter (`wires`)
reads its API's request into a `Turn` and writes the body sent upstream, its relays decide what
the client sees of the answer, and it says failures in its API's words. Here a request is
routed to its wire; its history is put into its session (`history`) and rendered with the
cascade — one turn of the session, so two requests of one session never interleave; the body
goes upstream and the answer is relayed as it arrives (`relay`). What the context holds is the
engine's decision. A prompt-too-long answer runs Tier 5 and retries once, with fewer bytes,
before the client sees anything.

What a request writes is held back until the upstream takes it (`Session.holding`): a request
refused — by the proxy, or by the upstream — or one the upstream never answered leaves its
session as it was. A request whose history cannot be kept goes upstream as the client sent it,
that request only, logged with why and counted on its session (`PASSTHROUGH`).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import re
import weakref
from collections.abc import AsyncIterator, Callable
from typing import Any

import aiohttp
import attrs
import orjson
from aiohttp import web
from yarl import URL

from ..context.budget import make_budget, model_spec, reported_prompt_tokens
from ..context.decompose import Spec
from ..context.engine import RenderParams
from ..context.errors import CannotFit, CompactdError, InvalidContent, StoreFailure
from ..context.render.request import Rendered, RequestSpec
from ..context.secrets import hold
from ..context.session import Session
from ..context.stores.interface import SESSION_ID_RE
from ..context.summarizer.types import Steps
from ..context.tiers.base import Outcome
from ..context.tiers.reactive import Overflow
from ..context.visibility import ViewOptions
from ..service.app import App
from ..service.compaction import cascade
from ..service.stats import Recorder, RequestRow, Usage
from .history import History, PassThrough, chain, match, read_history
from .http import (
    HOP_BY_HOP,
    Upstream,
    UpstreamRefusal,
    client_gone,
    read_whole,
    response_headers,
    scrubbed,
)
from .page import Page
from .recall import answer, as_note
from .relay import FINISHED, ClientStream, relay_answer, whole_answer
from .stats import Ledger
from .wire import (
    Answer,
    ApiError,
    Credentials,
    Incoming,
    Route,
    SessionKey,
    Turn,
    Wire,
    invalid,
    own_header,
)
from .wires import WIRES, secrets, wire_for_path

log = logging.getLogger("compactd.proxy")

FRESH_SECONDS = 30.0
"""An upstream that answered this recently is not probed before a request is kept."""
ANTHROPIC_API = "api.anthropic.com"
"""The upstream known to apply context edits before the prompt reaches the model."""
KEYLESS_SESSIONS = 64
"""Sessions one opening may start among requests that name none (see `Proxy._keyless`)."""
KEPT_HISTORIES = 64
"""Conversations whose latest request's reading is kept to read their next one (`History`)."""
INLINE_TAIL = 16
"""Messages new to a conversation's request that are read on the loop (`Proxy._read`)."""


@attrs.frozen
class ProxySettings:
    host: str = "127.0.0.1"
    port: int = 8788
    anthropic_upstream: str = "https://api.anthropic.com"
    openai_upstream: str = "https://api.openai.com"
    gemini_upstream: str = "https://generativelanguage.googleapis.com"
    window: int | None = None  # caps every request's window
    upstream_timeout_seconds: float = 600.0  # for the upstream's headers, and a whole answer
    upstream_idle_seconds: float = 300.0  # the longest silence of an answer once begun
    client_timeout_seconds: float = 120.0  # for a client's header block, and then its body
    stats: bool = True  # record each request in the request log (`compactd stats`)
    # where Tier 1 clears on the Messages API: `server` (a context edit the upstream applies
    # before the prompt reaches the model), `client` (in the body as sent), `auto`: server
    # for the Anthropic API, client for any other upstream
    context_editing: str = "auto"

    @property
    def server_edits(self) -> bool:
        """Whether the Anthropic upstream applies context edits (Tier 1's server path)."""
        if self.context_editing == "auto":
            return URL(self.anthropic_upstream).host == ANTHROPIC_API
        return self.context_editing == "server"

    def upstream(self, wire: Wire) -> str:
        """The base URL a wire's requests go to (its `<upstream>_upstream` setting)."""
        return str(getattr(self, f"{wire.upstream}_upstream"))


@attrs.frozen
class Placed:
    """Where a request's history went: the session, its branch, whether its requests carry
    `compactd_recall`, and the owner of what it wrote (held until the upstream takes it)."""

    session_id: str
    branch: str
    recall: bool = False
    owner: object = attrs.field(factory=object, eq=False)


@attrs.frozen
class Exchange:
    """One managed request on its way: its wire, the client's request, what it was read as,
    where it was placed, compactd's render and the body sent for it."""

    wire: Wire
    request: web.Request
    turn: Turn
    placed: Placed
    rendered: Rendered
    outgoing: dict[str, Any]
    headers: dict[str, str | None]

    @property
    def recall(self) -> bool:
        """Whether `compactd_recall` is offered on this request (a wire may not, on a stream)."""
        return self.placed.recall and self.turn.recall is not False


class Proxy:
    """The proxy's handlers over one `App`."""

    def __init__(self, app: App, settings: ProxySettings) -> None:
        self.app = app
        self.engine = app.engine
        self.settings = settings
        self.credentials: dict[str, Credentials] = {}
        self._branch: dict[str, str] = {}  # session -> the branch its latest request used
        self._heads: dict[str, str] = {}  # keyless session -> its latest request, as `chain`
        # keyless opening -> the lock its requests choose their session under
        self._choosing: weakref.WeakValueDictionary[str, asyncio.Lock] = (
            weakref.WeakValueDictionary()
        )
        self._recalled: dict[tuple[str, str], list[dict[str, Any]]] = {}  # notes to add
        # (wire, session key) -> its latest request's history as read, least recent first
        self._histories: collections.OrderedDict[tuple[str, str], History] = (
            collections.OrderedDict()
        )
        self._http: aiohttp.ClientSession | None = None
        self._answered_at: dict[str, float] = {}  # upstream -> when it last answered
        self.counts = {"requests": 0, "upstream_errors": 0, "overflow_retries": 0}
        recorder = Recorder(
            app.engine.store, lambda fn: app.work.run(None, fn), enabled=settings.stats
        )
        self.ledger = Ledger(app.engine, recorder)
        health: dict[str, Any] = {"service": "compactd proxy", "store": app.engine.store.location}
        for wire in WIRES:
            health[f"{wire.upstream}Upstream"] = settings.upstream(wire)
        self.page = Page(app, recorder, health={**health, "window": settings.window})

    # ---- the application ------------------------------------------------------------------

    def application(self) -> web.Application:
        web_app = web.Application(
            client_max_size=self.engine.limits.max_request_bytes,
            middlewares=[self._errors],
        )
        shared: dict[tuple[str, str], list[tuple[Wire, Route]]] = {}
        for wire in WIRES:
            for route in wire.routes():
                shared.setdefault((route.method, route.path), []).append((wire, route))
        for (method, path), offered in shared.items():
            web_app.router.add_route(method, path, self._handler(offered))
        self.page.routes(web_app)  # the page at the root, its API, and /healthz
        web_app.router.add_route("*", "/{tail:.*}", self.unknown)
        web_app.on_cleanup.append(self._close)
        return web_app

    def _handler(self, offered: list[tuple[Wire, Route]]) -> Callable[[web.Request], Any]:
        """The handler of one path: the first wire that claims the request (a path two wires
        share, a model list, goes by the client's headers), and its route's action."""
        actions = {
            "generate": self.generate,
            "count": self.count,
            "forward": self.forward,
            "unmanaged": self.unmanaged,
        }

        async def handle(request: web.Request) -> web.StreamResponse:
            wire, route = next(
                ((w, r) for w, r in offered if w.claims(request.headers)), offered[-1]
            )
            return await actions[route.action](wire, route, request)

        return handle

    async def _close(self, _app: web.Application) -> None:
        if self._http is not None:
            await self._http.close()

    @property
    def http(self) -> aiohttp.ClientSession:
        if self._http is None:
            timeout = aiohttp.ClientTimeout(
                total=None, sock_connect=30, sock_read=self.settings.upstream_timeout_seconds
            )
            self._http = aiohttp.ClientSession(timeout=timeout, auto_decompress=False)
        return self._http

    @web.middleware
    async def _errors(
        self, request: web.Request, handler: Callable[[web.Request], Any]
    ) -> web.StreamResponse:
        """Every refusal in the API's own error shape (the wire the path belongs to says it);
        the upstream's own refusals as it sent them. No secret a request carries is in any
        answer, log line or record (each is held for scrubbing before anything else). A client
        that leaves is one INFO line, and its upstream request is cancelled with its
        handler."""
        wire = wire_for_path(request.path)
        hold(*secrets(request.headers, request.query))
        try:
            await self._read_body(request)
            return _scrubbed(await handler(request))
        except UpstreamRefusal as exc:
            return _scrubbed(web.Response(status=exc.status, body=exc.raw, headers=exc.headers))
        except ApiError as exc:
            return _scrubbed(error_response(exc, wire))
        except web.HTTPRequestEntityTooLarge:
            return error_response(
                ApiError(413, "request_too_large", "the request body is too large"), wire
            )
        except StoreFailure as exc:  # the proxy's trouble (a full disk, no descriptors left)
            log.warning("%s %s: the store failed: %s", request.method, request.path, exc)
            failure = ApiError(500, "api_error", f"compactd's proxy could not keep it: {exc}")
            return _scrubbed(error_response(failure, wire))
        except CompactdError as exc:
            log.warning("refused a request: %s", exc)
            return _scrubbed(error_response(invalid(str(exc)), wire))
        except asyncio.CancelledError:
            if client_gone(request):
                _client_left(request)
            raise
        except (ConnectionResetError, aiohttp.ClientError) as exc:
            if client_gone(request):
                _client_left(request)
                return web.Response()  # nobody is left to read it
            log.warning(
                "%s %s: the upstream broke off (%s)",
                request.method,
                request.path,
                type(exc).__name__,
            )
            failure = ApiError(502, "api_error", "compactd's proxy lost the upstream")
            return _after_failure(request, error_response(failure, wire))
        except Exception:
            log.exception("the proxy failed on %s %s", request.method, request.path)
            failure = ApiError(500, "api_error", "internal error in compactd's proxy")
            return _after_failure(request, error_response(failure, wire))

    async def _read_body(self, request: web.Request) -> None:
        """The request's body, whole, within the client timeout (a client that sends half a
        body holds nothing for long); the handlers read it from memory."""
        if not request.can_read_body:
            return
        seconds = self.settings.client_timeout_seconds
        try:
            async with asyncio.timeout(seconds):
                await request.read()
        except TimeoutError:
            raise ApiError(
                408, "timeout_error", f"the request's body did not arrive within {seconds:g} s"
            ) from None

    # ---- routes ---------------------------------------------------------------------------

    async def unknown(self, request: web.Request) -> web.StreamResponse:
        raise ApiError(404, "not_found_error", f"compactd's proxy has no endpoint {request.path}")

    async def forward(self, wire: Wire, route: Route, request: web.Request) -> web.StreamResponse:
        """A request relayed as it is and counted nowhere (a model list), to the upstream of
        the wire it was written for, so a key only ever goes to the provider it belongs to."""
        body = await _json_body(request, wire) if request.can_read_body else None
        async with self._send(wire, request, body, {}) as upstream:
            data = await read_whole(upstream, self.settings.upstream_idle_seconds)
            return web.Response(
                status=upstream.status, body=data, headers=response_headers(upstream)
            )

    async def unmanaged(self, wire: Wire, route: Route, request: web.Request) -> web.StreamResponse:
        """A request the proxy relays as the client sent it and counts under the route's kind
        (Codex's remote compaction: the compacted history the client sends next is matched
        like any history the client rewrote)."""
        body = await _json_body(request, wire)
        log.info("relaying %s (%s)", route.kind, _agent(request) or "a client")
        return await self._plain(wire, request, body, route.reason, kind=route.kind)

    async def generate(self, wire: Wire, route: Route, request: web.Request) -> web.StreamResponse:
        """One conversation turn: read by its wire, placed and rendered, sent, relayed."""
        body = await _json_body(request, wire)
        try:
            turn = wire.read(_incoming(request, body))
        except PassThrough as why:
            return await self._plain(wire, request, body, why.reason, kind=why.kind)
        self.counts["requests"] += 1
        await self.reachable(self.settings.upstream(wire))
        try:
            placed, params, rendered = await self.place(wire, turn, request)
        except PassThrough as why:
            return await self._plain(wire, request, body, why.reason, why.session_id)
        notes = self._recalled.pop((placed.session_id, placed.branch), None)
        recall = placed.recall and turn.recall is not False
        outgoing = self._outgoing(wire, turn, rendered, recall, notes)
        for attempt in (0, 1):
            headers = wire.headers(turn, request.headers, rendered)
            async with (
                self._answer(placed) as settle,
                self._send(wire, request, outgoing, headers) as upstream,
            ):
                if upstream.status == 200:
                    await settle(200)
                    self._sent(placed, outgoing)
                    exchange = Exchange(wire, request, turn, placed, rendered, outgoing, headers)
                    return await self._relay(exchange, upstream)
                data = await upstream.read()
                overflow = wire.overflow(upstream.status, data)
                if overflow is not None and attempt == 0:
                    retried = await self._rerender(placed, params, overflow)
                    if retried is not None:
                        smaller = self._outgoing(wire, turn, retried, recall, notes)
                        if self.smaller(smaller, outgoing, placed):
                            rendered, outgoing = retried, smaller
                            continue
                await settle(upstream.status)
            self.counts["upstream_errors"] += 1
            return web.Response(
                status=upstream.status, body=data, headers=response_headers(upstream)
            )
        raise AssertionError("unreachable")

    def _outgoing(
        self,
        wire: Wire,
        turn: Turn,
        rendered: Rendered,
        recall: bool,
        notes: list[dict[str, Any]] | None,
    ) -> dict[str, Any]:
        """The body sent for `rendered`; with `--window`, the output limit at most the
        budget's reserve."""
        capped = self.settings.window is not None
        reserve = rendered.budget.output_reserve if capped else None
        return wire.outgoing(turn, rendered.request, recall=recall, notes=notes, reserve=reserve)

    async def _relay(
        self, exchange: Exchange, upstream: aiohttp.ClientResponse
    ) -> web.StreamResponse:
        """The upstream's answer to the client, recall rounds included (see `relay`); then
        the recalls made beside the client's own calls answered for its next request, and
        the usage recorded (a failed answer records nothing)."""
        wire, request, placed = exchange.wire, exchange.request, exchange.placed
        idle = self.settings.upstream_idle_seconds
        relay: Answer
        if exchange.turn.stream:
            streamed = relay = wire.stream_relay(exchange.recall)
            client = ClientStream(request, response_headers(upstream))
            done = await relay_answer(
                client,
                streamed,
                upstream,
                exchange.outgoing,
                lambda body, calls: self._follow_up(relay, placed, body, calls),
                lambda body: self._send(wire, request, body, exchange.headers),
                idle,
            )
            if done:
                await self._keep_mixed(placed, relay.mixed_calls())
            response: web.StreamResponse = await client.end()
        else:
            whole = relay = wire.whole_relay(exchange.recall)
            await whole_answer(
                whole,
                upstream,
                exchange.outgoing,
                lambda body, calls: self._follow_up(relay, placed, body, calls),
                lambda body: self._send(wire, request, body, exchange.headers),
                idle,
            )
            done = True
            await self._keep_mixed(placed, relay.mixed_calls())
            response = web.json_response(
                whole.answer(),
                status=200,
                dumps=_dumps,
                headers=response_headers(upstream, json=True),
            )
        if done:  # a failed answer records nothing
            first, *follow_ups = relay.rounds or [None]
            for used in follow_ups:
                self.followed_up(placed, exchange.turn.model, used)
            await asyncio.shield(
                self.report(
                    placed,
                    exchange.turn.model,
                    exchange.rendered,
                    relay.reported,
                    relay.applied_edits,
                    counted=first,
                )
            )
        return response

    async def _follow_up(
        self, relay: Answer, placed: Placed, body: dict[str, Any], calls: list[dict[str, Any]]
    ) -> dict[str, Any]:
        """The request that answers the model's recall calls (in the wire's shapes)."""
        return relay.follow_up(body, await self.answers(placed, calls))

    async def count(self, wire: Wire, route: Route, request: web.Request) -> web.StreamResponse:
        """The upstream's count of what compactd would send next: the session's branch as it
        renders now, plus the request's messages the session does not hold yet. Nothing is
        written; a history the session does not know is counted as the client sent it."""
        body = await _json_body(request, wire)
        turn = wire.read_count(_incoming(request, body))
        outgoing = body
        if turn is not None:
            outgoing = await self._counted_body(wire, turn) or body
        async with self._send(wire, request, outgoing, {}) as upstream:
            data = await read_whole(upstream, self.settings.upstream_idle_seconds)
            return web.Response(
                status=upstream.status, body=data, headers=response_headers(upstream)
            )

    async def reachable(self, base: str) -> None:
        """Refuse (502) before anything is kept when the upstream cannot be reached: a request
        that goes nowhere must leave its session as it was. An upstream that answered in the
        last `FRESH_SECONDS` is taken as up; otherwise one TCP connect tells."""
        loop = asyncio.get_running_loop()
        if loop.time() - self._answered_at.get(base, -FRESH_SECONDS) < FRESH_SECONDS:
            return
        url = URL(base)
        port = url.port or (443 if url.scheme == "https" else 80)
        try:
            _reader, writer = await asyncio.wait_for(
                asyncio.open_connection(url.host, port), timeout=10
            )
        except (OSError, TimeoutError) as exc:
            reason = getattr(exc, "strerror", None) or type(exc).__name__
            raise ApiError(
                502,
                "api_error",
                f"compactd's proxy could not reach the upstream at {base}: {reason}",
            ) from None
        writer.close()
        with contextlib.suppress(OSError):
            await writer.wait_closed()

    def answered(self, base: str) -> None:
        self._answered_at[base] = asyncio.get_running_loop().time()

    # ---- sessions ---------------------------------------------------------------------------

    async def place(
        self, wire: Wire, turn: Turn, request: web.Request
    ) -> tuple[Placed, RenderParams, Rendered]:
        """Put the request's history into its session — the new tail appended to the branch
        it extends, or to a branch forked where the client's history leaves the session's —
        and render that branch with the cascade, in one turn of the session (two requests of
        one session never interleave). What it wrote is held until the upstream takes the
        request (`_settle`). `PassThrough` when the history cannot be kept; a request the
        cascade cannot bring under its window is refused as the API refuses a prompt too long,
        and writes nothing."""
        try:
            specs, fingerprints = await self._read(wire, turn)
        except InvalidContent as exc:
            raise PassThrough(f"its history cannot be read as compactd stores it ({exc})") from None
        sid = await self._session_for(turn.key, fingerprints)
        held = self.credentials.get(sid)
        self.credentials[sid] = Credentials(  # the fields of the last request sent stay
            wire.credentials(request.headers, request.query),
            turn.model,
            wire.name,
            self.settings.upstream(wire),
            held.fields if held else {},
        )
        meta = {"source": "proxy", "client": _agent(request)}
        box: list[tuple[Placed, RenderParams]] = []

        def steps(session: Session) -> Steps[Outcome]:
            placed = self._keep(session, specs, fingerprints)
            params = self._params(wire, turn, placed.branch)
            box.append((placed, params))
            self.app.last_params[sid] = params
            return (yield from self._cascade(session, placed, params, None))

        try:
            if sid not in self.engine.sessions:
                config = wire.session_config
                await self.app.work.run(sid, lambda: self._open(sid, config, meta))
            outcome, _provider = await cascade(self.app, sid, steps, None)
        except PassThrough as why:
            why.session_id = sid
            raise
        except CompactdError as exc:  # the cascade wrote nothing; the tail goes too
            if box:
                await self._settle(box[0][0], None)
            if isinstance(exc, CannotFit):
                # the client gets its API's words (its agent compacts); the log, compactd's
                log.warning("session %s: refused as too long: %s", sid, exc)
                raise wire.too_long(exc) from None
            raise
        placed, params = box[0]
        self.ledger.rendered(placed.session_id, placed.branch, outcome.events)
        return placed, params, outcome.rendered

    def _open(self, sid: str, config: dict[str, Any] | None, meta: dict[str, Any]) -> None:
        """A session for the request, in its turn: loaded, or new — its log is made with the
        first write that is kept (a refused first request leaves no session)."""
        if sid not in self.engine.sessions and not self.engine.library.exists(sid):
            self.engine.open(sid, config, meta, unborn=True)

    def _keep(self, session: Session, specs: list[Spec], fingerprints: list[str]) -> Placed:
        """`place`'s first step, in the session's turn: the tail on its branch, held."""
        sid = session.id
        found = match(session.graph, fingerprints, self._branch.get(sid))
        placed = Placed(sid, found.branch, self.engine.policy(session).recall)
        tail = specs[found.shared :]
        try:
            with session.holding(placed.owner):
                # the client resends it with every request: no fsync to wait for
                if not found.extends:
                    branch = _fork_name(session.graph.branches)
                    session.append(tail, branch=branch, fork_at=found.fork_at, durable=False)
                    placed = attrs.evolve(placed, branch=branch)
                    log.info(
                        "session %s: the client's history leaves branch %s after %d of its %d "
                        "parts (it compacted, edited or cleared it); forked branch %s there",
                        sid,
                        found.branch,
                        found.shared,
                        found.held,
                        branch,
                    )
                elif tail:
                    session.append(tail, branch=found.branch, durable=False)
                self.app.touch(session)
        except CompactdError as exc:
            self.engine.drop_held(sid, placed.owner)  # a new session: not even its log
            raise PassThrough(f"its history cannot be kept ({exc})") from None
        self._branch[sid] = placed.branch
        return placed

    def _cascade(
        self, session: Session, placed: Placed, params: RenderParams, overflow: Overflow | None
    ) -> Steps[Outcome]:
        """The cascade on the request's branch, what it writes held with the request's tail."""
        with session.holding(placed.owner):
            reported = overflow or self.engine.take_overflow(placed.session_id)
            return (yield from self.engine.cascade(placed.session_id, params, overflow=reported))

    async def _session_for(self, key: SessionKey, fingerprints: list[str]) -> str:
        """The session a request goes to: the one its client names; else, for a request that
        names none, one of the sessions its opening starts (`_keyless`), chosen one request at
        a time per opening and kept as that session's latest request before any other looks."""
        if key.named:
            return _session_id(key.value)
        links = chain(fingerprints)
        lock = self._choosing.setdefault(key.value, asyncio.Lock())
        async with lock:
            async for sid, extends in self._keyless(key, links, fingerprints):
                if extends is not False:
                    self._heads[sid] = links[-1]
                    return sid
        return _session_id(key.value)

    async def _known_session(self, key: SessionKey, fingerprints: list[str]) -> str | None:
        """The session a request's history is in already, if any (nothing is made)."""
        if key.named:
            sid = _session_id(key.value)
            exists = sid in self.engine.sessions or await self.app.work.run(
                None, lambda: self.engine.library.exists(sid)
            )
            return sid if exists else None
        async for sid, extends in self._keyless(key, chain(fingerprints), fingerprints):
            if extends is not False:
                return sid if extends else None
        return None

    async def _keyless(
        self, key: SessionKey, links: list[str], fingerprints: list[str]
    ) -> AsyncIterator[tuple[str, bool | None]]:
        """The sessions a conversation that names none may be in, with whether the request
        extends the conversation last placed there (None: no session has that id yet). Its
        key is a digest of how it starts, and unrelated conversations that start alike (an
        SDK's first question) must not share one session — nor queue behind each other in its
        turn — so each takes the first of `<key>`, `<key>.2`, … whose latest request this one
        extends (`links`: its history's prefixes, as `chain`), or the first one free. A
        conversation's own rewrite (an edit, a retry from an earlier point) looks the same as
        another conversation, and gets a session too."""
        prefixes = set(links)
        base = _session_id(key.value)
        for n in range(1, KEYLESS_SESSIONS + 1):
            sid = base if n == 1 else f"{base}.{n}"
            head = self._heads.get(sid)
            if head is not None:
                yield sid, head in prefixes
            elif sid in self.engine.sessions or await self.app.work.run(
                None, lambda sid=sid: self.engine.library.exists(sid)
            ):  # kept by an earlier run of the proxy: does the request extend a branch there?
                yield sid, await self.app.run(sid, lambda s: match(s.graph, fingerprints).extends)
            else:
                yield sid, None

    async def _settle(self, placed: Placed, status: int | None) -> None:
        """What the upstream made of the request settles what the request wrote: written once
        the upstream took it (or failed it for a while: the client sends the same again),
        forgotten when the upstream refused it or never answered (`status` None), so a
        refused request leaves its session as it was."""
        refused = status is None or (400 <= status < 500 and status not in (408, 409, 429))
        sid, owner = placed.session_id, placed.owner

        def settle() -> None:
            session = self.engine.sessions.get(sid)
            if session is None:
                return
            if refused:
                if self.engine.drop_held(sid, owner):
                    log.info("session %s: the request was refused; it wrote nothing", sid)
            else:
                session.flush(owner)

        try:
            await self.app.work.run(sid, settle)
        except StoreFailure as exc:
            log.warning("session %s: what the request brought was not written: %s", sid, exc)

    @contextlib.asynccontextmanager
    async def _answer(self, placed: Placed) -> AsyncIterator[Callable[[int], Any]]:
        """Around one upstream exchange: `settle(status)` settles the request's writes; an
        upstream that never answered (a refused connection, a reset) drops them."""

        async def settle(status: int) -> None:
            await self._settle(placed, status)

        try:
            yield settle
        except ApiError:
            await self._settle(placed, None)
            raise

    def _params(self, wire: Wire, turn: Turn, branch: str) -> RenderParams:
        window = self.window_for(turn.model)
        default_reserve = make_budget(turn.model, window).output_reserve
        asked = turn.max_output
        reserve = min(asked, default_reserve) if asked > 0 else default_reserve
        spec = RequestSpec(
            model=turn.model,
            window=window,
            max_output_tokens=reserve,
            system=turn.system,
            tools=turn.tools,
            format=wire.render_format,
            cache=wire.cache,
            cache_ttl=turn.cache_ttl,
            recall=turn.recall,  # None: the session's (on in the proxy unless configured off)
            server_edits=wire.server_edits and self.settings.server_edits,
        )
        return RenderParams(view=ViewOptions(branch=branch), spec=spec)

    def smaller(self, retry: Any, refused: Any, placed: Placed) -> bool:
        """Whether Tier 5's retry is smaller, in bytes, than the body the upstream refused:
        the same body again (other edit parameters, the same bytes) would only be refused."""
        if len(orjson.dumps(retry)) < len(orjson.dumps(refused)):
            return True
        log.warning(
            "session %s: Tier 5's retry would send no fewer bytes; the upstream's refusal "
            "goes to the client",
            placed.session_id,
        )
        return False

    def window_for(self, model: str) -> int | None:
        """`--window` caps the model's own window; without it the model table decides."""
        cap = self.settings.window
        return None if cap is None else min(cap, model_spec(model).window)

    async def _rerender(
        self, placed: Placed, params: RenderParams, overflow: Any
    ) -> Rendered | None:
        """Tier 5's render after the upstream's prompt-too-long, or None when it cannot make
        the request smaller (the client then gets the upstream's own error). The upstream
        counted what it was sent, edits or not, so this render clears in the body itself:
        the retry sends fewer bytes, never the same body with other edit parameters."""
        self.counts["overflow_retries"] += 1
        log.info(
            "session %s: the upstream said the prompt is too long; Tier 5, then one retry",
            placed.session_id,
        )
        client_side = attrs.evolve(params, spec=attrs.evolve(params.spec, server_edits=False))
        try:
            outcome, _provider = await cascade(
                self.app,
                placed.session_id,
                lambda session: self._cascade(session, placed, client_side, overflow),
                None,
            )
        except CompactdError as exc:
            log.warning(
                "session %s: Tier 5 could not shrink the request: %s", placed.session_id, exc
            )
            return None
        self.ledger.rendered(placed.session_id, placed.branch, outcome.events)
        return outcome.rendered

    async def report(
        self,
        placed: Placed,
        model: str,
        rendered: Rendered,
        usage: dict[str, Any] | None,
        applied_edits: list[dict[str, Any]] | None,
        *,
        counted: Usage | None = None,
    ) -> None:
        """The provider's count of the request compactd rendered (calibration for the next),
        with the request as sent (what `compactd context` shows), and the request's row in
        the stats (`counted`: the provider's usage in the stats' terms)."""
        clean = {
            k: v for k, v in (usage or {}).items() if isinstance(v, int) and not isinstance(v, bool)
        }
        params = self.app.last_params.get(placed.session_id)

        def work() -> RequestRow | None:
            if clean:
                self.engine.record_usage(
                    placed.session_id,
                    model,
                    clean,
                    estimated=rendered.estimate,
                    sent=rendered.sent_estimate,
                    applied_edits=applied_edits or None,
                    durable=False,
                    request=self.ledger.panel(rendered, reported_prompt_tokens(clean)),
                )
            if params is None:
                return None
            session = self.app.session(placed.session_id)
            cleared = sum(_int(e.get("cleared_input_tokens")) for e in applied_edits or [])
            return self.ledger.request(
                session,
                placed.branch,
                params,
                rendered,
                wire=self.wire_of(placed),
                usage=counted,
                cleared=cleared,
            )

        async with self.app.registry.lock(placed.session_id):
            try:
                row = await self.app.work.run(placed.session_id, work)
            except CompactdError as exc:
                log.warning("session %s: usage not recorded: %s", placed.session_id, exc)
                return
        self.ledger.take(row)

    def _sent(self, placed: Placed, body: dict[str, Any]) -> None:
        """The upstream took `body`: a summary asked as a fork of it (its prefix is what the
        provider cached) sends its fields as they went — thinking as the window's cap fitted
        it, the merged context edits."""
        held = self.credentials.get(placed.session_id)
        if held is not None:
            held.fields = {k: v for k, v in body.items() if k != "messages"}

    def wire_of(self, placed: Placed) -> str:
        """The API the session's latest request came through (its wire's name)."""
        held = self.credentials.get(placed.session_id)
        return held.api if held is not None else "anthropic"

    def followed_up(self, placed: Placed, model: str, usage: Usage | None) -> None:
        """A request the proxy made itself to answer `compactd_recall`: compactd's call."""
        self.ledger.call(placed.session_id, "recall", model, self.wire_of(placed), usage)

    async def answers(self, placed: Placed, calls: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """The results of the model's recall calls, read in the session's turn."""
        log.info(
            "session %s: answered %d compactd_recall call(s) inside the proxy",
            placed.session_id,
            len(calls),
        )
        sid, branch = placed.session_id, placed.branch
        return await self.app.run(
            sid, lambda _session: [answer(self.engine, sid, branch, c) for c in calls]
        )

    async def _keep_mixed(self, placed: Placed, calls: list[dict[str, Any]]) -> None:
        """Answer the recall calls made beside the client's own, for the next request."""
        if calls:
            results = await self.answers(placed, calls)
            notes = [as_note(c, r) for c, r in zip(calls, results, strict=True)]
            self._recalled[(placed.session_id, placed.branch)] = notes

    async def _read(self, wire: Wire, turn: Turn) -> tuple[list[Spec], list[str]]:
        """The request's history as specs, in the order they are matched, and their
        fingerprints; what the conversation's previous request read of the messages this one
        repeats is reused (`History`). A new tail of a few messages is read on the loop (a
        worker's round trip would cost more), anything longer off it. `InvalidContent` if it
        cannot be read as compactd stores it."""
        key = (wire.name, turn.key.value)
        earlier = self._histories.get(key)
        kept = None
        if earlier is not None and wire.decompose_by_message:
            kept = earlier.reusable(turn.messages)  # one C-level comparison a message

        def read() -> History:
            return read_history(
                wire.decompose,
                turn.messages,
                earlier,
                by_message=wire.decompose_by_message,
                kept=kept,
            )

        if kept is not None and len(turn.messages) - kept <= INLINE_TAIL:
            history = read()
        else:
            history = await self.app.work.run(None, read)
        self._histories[key] = history
        self._histories.move_to_end(key)
        while len(self._histories) > KEPT_HISTORIES:
            self._histories.popitem(last=False)
        return history.specs, history.fingerprints

    async def _counted_body(self, wire: Wire, turn: Turn) -> dict[str, Any] | None:
        try:
            _specs, fingerprints = await self._read(wire, turn)
        except InvalidContent:
            return None
        sid = await self._known_session(turn.key, fingerprints)
        if sid is None:
            return None

        def render(session: Session) -> tuple[Rendered, int] | None:
            found = match(session.graph, fingerprints, self._branch.get(sid))
            if not found.extends:
                return None
            params = self._params(wire, attrs.evolve(turn, max_output=1), found.branch)
            return self.engine.render(sid, params, remember=False), found.shared

        got = await self.app.run(sid, render)  # off the loop, in the session's turn
        if got is None:
            return None
        rendered, shared = got
        tail = turn.messages[_message_count(wire, turn.messages, shared) :]
        return wire.counted_body(turn, rendered.request, tail)

    # ---- upstream ---------------------------------------------------------------------------

    def _send(
        self,
        wire: Wire,
        request: web.Request,
        body: Any,
        override: dict[str, str | None],
    ) -> Any:
        """One upstream request to the wire's upstream: the client's headers (its credentials
        among them; a header another wire owns, such as another provider's key, is never sent
        here) with `override` applied, the body as JSON."""
        base = self.settings.upstream(wire)
        foreign = tuple(h for w in WIRES if w.upstream != wire.upstream for h in w.own_headers)
        headers = {
            k: v
            for k, v in request.headers.items()
            if k.lower() not in HOP_BY_HOP and not own_header(k, foreign)
        }
        for name, value in override.items():
            headers = {k: v for k, v in headers.items() if k.lower() != name}
            if value is not None:
                headers[name] = value
        headers["accept-encoding"] = "identity"  # relayed byte for byte, never re-encoded
        url = base.rstrip("/") + request.path_qs
        data = None
        if body is not None:
            headers["content-type"] = "application/json"
            data = orjson.dumps(body)
        return Upstream(self.http, request.method, url, headers, data, lambda: self.answered(base))

    async def _plain(
        self,
        wire: Wire,
        request: web.Request,
        body: Any,
        reason: str,
        session_id: str | None = None,
        *,
        kind: str = "history not kept",
    ) -> web.StreamResponse:
        """A request the proxy could not manage, sent on unchanged and relayed as it comes (a
        stream through its wire's relay, so a broken one still ends in the wire's error) —
        that request only (the next one is placed again), said in the log with `reason`, and
        counted on its session (`Engine.record_passthrough`) and in the request log under
        `kind` (what `compactd stats` groups them by) whatever the upstream answers: it was
        relayed unmanaged."""
        log.warning(
            "session %s: %s; this request goes upstream as the client sent it",
            session_id or "(none)",
            reason,
        )
        async with self._send(wire, request, body, {}) as upstream:
            await self._count_passthrough(wire, request, body, reason, kind, session_id)
            streamed = upstream.content_type == "text/event-stream"
            if upstream.status != 200 or not streamed:
                data = await read_whole(upstream, self.settings.upstream_idle_seconds)
                return web.Response(
                    status=upstream.status, body=data, headers=response_headers(upstream)
                )
            client = ClientStream(request, response_headers(upstream))
            await relay_answer(
                client,
                wire.stream_relay(recall=False),
                upstream,
                body,
                _no_follow_up,  # no recall is offered
                lambda body: self._send(wire, request, body, {}),
                self.settings.upstream_idle_seconds,
            )
            return await client.end()

    async def _count_passthrough(
        self,
        wire: Wire,
        request: web.Request,
        body: Any,
        reason: str,
        kind: str,
        sid: str | None,
    ) -> None:
        """A request sent unmanaged: on its session (with why) and in the request log."""
        if sid is not None and (
            sid in self.engine.sessions
            or await self.app.work.run(None, lambda: self.engine.library.exists(sid))
        ):
            try:
                await self.app.run(sid, lambda _s: self.engine.record_passthrough(sid, reason))
            except CompactdError as exc:
                log.warning("session %s: the pass-through was not counted: %s", sid, exc)
        model = body.get("model") if isinstance(body, dict) else None
        model = model or request.match_info.get("model")
        self.ledger.passed(sid, _agent(request), wire.name, model, kind)


async def _no_follow_up(body: dict[str, Any], _calls: list[dict[str, Any]]) -> dict[str, Any]:
    return body


def _incoming(request: web.Request, body: Any) -> Incoming:
    return Incoming(body, request.headers, request.match_info, request.query)


def _client_left(request: web.Request) -> None:
    """One line for a client that left: INFO before its answer ended (its upstream request
    is cancelled), DEBUG after."""
    if request.get(FINISHED):
        log.debug("%s %s: the client left after its answer", request.method, request.path)
    else:
        log.info(
            "%s %s: the client left before its answer ended; its upstream request is cancelled",
            request.method,
            request.path,
        )


def _scrubbed(response: web.StreamResponse) -> web.StreamResponse:
    """An error answer without any secret the proxy holds (an upstream may echo the key it
    refused); a success passes byte for byte."""
    if isinstance(response, web.Response) and response.status >= 400:
        body = response.body
        if isinstance(body, bytes) and (clean := scrubbed(body)) is not body:
            response.body = clean
    return response


def _after_failure(request: web.Request, response: web.Response) -> web.StreamResponse:
    """The error answer, unless the client already has part of a stream: then its connection
    is cut, so its SDK sees a broken answer, never a short one taken for whole."""
    transport = request.transport
    if transport is not None and request.writer.output_size:  # type: ignore[attr-defined]
        transport.abort()
    return response


def error_response(exc: ApiError, wire: Wire) -> web.Response:
    return web.json_response(wire.error_body(exc), status=exc.status, dumps=_dumps)


def _int(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


def _dumps(value: Any) -> str:
    return orjson.dumps(value).decode()


async def _json_body(request: web.Request, wire: Wire) -> Any:
    raw = await request.read()  # read whole first: a client still sending gets the answer
    wire.check_content_type(request.headers.get("content-type"))
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError:
        raise wire.not_json() from None


_AGENT_UNSAFE = re.compile(r"[^A-Za-z0-9_./-]")


def _session_id(key: str) -> str:
    """A session id from a client's key: the key itself when it is one already (Claude Code's
    session id is), else a hash of it."""
    if SESSION_ID_RE.fullmatch(key) and ".." not in key:
        return key
    import hashlib

    return "h" + hashlib.sha256(key.encode()).hexdigest()[:31]


def _fork_name(branches: dict[str, Any]) -> str:
    n = 1
    while f"fork-{n}" in branches:
        n += 1
    return f"fork-{n}"


def _agent(request: web.Request) -> str:
    """The client, by its user agent's first product (`claude-cli/2.1.5`, `codex_exec/0.171`)."""
    product = request.headers.get("user-agent", "").split(" ", 1)[0][:60]
    return _AGENT_UNSAFE.sub("", product)


def _message_count(wire: Wire, messages: list[dict[str, Any]], shared: int) -> int:
    """How many whole messages the first `shared` specs cover."""
    covered = 0
    total = 0
    for i, message in enumerate(messages):
        total += len(wire.decompose([message]))
        if total <= shared:
            covered = i + 1
    return covered
