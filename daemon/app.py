"""The daemon's services around the engine: registry, notifications, idle work, store watching.

Handlers (`daemon/handlers.py`) stay a few lines each by calling into this object; everything
that decides what the context holds is in `compactd.context`.
"""

from __future__ import annotations

import asyncio
import logging
import time
from pathlib import Path
from typing import Any

import attrs

from ..context.engine import Engine
from ..context.session import Session
from ..context.store import LOG_SUFFIX, Store
from ..protocol import methods
from ..protocol.types import SessionChangedNotification, SessionIdleNotification
from .providers import make_provider
from .registry import Registry
from .server import CompactdServer

log = logging.getLogger("compactd.daemon")


@attrs.frozen
class Settings:
    data_dir: Path
    idle_seconds: float | None = None  # default idle threshold for sessions without their own
    idle_check_seconds: float = 30.0
    evict_after_seconds: float = 600.0
    activity_persist_seconds: float = 60.0
    watch: bool = True
    summary_provider: str | None = None
    summary_model: str | None = None
    summarize_timeout_seconds: float = 120.0


class App:
    def __init__(self, server: CompactdServer, settings: Settings) -> None:
        self.server = server
        self.settings = settings
        defaults: dict[str, Any] = {}
        if settings.idle_seconds is not None:
            defaults["idle_seconds"] = settings.idle_seconds
        self.engine = Engine(
            Store(settings.data_dir), defaults=defaults, summary_provider=settings.summary_provider
        )
        self._providers: dict[tuple[str, str], Any] = {}
        self.last_params: dict[str, Any] = {}  # session -> the RenderParams of its last render
        self.registry = Registry(self.engine, evict_after=settings.evict_after_seconds)
        self.registry.on_first_touch.append(self._first_touch)

    # ---- sessions -----------------------------------------------------------------------

    def session(self, session_id: str) -> Session:
        return self.registry.get(session_id)

    def _first_touch(self, session: Session) -> None:
        session.listeners.append(lambda events, sid=session.id: self._changed(sid, events))
        self.run_idle_if_due(session)  # a daemon started after the idle period acts now

    def _changed(self, session_id: str, events: list[dict[str, Any]]) -> None:
        session = self.engine.sessions.get(session_id)
        heads = dict(session.graph.branches) if session is not None else {}
        self.server.notify(
            methods.NOTIFY_SESSION_CHANGED,
            SessionChangedNotification(
                session_id=session_id, seq=events[-1]["seq"], events=len(events), heads=heads
            ),
        )

    def touch(self, session: Session) -> None:
        """Persist activity (coalesced) so idle timers survive restarts."""
        if time.time() - session.graph.last_activity >= self.settings.activity_persist_seconds:
            session.touch()

    # ---- idle work ----------------------------------------------------------------------

    def run_idle_if_due(self, session: Session) -> None:
        idle = self.engine.idle_due(session)
        if idle is None:
            return
        outcome = self.engine.run_idle(session)
        for event in outcome.events:
            self.notify_compacted(session.id, event)
        self.server.notify(
            methods.NOTIFY_SESSION_IDLE,
            SessionIdleNotification(
                session_id=session.id, idle_seconds=idle, cleared=outcome.cleared
            ),
        )

    async def idle_loop(self) -> None:
        while True:
            await asyncio.sleep(self.settings.idle_check_seconds)
            try:
                self.registry.evict_idle()
                for sid in self.registry.loaded():
                    if self.registry.lock(sid).locked():
                        continue
                    session = self.engine.sessions.get(sid)
                    if session is not None:
                        session.catch_up()
                        self.run_idle_if_due(session)
                        await self.prepare_if_idle(session)
            except Exception:
                log.exception("idle check failed")

    async def prepare_if_idle(self, session: Session) -> None:
        """While the user is away and the context is filling up, prepare the next rolling
        summary so the compaction that will come costs no waiting."""
        params = self.last_params.get(session.id)
        if params is None:
            return
        idle = time.time() - session.graph.last_activity
        if idle < self.engine.policy(session).prepare_idle_seconds:
            return
        from .compaction import prepare_summary

        await prepare_summary(self, session.id, params)

    # ---- other writers ------------------------------------------------------------------

    async def watch_loop(self) -> None:
        """Notice appends by other daemons on this data dir and apply them."""
        from watchfiles import awatch

        store = self.engine.store
        store.ensure_dirs()
        async for changes in awatch(store.sessions_dir, debounce=20, step=10, recursive=False):
            for _change, path in changes:
                name = Path(path).name
                if not name.endswith(LOG_SUFFIX) or name.startswith("."):
                    continue
                session = self.engine.sessions.get(name[: -len(LOG_SUFFIX)])
                if session is not None:
                    try:
                        session.catch_up()
                    except Exception:
                        log.exception("catching up %s failed", session.id)

    async def warm_tokenizer(self) -> None:
        """Load the tokenizer's vocabulary (~0.5 s) right after start-up, off the first
        request's path: the daemon answers at once and the first render is not slowed."""
        from ..context.tokens import encoding

        await asyncio.sleep(0.05)
        await asyncio.get_running_loop().run_in_executor(None, encoding)

    def background(self) -> list[Any]:
        tasks: list[Any] = [self.idle_loop(), self.warm_tokenizer()]
        if self.settings.watch:
            tasks.append(self.watch_loop())
        return tasks

    # ---- summary providers --------------------------------------------------------------------

    def provider(self, name: str, session_id: str) -> Any:
        """The provider object (the SDK client is shared; the client provider is per session)."""
        key = (name, session_id if name == "client" else "")
        provider = self._providers.get(key)
        if provider is None:
            provider = make_provider(
                name,
                session_id=session_id,
                protocol=self.server.protocol,
                model=self.settings.summary_model,
                timeout_seconds=self.settings.summarize_timeout_seconds,
            )
            self._providers[key] = provider
        return provider

    # ---- notifications --------------------------------------------------------------------

    def notify_compacted(self, session_id: str, event: dict[str, Any]) -> None:
        self.server.notify(methods.NOTIFY_COMPACTED, {"sessionId": session_id, **event})
