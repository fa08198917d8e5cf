"""The services around the engine: the registry, summary providers, notifications.

Each front (the JSON-RPC daemon, the HTTP proxy) keeps its handlers a few lines each by calling
into this object; everything that decides what the context holds is in `compactd.context`. All
engine work goes through `App.run` (or `App.work` for work of no loaded session): it runs in a
worker thread in the session's turn (`work.py`), so no request waits behind another session's
load, render or tokenizing. Work done between requests (idle timers, background preparation,
watching the store) is in `background.py`. The services speak to their clients only through the
`Front` they were given, and only from the event loop (`notify`, `store_said`).
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol, TypeVar

import attrs

from ..context.engine import Engine
from ..context.secrets import hold, scrub, scrub_data
from ..context.session import Session
from ..context.stores import SessionCounts, SessionStat, open_store
from ..context.tiers.base import TierEvent
from ..protocol import methods
from ..protocol.convert import unstructure
from ..protocol.types import SessionChangedNotification
from .events import compacted
from .providers import make_provider
from .registry import Registry
from .work import SessionWork

log = logging.getLogger("compactd.daemon")
T = TypeVar("T")

PROVIDER_SECRETS = ("ANTHROPIC_API_KEY", "ANTHROPIC_AUTH_TOKEN")
"""The environment's secrets a summary provider reads (the daemon holds them in any case)."""
COUNTS_QUIET_SECONDS = 20.0
"""A session written to and quiet this long has its listing counts kept again (by the idle
loop, in its turn), so a listing, here or after a restart, reads them instead of counting."""

Report = Callable[[str], None]
"""Says how long work is going (a summary call, a replayed step) while it runs."""


class Front(Protocol):
    """What the services need of the front that serves the clients."""

    def notify(self, method: str, params: Any) -> None:
        """A notification to the clients (attrs params; a front without clients logs it)."""
        ...

    def log_message(self, level: str, message: str) -> None:
        """Something the operator should know (`info`, `warning`, `error`): a lost database
        connection, a reconnection."""
        ...

    def progress(
        self, token: str | None, title: str
    ) -> contextlib.AbstractAsyncContextManager[Report]:
        """Progress of long work for a client-chosen token (nothing without one)."""
        ...

    def client_summarizer(self, session_id: str, timeout_seconds: float) -> Any:
        """The `client` summary provider: the front's client summarizes with its own model.
        A front whose clients cannot raises `SummaryFailure("unavailable", …)`."""
        ...


@attrs.frozen
class Settings:
    data_dir: Path
    store_url: str | None = None  # `--store` / COMPACTD_STORE: postgresql://…; None: the files
    idle_seconds: float | None = None  # default idle threshold for sessions without their own
    idle_check_seconds: float = 30.0
    # False: no idle work and no background summaries (`serve --no-idle-work`: the CLI's
    # previews, whose daemon only looks)
    idle_work: bool = True
    evict_after_seconds: float = 600.0
    activity_persist_seconds: float = 60.0
    watch: bool = True
    summary_provider: str | None = None
    summary_model: str | None = None
    summarize_timeout_seconds: float = 120.0
    # daemon-wide input limits by policy field name (max_request_bytes, …; docs/security.md)
    limits: dict[str, int] = attrs.field(factory=dict)
    # session config for sessions without their own value (`serve --set/--config`)
    config: dict[str, Any] = attrs.field(factory=dict)


def settle() -> None:
    """Move everything alive now out of the cyclic collector's reach (`gc.freeze`): a loaded
    session's graph is millions of long-lived objects, and every full collection walked them
    all (~190 ms pauses at 50k messages). Objects freed later still go by reference counting;
    the graph holds no cycles."""
    gc.freeze()


