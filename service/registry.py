"""The session registry: sessions load on first use, stay while used, and are evicted when idle
in memory. One daemon serves many sessions; each has a lock that long operations (summaries)
hold so two of them never interleave on one session."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

from ..context.engine import Engine
from ..context.session import Session

Clock = Callable[[], float]


class Registry:
    def __init__(
        self,
        engine: Engine,
        *,
        evict_after: float = 600.0,
        clock: Clock = time.monotonic,
        busy: Callable[[str], bool] = lambda session_id: False,
    ) -> None:
        self.engine = engine
        self.evict_after = evict_after
        self.clock = clock
        self.busy = busy  # work for the session is running or waiting: never evicted then
        self.last_used: dict[str, float] = {}
        self._locks: dict[str, asyncio.Lock] = {}
        self.on_first_touch: list[Callable[[Session], None]] = []
        self.on_evict: list[Callable[[str], None]] = []  # what else holds per-session state
        self.on_evicting: list[Callable[[Session], None]] = []  # the session, just before

    def get(self, session_id: str) -> Session:
        """The session, loaded (and caught up with other writers) for this request. The
        first-touch hooks run once per load; the engine may have loaded the session itself
        (`session/open`, `session/import`), so "first" is ours to track, not the engine's."""
        session = self.engine.session(session_id)
        first = session_id not in self.last_used
        self.last_used[session_id] = self.clock()
        if first:
            for hook in self.on_first_touch:
                hook(session)
        return session

    def lock(self, session_id: str) -> asyncio.Lock:
        lock = self._locks.get(session_id)
        if lock is None:
            lock = self._locks[session_id] = asyncio.Lock()
        return lock

    def loaded(self) -> list[str]:
        return sorted(self.engine.sessions)

    def evict_idle(self) -> list[str]:
        """Drop sessions nobody used for `evict_after` seconds (and nobody holds). A session
        the engine loaded by itself (an import) is timed from when this first sees it."""
        now = self.clock()
        gone = []
        for sid in list(self.engine.sessions):
            lock = self._locks.get(sid)
            if (lock is not None and lock.locked()) or self.busy(sid):
                continue
            if now - self.last_used.setdefault(sid, now) >= self.evict_after:
                for hook in self.on_evicting:
                    hook(self.engine.sessions[sid])
                self.engine.evict(sid)
                self.last_used.pop(sid, None)
                self._locks.pop(sid, None)
                for hook in self.on_evict:
                    hook(sid)
                gone.append(sid)
        return gone
