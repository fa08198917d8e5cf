"""`compactd proxy`: an HTTP server between an agent and its provider, on the same engine, store
and services as the daemon.

Each handler is thin: read the provider's JSON (`anthropic`, `openai`), put the request's history
into its session (`history`) and render it with the cascade — one turn of the session, so two
requests of one session never interleave — send the client's own body upstream with compactd's
messages in place of its own, and relay the answer as it arrives (`relay`). What the context
holds is the engine's decision; the proxy only speaks the providers' wire. A prompt-too-long
answer runs Tier 5 and retries once, with fewer bytes, before the client sees anything.

What a request writes is held back until the upstream takes it (`Session.holding`): a request
refused — by the proxy, or by the upstream — or one the upstream never answered leaves its
session as it was. A request whose history cannot be kept goes upstream as the client sent it,
that request only, logged with why and counted on its session (`PASSTHROUGH`).
"""

from __future__ import annotations

import asyncio
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

from ..context.budget import make_budget, model_spec
from ..context.decompose import Spec, from_anthropic
from ..context.engine import RenderParams
from ..context.errors import CannotFit, CompactdError, InvalidContent, StoreFailure
from ..context.render.request import Rendered, RequestSpec
from ..context.secrets import hold
from ..context.session import Session
from ..context.stores.interface import SESSION_ID_RE
from ..context.summarizer.types import Steps
from ..context.tiers.base import Outcome
from ..context.tiers.reactive import Overflow, parse_overflow
from ..context.visibility import ViewOptions
from ..service.app import App
from ..service.compaction import cascade
from ..service.stats import Recorder, RequestRow, Usage
from . import anthropic as api
from . import openai as oai
from .history import PassThrough, chain, match, request_fingerprints, sorted_specs
from .http import (
    HOP_BY_HOP,
    Upstream,
    UpstreamRefusal,
    client_gone,
    read_whole,
    response_headers,
)
from .page import Page
from .recall import answer, as_note
from .relay import (
    FINISHED,
    ClientStream,
    Relay,
    StreamedRelay,
    WholeMessage,
    mixed_recall_calls,
    relay_answer,
    scrubbed,
    whole_answer,
)
from .stats import Ledger
from .summarizer import AUTH_HEADERS, RELAYED_HEADERS, Credentials, credentials

log = logging.getLogger("compactd.proxy")

FRESH_SECONDS = 30.0
"""An upstream that answered this recently is not probed before a request is kept."""
ANTHROPIC_API = "api.anthropic.com"
"""The upstream known to apply context edits before the prompt reaches the model."""
KEYLESS_SESSIONS = 64
"""Sessions one opening may start among requests that name none (see `Proxy._keyless`)."""


@attrs.frozen
class ProxySettings:
    host: str = "127.0.0.1"
    port: int = 8788
    anthropic_upstream: str = "https://api.anthropic.com"
    openai_upstream: str = "https://api.openai.com"
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


