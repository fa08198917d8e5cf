"""The services around the engine: the registry, summary providers, notifications.

Each front (the JSON-RPC daemon, the HTTP proxy) keeps its handlers a few lines each by calling
into this object; everything that decides what the context holds is in `compactd.context`. Work
done between requests (idle timers, background preparation, watching the store) is in
`background.py`. The services speak to their clients only through the `Front` they were given.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

import attrs

from ..context.engine import Engine
from ..context.session import Session
from ..context.stores import open_store
from ..context.tiers.base import TierEvent
from ..protocol import methods
from ..protocol.types import SessionChangedNotification
from .events import compacted
from .providers import make_provider
from .registry import Registry

log = logging.getLogger("compactd.daemon")

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
        defaults: dict[str, Any] = {**settings.config, **settings.limits}
        if settings.idle_seconds is not None:
            defaults["idle_seconds"] = settings.idle_seconds
        store = open_store(settings.store_url, settings.data_dir, log=self.store_said)
        self.engine = Engine(store, defaults=defaults, summary_provider=settings.summary_provider)
        self._providers: dict[tuple[str, str], Any] = {}
        self.last_params: dict[str, Any] = {}  # session -> the RenderParams of its last render
        self.preparing: dict[str, asyncio.Task[None]] = {}  # session -> its background summary
        self.registry = Registry(self.engine, evict_after=settings.evict_after_seconds)
        self.registry.on_first_touch.append(self._listen)
        self.registry.on_first_touch.append(lambda session: settle())  # after its load
        self.registry.on_evict.append(self._forget)

    # ---- sessions -----------------------------------------------------------------------

    def session(self, session_id: str) -> Session:
        return self.registry.get(session_id)

    def _forget(self, session_id: str) -> None:
        """An evicted session leaves nothing here either."""
        self.last_params.pop(session_id, None)
        self._providers.pop(("client", session_id), None)

    def _listen(self, session: Session) -> None:
        session.listeners.append(lambda events, sid=session.id: self._changed(sid, events))

    def _changed(self, session_id: str, events: list[dict[str, Any]]) -> None:
        session = self.engine.sessions.get(session_id)
        heads = dict(session.graph.branches) if session is not None else {}
        self.front.notify(
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

    def store_said(self, level: str, message: str) -> None:
        """The store's word on its connection (lost, reconnected) goes to the clients too."""
        getattr(log, level if level in ("info", "warning", "error") else "info")(message)
        self.front.log_message(level, message)

    def notify_compacted(self, session_id: str, event: TierEvent) -> None:
        self.front.notify(methods.NOTIFY_COMPACTED, compacted(session_id, event))