class App:
    def __init__(self, front: Front, settings: Settings) -> None:
        self.front = front
        self.settings = settings
        self.work = SessionWork()
        # what the summary provider's SDK would send: kept out of every message
        hold(*(os.environ.get(name) for name in PROVIDER_SECRETS))
        defaults: dict[str, Any] = {**settings.config, **settings.limits}
        if settings.idle_seconds is not None:
            defaults["idle_seconds"] = settings.idle_seconds
        store = open_store(settings.store_url, settings.data_dir, log=self.store_said)
        self.engine = Engine(store, defaults=defaults, summary_provider=settings.summary_provider)
        self._providers: dict[tuple[str, str], Any] = {}
        self.last_params: dict[str, Any] = {}  # session -> the RenderParams of its last render
        self.preparing: dict[str, asyncio.Task[None]] = {}  # session -> its background summary
        self.registry = Registry(
            self.engine, evict_after=settings.evict_after_seconds, busy=self.work.busy
        )
        self.uncounted: set[str] = set()  # sessions written since their counts were kept
        self.registry.on_first_touch.append(self._listen)
        self.registry.on_first_touch.append(lambda session: settle())  # after its load
        self.registry.on_evict.append(self._forget)

    # ---- sessions -----------------------------------------------------------------------

    def session(self, session_id: str) -> Session:
        """The session, loaded and caught up: only inside work `run` runs (its turn)."""
        return self.registry.get(session_id)

    async def run(self, session_id: str, work: Callable[[Session], T]) -> T:
        """`work(session)` in a worker thread, in the session's turn (after its earlier work,
        never beside it), the session loaded and caught up first. Other sessions' requests
        are answered meanwhile."""

        def in_turn() -> T:
            session = self.registry.get(session_id)
            before = session.offset
            try:
                return work(session)
            finally:
                if session.offset != before:
                    self.uncounted.add(session_id)

        return await self.work.run(session_id, in_turn)

    async def listing(
        self, prefix: str | None = None
    ) -> list[tuple[str, SessionStat, SessionCounts]]:
        """Every stored session (whose id starts with `prefix`) with what a listing shows,
        read as kept beside each log. A session written since its counts were kept, or never
        counted (a data dir of an older compactd), is counted now in its own turn, off the
        loop, and kept for next time."""
        rows = await self.work.run(None, self.engine.store.listing)
        out = []
        for sid, stat, counts in rows:
            if prefix is not None and not sid.startswith(prefix):
                continue
            if counts is None or counts.cursor != stat.cursor:
                counts = await self.work.run(sid, lambda sid=sid: self._keep_counts(sid))
            out.append((sid, stat, counts))
        return out

    def _keep_counts(self, session_id: str) -> SessionCounts:
        self.uncounted.discard(session_id)
        return self.engine.keep_counts(session_id)

    async def keep_quiet_counts(self, quiet_seconds: float = COUNTS_QUIET_SECONDS) -> None:
        """Keep the counts of the loaded sessions written to and quiet since."""
        now = self.registry.clock()
        for sid in sorted(self.uncounted):
            used = self.registry.last_used.get(sid)
            if sid in self.engine.sessions and (used is None or now - used >= quiet_seconds):
                await self.work.run(sid, lambda sid=sid: self._keep_counts(sid))

    def close(self) -> None:
        """When the front has stopped serving: keep the counts of sessions written since
        they were last kept (tokenized already: a walk each), then let the workers go."""
        for sid in sorted(self.uncounted):
            if sid in self.engine.sessions:
                try:
                    self._keep_counts(sid)
                except Exception:
                    log.exception("keeping the counts of %s failed", sid)
        self.work.close()

    def _forget(self, session_id: str) -> None:
        """An evicted session leaves nothing here either."""
        self.last_params.pop(session_id, None)
        self._providers.pop(("client", session_id), None)
        self.uncounted.discard(session_id)
        self.work.forget(session_id)

    def _listen(self, session: Session) -> None:
        session.listeners.append(lambda events, sid=session.id: self._changed(sid, events))

    def _changed(self, session_id: str, events: list[dict[str, Any]]) -> None:
        session = self.engine.sessions.get(session_id)
        heads = dict(session.graph.branches) if session is not None else {}
        self.notify(
            methods.NOTIFY_SESSION_CHANGED,
            SessionChangedNotification(
                session_id=session_id, seq=events[-1]["seq"], events=len(events), heads=heads
            ),
        )

    def touch(self, session: Session) -> None:
        """Persist activity (coalesced) so idle timers survive restarts."""
        if time.time() - session.graph.last_activity >= self.settings.activity_persist_seconds:
            session.touch()

    # ---- summary providers --------------------------------------------------------------------

    def provider(self, name: str, session_id: str) -> Any:
        """The provider object (the SDK client is shared; the client provider is per session)."""
        key = (name, session_id if name == "client" else "")
        provider = self._providers.get(key)
        if provider is None:
            provider = make_provider(
                name,
                session_id=session_id,
                front=self.front,
                model=self.settings.summary_model,
                timeout_seconds=self.settings.summarize_timeout_seconds,
            )
            self._providers[key] = provider
        return provider

    # ---- notifications --------------------------------------------------------------------

    def notify(self, method: str, params: Any) -> None:
        """A notification to the clients, sent from the event loop whichever thread's work
        says it (a worker's catch-up, idle work), with no secret compactd holds in it."""
        payload = scrub_data(unstructure(params) if attrs.has(type(params)) else params)
        self.work.on_loop(lambda: self.front.notify(method, payload))

    def store_said(self, level: str, message: str) -> None:
        """The store's word on its connection (lost, reconnected) goes to the clients too."""
        message = scrub(message)  # a driver's message may quote the connection string
        getattr(log, level if level in ("info", "warning", "error") else "info")(message)
        self.work.on_loop(lambda: self.front.log_message(level, message))

    def notify_compacted(self, session_id: str, event: TierEvent) -> None:
        self.notify(methods.NOTIFY_COMPACTED, compacted(session_id, event))