@attrs.frozen
class Placed:
    """Where a request's history went: the session, its branch, whether its requests carry
    `compactd_recall`, and the owner of what it wrote (held until the upstream takes it)."""

    session_id: str
    branch: str
    recall: bool = False
    owner: object = attrs.field(factory=object, eq=False)


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
        self._http: aiohttp.ClientSession | None = None
        self._answered_at: dict[str, float] = {}  # upstream -> when it last answered
        self.counts = {"requests": 0, "upstream_errors": 0, "overflow_retries": 0}
        recorder = Recorder(
            app.engine.store, lambda fn: app.work.run(None, fn), enabled=settings.stats
        )
        self.ledger = Ledger(app.engine, recorder)
        self.page = Page(
            app,
            recorder,
            health={
                "service": "compactd proxy",
                "store": app.engine.store.location,
                "anthropicUpstream": settings.anthropic_upstream,
                "openaiUpstream": settings.openai_upstream,
                "window": settings.window,
            },
        )

    # ---- the application ------------------------------------------------------------------

    def application(self) -> web.Application:
        web_app = web.Application(
            client_max_size=self.engine.limits.max_request_bytes,
            middlewares=[self._errors],
        )
        web_app.router.add_post("/v1/messages", self.messages)
        web_app.router.add_post("/v1/messages/count_tokens", self.count_tokens)
        web_app.router.add_post("/v1/chat/completions", self.chat_completions)
        web_app.router.add_post("/v1/responses", self.responses)
        web_app.router.add_post("/v1/responses/compact", self.compact)
        web_app.router.add_get("/v1/models", self.models)
        web_app.router.add_get("/v1/models/{model}", self.models)
        self.page.routes(web_app)  # the page at the root, its API, and /healthz
        web_app.router.add_route("*", "/{tail:.*}", self.unknown)
        web_app.on_cleanup.append(self._close)
        return web_app

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
        """Every refusal in the API's own error shape: the Anthropic one, or OpenAI's on its
        paths; the upstream's own refusals as it sent them. No secret a request carries is in
        any answer, log line or record (each is held for scrubbing before anything else). A
        client that leaves is one INFO line, and its upstream request is cancelled with its
        handler."""
        openai_path = oai.is_openai_path(request.path)
        hold(*credentials(request.headers))
        try:
            await self._read_body(request)
            return _scrubbed(await handler(request))
        except UpstreamRefusal as exc:
            return _scrubbed(web.Response(status=exc.status, body=exc.raw, headers=exc.headers))
        except api.ApiError as exc:
            return _scrubbed(error_response(exc, openai_path))
        except web.HTTPRequestEntityTooLarge:
            return error_response(
                api.ApiError(413, "request_too_large", "the request body is too large"),
                openai_path,
            )
        except StoreFailure as exc:  # the proxy's trouble (a full disk, no descriptors left)
            log.warning("%s %s: the store failed: %s", request.method, request.path, exc)
            failure = api.ApiError(500, "api_error", f"compactd's proxy could not keep it: {exc}")
            return _scrubbed(error_response(failure, openai_path))
        except CompactdError as exc:
            log.warning("refused a request: %s", exc)
            return _scrubbed(error_response(api.invalid(str(exc)), openai_path))
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
            failure = api.ApiError(502, "api_error", "compactd's proxy lost the upstream")
            return _after_failure(request, error_response(failure, openai_path))
        except Exception:
            log.exception("the proxy failed on %s %s", request.method, request.path)
            failure = api.ApiError(500, "api_error", "internal error in compactd's proxy")
            return _after_failure(request, error_response(failure, openai_path))

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
            raise api.ApiError(
                408, "timeout_error", f"the request's body did not arrive within {seconds:g} s"
            ) from None

    # ---- routes ---------------------------------------------------------------------------

    async def unknown(self, request: web.Request) -> web.StreamResponse:
        raise api.ApiError(
            404, "not_found_error", f"compactd's proxy has no endpoint {request.path}"
        )

    async def models(self, request: web.Request) -> web.StreamResponse:
        """The model list of the provider the request was written for (its headers say which:
        `anthropic-version` and `x-api-key` are the Messages API's), so a key only ever goes to
        the provider it belongs to."""
        anthropic = api.is_anthropic_request(request.headers)
        base = self.settings.anthropic_upstream if anthropic else self.settings.openai_upstream
        async with self._send("GET", base, request, None, {}) as upstream:
            data = await read_whole(upstream, self.settings.upstream_idle_seconds)
            return web.Response(
                status=upstream.status, body=data, headers=response_headers(upstream)
            )

    async def compact(self, request: web.Request) -> web.StreamResponse:
        """Codex's remote compaction (`POST /v1/responses/compact`): forwarded with the
        client's key, its answer relayed. The compacted history the client sends next is
        matched like any history the client rewrote."""
        body = await _json_body(request)
        log.info("relaying a remote compaction (%s)", _agent(request) or "a client")
        return await self._plain(
            request, body, "the client's own remote compaction", kind="remote compaction"
        )

    async def messages(self, request: web.Request) -> web.StreamResponse:
        body = await _json_body(request)
        req = api.read_messages_request(body)
        self.counts["requests"] += 1
        await self.reachable(self.settings.anthropic_upstream)
        try:
            placed, params, rendered = await self.place(
                api.session_key(request.headers, body),
                req.messages,
                request,
                req.model,
                lambda branch: self._params(
                    req.model,
                    req.max_tokens,
                    req.system,
                    req.tools,
                    req.cache_ttl,
                    branch,
                    "anthropic",
                ),
            )
        except PassThrough as why:
            return await self._plain(request, body, why.reason, why.session_id)
        notes = self._recalled.pop((placed.session_id, placed.branch), None)
        outgoing = self._anthropic_body(req, rendered, notes)
        for attempt in (0, 1):
            headers = {
                "anthropic-beta": api.merge_betas(
                    request.headers.get("anthropic-beta"), rendered.headers.get("anthropic-beta")
                )
            }
            async with (
                self._answer(placed) as settle,
                self._send(
                    "POST", self.settings.anthropic_upstream, request, outgoing, headers
                ) as upstream,
            ):
                if upstream.status == 200:
                    await settle(200)
                    relay = self._stream_anthropic if req.stream else self._json_anthropic
                    return await relay(request, upstream, req, rendered, placed, outgoing, headers)
                data = await upstream.read()
                overflow = _overflow(upstream.status, data)
                if overflow is not None and attempt == 0:
                    retried = await self._rerender(placed, params, overflow)
                    if retried is not None:
                        smaller = self._anthropic_body(req, retried, notes)
                        if self.smaller(smaller, outgoing, placed):
                            rendered, outgoing = retried, smaller
                            continue
                await settle(upstream.status)
            self.counts["upstream_errors"] += 1
            return web.Response(
                status=upstream.status, body=data, headers=response_headers(upstream)
            )
        raise AssertionError("unreachable")

    async def count_tokens(self, request: web.Request) -> web.StreamResponse:
        """The upstream's count of what compactd would send next: the session's branch as it
        renders now, plus the request's messages the session does not hold yet. Nothing is
        written; a history the session does not know is counted as the client sent it."""
        body = await _json_body(request)
        if not isinstance(body, dict):
            raise api.invalid("body: Input should be a valid dictionary")
        outgoing = body
        messages = body.get("messages")
        if isinstance(messages, list) and messages:
            outgoing = await self._counted_body(api.session_key(request.headers, body), body)
        async with self._send(
            "POST", self.settings.anthropic_upstream, request, outgoing or body, {}
        ) as upstream:
            data = await read_whole(upstream, self.settings.upstream_idle_seconds)
            return web.Response(
                status=upstream.status, body=data, headers=response_headers(upstream)
            )

    async def chat_completions(self, request: web.Request) -> web.StreamResponse:
        return await oai.chat_completions(self, request)

    async def responses(self, request: web.Request) -> web.StreamResponse:
        return await oai.responses(self, request)

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
            raise api.ApiError(
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
        self,
        key: api.SessionKey,
        messages: list[dict[str, Any]],
        request: web.Request,
        model: str,
        params_for: Callable[[str], RenderParams],
        *,
        decompose: Callable[[Any], list[Spec]] = from_anthropic,
        config: dict[str, Any] | None = None,
        wire: str = "anthropic",
    ) -> tuple[Placed, RenderParams, Rendered]:
        """Put the request's history into its session — the new tail appended to the branch
        it extends, or to a branch forked where the client's history leaves the session's —
        and render that branch with the cascade, in one turn of the session (two requests of
        one session never interleave). What it wrote is held until the upstream takes the
        request (`_settle`). `PassThrough` when the history cannot be kept; a request the
        cascade cannot bring under its window is refused as the API refuses a prompt too long,
        and writes nothing."""
        try:
            specs = sorted_specs(decompose(messages))
        except InvalidContent as exc:
            raise PassThrough(f"its history cannot be read as compactd stores it ({exc})") from None
        fingerprints: list[str] | None = None
        if not key.named:  # the session is chosen by them (else they are made in its turn)
            fingerprints = await self.app.work.run(None, lambda: request_fingerprints(specs))
        sid = await self._session_for(key, fingerprints or [])
        upstream = (
            self.settings.anthropic_upstream
            if wire == "anthropic"
            else self.settings.openai_upstream
        )
        self.credentials[sid] = Credentials(_relayed(request.headers), model, wire, upstream)
        meta = {"source": "proxy", "client": _agent(request)}
        box: list[tuple[Placed, RenderParams]] = []

        def steps(session: Session) -> Steps[Outcome]:
            placed = self._keep(session, specs, fingerprints)
            params = params_for(placed.branch)
            box.append((placed, params))
            self.app.last_params[sid] = params
            return (yield from self._cascade(session, placed, params, None))

        try:
            if sid not in self.engine.sessions:
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
                raise api.too_long(exc, wire) from None
            raise
        placed, params = box[0]
        self.ledger.rendered(placed.session_id, placed.branch, outcome.events)
        return placed, params, outcome.rendered

    def _open(self, sid: str, config: dict[str, Any] | None, meta: dict[str, Any]) -> None:
        """A session for the request, in its turn: loaded, or new — its log is made with the
        first write that is kept (a refused first request leaves no session)."""
        if sid not in self.engine.sessions and not self.engine.library.exists(sid):
            self.engine.open(sid, config, meta, unborn=True)

    def _keep(
        self,
        session: Session,
        specs: list[Spec],
        fingerprints: list[str] | None,
    ) -> Placed:
        """`place`'s first step, in the session's turn: the tail on its branch, held."""
        sid = session.id
        if fingerprints is None:
            fingerprints = request_fingerprints(specs)
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

    async def _session_for(self, key: api.SessionKey, fingerprints: list[str]) -> str:
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

    async def _known_session(self, key: api.SessionKey, fingerprints: list[str]) -> str | None:
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
        self, key: api.SessionKey, links: list[str], fingerprints: list[str]
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
        except api.ApiError:
            await self._settle(placed, None)
            raise

    def _params(
        self,
        model: str,
        max_tokens: int,
        system: Any,
        tools: list[dict[str, Any]] | None,
        cache_ttl: str | None,
        branch: str,
        format: str,
    ) -> RenderParams:
        window = self.window_for(model)
        default_reserve = make_budget(model, window).output_reserve
        reserve = min(max_tokens, default_reserve) if max_tokens > 0 else default_reserve
        spec = RequestSpec(
            model=model,
            window=window,
            max_output_tokens=reserve,
            system=system,
            tools=tools,
            format=format,
            cache=format == "anthropic",
            cache_ttl=cache_ttl,
            recall=None,  # the session's `recall` (on in the proxy unless configured off)
            server_edits=self.settings.server_edits,
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
                    request=self.ledger.panel(rendered),
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

    def wire_of(self, placed: Placed) -> str:
        """The API the session's latest request came through (`anthropic`, `responses`, `chat`)."""
        held = self.credentials.get(placed.session_id)
        return held.api if held is not None else "anthropic"

    def followed_up(self, placed: Placed, model: str, usage: Usage | None) -> None:
        """A request the proxy made itself to answer `compactd_recall`: compactd's call."""
        self.ledger.call(placed.session_id, "recall", model, self.wire_of(placed), usage)

    # ---- Anthropic requests ---------------------------------------------------------------

    def _anthropic_body(
        self,
        req: api.MessagesRequest,
        rendered: Rendered,
        notes: list[dict[str, Any]] | None,
    ) -> dict[str, Any]:
        capped = self.settings.window is not None
        limit = rendered.budget.output_reserve if capped else None
        body = api.upstream_body(
            req, rendered.request, max_tokens=limit and min(req.max_tokens, limit)
        )
        if capped:
            api.fit_thinking(body)
        if notes:
            body["messages"] = api.with_notes(body["messages"], notes)
        return body

    async def _stream_anthropic(
        self,
        request: web.Request,
        upstream: aiohttp.ClientResponse,
        req: api.MessagesRequest,
        rendered: Rendered,
        placed: Placed,
        outgoing: dict[str, Any],
        headers: dict[str, str | None],
    ) -> web.StreamResponse:
        relay = Relay(recall=placed.recall)
        client = ClientStream(request, response_headers(upstream))
        done = await relay_answer(
            client,
            relay,
            upstream,
            outgoing,
            lambda body, calls: self._follow_up(body, relay.assembly.content, placed, calls),
            lambda body: self._send(
                "POST", self.settings.anthropic_upstream, request, body, headers
            ),
            self.settings.upstream_idle_seconds,
        )
        if done:
            await self._keep_mixed(placed, relay.assembly.content, relay.recall)
        response = await client.end()
        if done:  # a failed answer records nothing
            for usage in relay.follow_up_usages:
                self.followed_up(placed, req.model, api.counted(usage))
            first = relay.reported
            applied = (first.context_management or {}).get("applied_edits")
            counted = api.counted(first.usage)
            await asyncio.shield(
                self.report(placed, req.model, rendered, first.usage, applied, counted=counted)
            )
        return response

    async def _json_anthropic(
        self,
        request: web.Request,
        upstream: aiohttp.ClientResponse,
        req: api.MessagesRequest,
        rendered: Rendered,
        placed: Placed,
        outgoing: dict[str, Any],
        headers: dict[str, str | None],
    ) -> web.StreamResponse:
        whole = WholeMessage(recall=placed.recall)
        await whole_answer(
            whole,
            upstream,
            outgoing,
            lambda body, calls: self._follow_up(
                body, whole.latest.get("content") or [], placed, calls
            ),
            lambda body: self._send(
                "POST", self.settings.anthropic_upstream, request, body, headers
            ),
            self.settings.upstream_idle_seconds,
        )
        await self._keep_mixed(placed, whole.content, whole.recall)
        for usage in whole.usages[1:]:
            self.followed_up(placed, req.model, api.counted(usage))
        applied = (whole.first.get("context_management") or {}).get("applied_edits")
        usage = whole.first.get("usage")
        counted = api.counted(usage)
        await asyncio.shield(
            self.report(placed, req.model, rendered, usage, applied, counted=counted)
        )
        return web.json_response(
            whole.answer(), status=200, dumps=_dumps, headers=response_headers(upstream, json=True)
        )

    async def _follow_up(
        self,
        body: dict[str, Any],
        content: list[dict[str, Any]],
        placed: Placed,
        calls: list[dict[str, Any]],
    ) -> dict[str, Any]:
        """The request that answers the model's recall calls: the one just sent, its answer,
        and the results (neither reaches the client nor the session)."""
        results = await self.answers(placed, calls)
        messages = [
            *body["messages"],
            {"role": "assistant", "content": content},
            {"role": "user", "content": results},
        ]
        return {**body, "messages": messages}

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

    async def _keep_mixed(
        self, placed: Placed, content: list[dict[str, Any]], recall: bool
    ) -> None:
        """Answer the recall calls made beside the client's own, for the next request."""
        calls = mixed_recall_calls(content, recall)
        if calls:
            results = await self.answers(placed, calls)
            notes = [as_note(c, r) for c, r in zip(calls, results, strict=True)]
            self._recalled[(placed.session_id, placed.branch)] = notes

    async def _counted_body(
        self, key: api.SessionKey, body: dict[str, Any]
    ) -> dict[str, Any] | None:
        try:
            req = api.read_messages_request({**body, "max_tokens": body.get("max_tokens", 1)})
            specs = sorted_specs(from_anthropic(req.messages))
        except (api.ApiError, InvalidContent):
            return None
        fingerprints = await self.app.work.run(None, lambda: request_fingerprints(specs))
        sid = await self._known_session(key, fingerprints)
        if sid is None:
            return None

        def render(session: Session) -> tuple[Rendered, int] | None:
            found = match(session.graph, fingerprints, self._branch.get(sid))
            if not found.extends:
                return None
            params = self._params(
                req.model, 1, req.system, req.tools, req.cache_ttl, found.branch, "anthropic"
            )
            return self.engine.render(sid, params, remember=False), found.shared

        got = await self.app.run(sid, render)  # off the loop, in the session's turn
        if got is None:
            return None
        rendered, shared = got
        tail = req.messages[_message_count(req.messages, specs, shared) :]
        counted = {**body, "messages": [*rendered.request["messages"], *tail]}
        if "system" in rendered.request:
            counted["system"] = rendered.request["system"]
        return api.strip_cache_control(counted)

    # ---- upstream ---------------------------------------------------------------------------

    def _send(
        self,
        method: str,
        base: str,
        request: web.Request,
        body: Any,
        override: dict[str, str | None],
    ) -> Any:
        """One upstream request: the client's headers (its credentials among them, and only
        ever sent here) with `override` applied, the body as JSON."""
        headers = {k: v for k, v in request.headers.items() if k.lower() not in HOP_BY_HOP}
        if base != self.settings.anthropic_upstream:  # the Messages API's key stays with it
            headers = {k: v for k, v in headers.items() if not _anthropic_only(k)}
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
        return Upstream(self.http, method, url, headers, data, lambda: self.answered(base))

    async def _plain(
        self,
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
        openai_path = oai.is_openai_path(request.path)
        base = self.settings.openai_upstream if openai_path else self.settings.anthropic_upstream
        async with self._send("POST", base, request, body, {}) as upstream:
            await self._count_passthrough(request, body, reason, kind, session_id)
            relay = _stream_relay(request.path)
            streamed = upstream.content_type == "text/event-stream"
            if upstream.status != 200 or not streamed or relay is None:
                data = await read_whole(upstream, self.settings.upstream_idle_seconds)
                return web.Response(
                    status=upstream.status, body=data, headers=response_headers(upstream)
                )
            client = ClientStream(request, response_headers(upstream))
            await relay_answer(
                client,
                relay,
                upstream,
                body,
                _no_follow_up,  # no recall is offered
                lambda body: self._send("POST", base, request, body, {}),
                self.settings.upstream_idle_seconds,
            )
            return await client.end()

    async def _count_passthrough(
        self, request: web.Request, body: Any, reason: str, kind: str, sid: str | None
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
        path = request.path
        wire = "anthropic"
        if oai.is_openai_path(path):
            wire = "chat" if "chat" in path else "responses"
        model = body.get("model") if isinstance(body, dict) else None
        self.ledger.passed(sid, _agent(request), wire, model, kind)


async def _no_follow_up(body: dict[str, Any], _calls: list[dict[str, Any]]) -> dict[str, Any]:
    return body


def _stream_relay(path: str) -> StreamedRelay | None:
    """The relay of a stream the proxy does not manage, by its wire (recall off)."""
    if path.startswith("/v1/messages"):
        return Relay(recall=False)
    if path.startswith("/v1/chat/completions"):
        return oai.ChatStream(recall=False)
    if path.startswith("/v1/responses"):
        return oai.ResponsesStream(recall=False)
    return None


def _anthropic_only(header: str) -> bool:
    name = header.lower()
    return name == "x-api-key" or name.startswith("anthropic-")


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


def error_response(exc: api.ApiError, openai_path: bool) -> web.Response:
    body = oai.error_body(exc) if openai_path else exc.body()
    return web.json_response(body, status=exc.status, dumps=_dumps)


def _int(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


def _dumps(value: Any) -> str:
    return orjson.dumps(value).decode()


async def _json_body(request: web.Request) -> Any:
    raw = await request.read()  # read whole first: a client still sending gets the answer
    api.check_content_type(request.headers.get("content-type"), "anthropic")
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError:
        raise api.invalid(
            "There was an error parsing the body of your request: invalid JSON"
        ) from None


def _overflow(status: int, data: bytes) -> Any:
    try:
        error = orjson.loads(data)
    except orjson.JSONDecodeError:
        return None
    message = ""
    if isinstance(error, dict):
        inner = error.get("error")
        if isinstance(inner, dict):
            message = str(inner.get("message") or "")
    return parse_overflow(status, message)


_AGENT_UNSAFE = re.compile(r"[^A-Za-z0-9_./-]")
"""Where a request's session id is kept on the request, once known (for its stats row)."""


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


def _relayed(headers: Any) -> dict[str, str]:
    """The headers a summary through the upstream needs: the credentials and the version."""
    return {
        k.lower(): v for k, v in headers.items() if k.lower() in (*AUTH_HEADERS, *RELAYED_HEADERS)
    }


def _agent(request: web.Request) -> str:
    """The client, by its user agent's first product (`claude-cli/2.1.5`, `codex_exec/0.171`)."""
    product = request.headers.get("user-agent", "").split(" ", 1)[0][:60]
    return _AGENT_UNSAFE.sub("", product)


def _message_count(messages: list[dict[str, Any]], specs: list[Spec], shared: int) -> int:
    """How many whole messages the first `shared` specs cover."""
    covered = 0
    total = 0
    for i, message in enumerate(messages):
        total += len(from_anthropic([message]))
        if total <= shared:
            covered = i + 1
    return covered
