"""What the services do on their own, between requests: idle work, background preparation of the
next summary, noticing other daemons' appends, and warming the tokenizer.

`start(app)` hooks the idle check into every session's first use and returns the coroutines
that a front runs beside its request loop (`serve_stdio`, the proxy's server).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Coroutine
from typing import Any

from ..context.session import Session
from ..protocol import methods
from ..protocol.types import SessionIdleNotification
from . import scratch
from .app import App
from .compaction import prepare_summary

log = logging.getLogger("compactd.daemon")


class Sleeping:
    """Sessions evicted from memory before their idle work fell due, with when it does: the
    idle timer outlives eviction (600 s by default, long before the 90-minute idle pass), so
    the idle work runs while the session is idle, not on its next request's path."""

    def __init__(self, app: App) -> None:
        self.app = app
        self.due: dict[str, float] = {}  # session -> when its idle work falls due

    def remember(self, session: Session) -> None:
        at = self.app.engine.idle_at(session)
        if at is not None:
            self.due[session.id] = at

    async def wake_due(self, now: float) -> None:
        """Load each session whose idle work is due, in its turn: its first touch does that
        work (under the store's claim), after which it is evicted again in its time."""
        for sid, at in list(self.due.items()):
            if at > now:
                continue
            del self.due[sid]
            if sid not in self.app.engine.sessions:
                # the first-touch hook runs the idle work
                await self.app.work.run(sid, lambda sid=sid: self.app.session(sid))


def start(app: App) -> list[Coroutine[Any, Any, None]]:
    """Hook the idle check into first use; the background tasks to run."""
    # a daemon started after the idle period acts as soon as the session is used
    sleeping = Sleeping(app)
    if app.settings.idle_work:
        app.registry.on_first_touch.append(lambda session: run_idle_if_due(app, session))
        app.registry.on_evicting.append(sleeping.remember)
    tasks = [idle_loop(app, sleeping), warm_tokenizer(), sweep_at_start(app)]
    if app.settings.watch:
        tasks.append(watch_loop(app))
    return tasks


def run_idle_if_due(app: App, session: Session) -> None:
    """Idle work, on one daemon per session at a time (the store's claim): the one that
    holds it first reads what the others wrote, so nothing is cleared twice. A session whose
    log is not made yet (a request's, held until its upstream takes it) has none to do."""
    if session.unborn is not None:
        return
    with app.engine.store.claim(session.id) as mine:
        if mine:
            session.catch_up()
            _run_idle(app, session)


def _run_idle(app: App, session: Session) -> None:
    idle = app.engine.idle_due(session)
    if idle is None:
        return
    outcome = app.engine.run_idle(session)
    for event in outcome.events:
        app.notify_compacted(session.id, event)
    app.notify(
        methods.NOTIFY_SESSION_IDLE,
        SessionIdleNotification(session_id=session.id, idle_seconds=idle, cleared=outcome.cleared),
    )


async def idle_loop(app: App, sleeping: Sleeping) -> None:
    """Every `idle_check_seconds`: wake the evicted sessions whose idle work fell due, keep the
    counts of quiet sessions, evict the unused ones, and do each loaded session's idle work in
    its turn (off the loop, never marking it used)."""
    while True:
        await asyncio.sleep(app.settings.idle_check_seconds)
        try:
            await sleeping.wake_due(app.engine.clock())
            await app.keep_quiet_counts()
            app.registry.evict_idle()
            if not app.settings.idle_work:
                continue
            for sid in app.registry.loaded():
                if app.registry.lock(sid).locked():
                    continue
                params = await app.work.run(sid, lambda sid=sid: _idle_work(app, sid))
                if params is not None:
                    prepare(app, sid, params)
        except Exception:
            log.exception("idle check failed")


def _idle_work(app: App, session_id: str) -> Any | None:
    """One session's idle work (in its turn); the render params to prepare the next summary
    with, when that is worth it now."""
    session = app.engine.sessions.get(session_id)
    if session is None:
        return None
    run_idle_if_due(app, session)  # under the store's claim
    return preparation_due(app, session)


def preparation_due(app: App, session: Session) -> Any | None:
    """While the user is away and the next compaction is near, the next rolling summary is
    prepared so the compaction that will come costs no waiting: the params of the session's
    last render, once it has been idle `prepareIdleSeconds`, when none is being prepared."""
    params = app.last_params.get(session.id)
    if params is None or session.id in app.preparing:
        return None
    idle = time.time() - session.graph.last_activity
    if idle < app.engine.policy(session).prepare_idle_seconds:
        return None
    return params


def prepare(app: App, session_id: str, params: Any) -> None:
    """A task of its own, one per session at a time: the idle loop (and every other
    session) does not wait for it."""
    if session_id not in app.preparing:
        app.preparing[session_id] = asyncio.create_task(_prepare(app, session_id, params))


async def _prepare(app: App, session_id: str, params: Any) -> None:
    """Under the store's claim, so two daemons on one store never prepare the same range."""
    try:
        with app.engine.store.claim(session_id) as mine:
            if mine:
                await prepare_summary(app, session_id, params)
    except Exception:
        log.exception("preparing a summary for %s failed", session_id)
    finally:
        app.preparing.pop(session_id, None)


async def watch_loop(app: App) -> None:
    """Notice appends by other daemons on this store (file changes, or the database's
    notifications) and apply them; `""` means anything may have changed."""
    async for sid in app.engine.store.watch():
        targets = [sid] if sid else list(app.engine.sessions)
        for target in targets:
            session = app.engine.sessions.get(target)
            if session is None:
                continue
            try:
                await app.work.run(target, session.catch_up)  # in its turn, off the loop
            except Exception:
                log.exception("catching up %s failed", session.id)


async def sweep_at_start(app: App) -> None:
    """What killed daemons left, off the first request's path (in a worker thread): failed
    creates moved aside (a daemon killed mid-create, an older compactd's empty log; the
    operator is told), scratch folders no one holds removed (a replay killed mid-way)."""
    try:
        moved = await app.work.run(None, app.engine.store.sweep)
        removed = await app.work.run(None, lambda: scratch.sweep(app.settings.data_dir))
    except Exception:
        log.exception("sweeping the data dir failed")
        return
    for what in moved:
        app.store_said("warning", f"found what a failed create left: {what}")
    if removed:
        log.info("removed %d scratch folder(s) a stopped daemon left: %s", len(removed), removed)


async def warm_tokenizer() -> None:
    """Load the tokenizer's vocabulary (~0.5 s) right after start-up, off the first
    request's path: the daemon answers at once and the first render is not slowed."""
    from ..context.tokens import encoding

    await asyncio.sleep(0.05)
    await asyncio.get_running_loop().run_in_executor(None, encoding)
