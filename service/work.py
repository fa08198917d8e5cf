"""Where the engine's work runs: off the event loop, one session's work in order, sessions side
by side.

Loading a session, rendering it, tokenizing what it holds and writing its log take from a
millisecond to many seconds; on the event loop, one big session made every other client wait
(a render of a 60 MB session held every request up 9.4 s; a first listing of a big data dir,
minutes). So every piece of engine work is handed to `SessionWork.run`, which runs it in a
worker thread. Work for one session waits for that session's earlier work (its *turn*, a FIFO
lock per session), so a session's operations happen in the order they arrived and never two
at once — the engine's sessions are not thread-safe, and need not be; work for different
sessions runs at the same time. The engine itself stays free of threads: it is called, it
never calls back.

A call cancelled while its work runs waits for that work to finish (a thread cannot be stopped
half-way through a write), holding the session's turn until then, and then raises the
cancellation: like any cancelled request, it may have been carried out. Work made of steps (a
cascade) stops at the next step, so a cancelled cascade writes nothing.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import sys
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

T = TypeVar("T")

WORKERS = 4
"""Threads for engine work: sessions that work at once. The interpreter runs one thread's
Python at a time, so more would not go faster; the tokenizer and the disk let threads overlap."""
SWITCH_SECONDS = 0.001
"""How long a thread holds the interpreter while another waits for it (Python's default is 5
ms). With two workers busy, the loop waited for several of those in a row to answer a small
request (100–500 ms); at 1 ms it gets its turn promptly, for a little more switching."""


class SessionWork:
    """Engine work in worker threads, in order per session (see the module docstring)."""

    def __init__(self, workers: int = WORKERS) -> None:
        sys.setswitchinterval(SWITCH_SECONDS)
        self._pool = ThreadPoolExecutor(workers, thread_name_prefix="compactd-work")
        self._turns: dict[str, asyncio.Lock] = {}
        self.loop: asyncio.AbstractEventLoop | None = None
        self._collector = _CollectorPause()

    def turn(self, session_id: str) -> asyncio.Lock:
        lock = self._turns.get(session_id)
        if lock is None:
            lock = self._turns[session_id] = asyncio.Lock()
        return lock

    def busy(self, session_id: str) -> bool:
        """Work for this session is running or waiting."""
        lock = self._turns.get(session_id)
        return lock is not None and lock.locked()

    def forget(self, session_id: str) -> None:
        """Drop an idle session's turn (an evicted session holds nothing)."""
        lock = self._turns.get(session_id)
        if lock is not None and not lock.locked():
            del self._turns[session_id]

    async def run(self, session_id: str | None, work: Callable[[], T]) -> T:
        """`work()` in a worker thread, after the session's earlier work (none: no turn to
        wait for — work that touches no loaded session, like reading a transcript)."""
        loop = self.loop = asyncio.get_running_loop()
        work = self._collector.around(work)
        if session_id is None:
            return await _finished(loop.run_in_executor(self._pool, work))
        lock = self.turn(session_id)
        await lock.acquire()
        try:
            future = loop.run_in_executor(self._pool, work)
        except BaseException:
            lock.release()
            raise
        future.add_done_callback(lambda _: lock.release())  # when the thread is done, not before
        return await _finished(future)

    def on_loop(self, callback: Callable[[], None]) -> None:
        """Run `callback` on the event loop: now when called there, else as soon as it can
        (what a worker's work says to clients is written by the loop, in one stream)."""
        loop = self.loop
        if loop is None or _running_loop() is loop:
            callback()
        else:
            loop.call_soon_threadsafe(callback)

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)


class _CollectorPause:
    """The cyclic collector is off while any engine work runs, and what was allocated
    meanwhile is frozen before it is back on (`gc.freeze`: never walked again, still freed
    by reference counting when no longer used — the engine's graphs hold no cycles).

    A render or a load builds millions of objects; with the collector on, its full passes
    walked them again and again, each holding every thread up (0.1–0.4 s under a render of a
    60 MB session), and a pause of one thread's work alone made the first pass after it walk
    what every other thread had built meanwhile (0.5 s). The price: cyclic garbage made while
    work runs is never collected."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._running = 0
        self._was_enabled = True

    def around(self, work: Callable[[], T]) -> Callable[[], T]:
        def paused() -> T:
            with self._lock:
                if self._running == 0:
                    self._was_enabled = gc.isenabled()
                    gc.disable()
                self._running += 1
            try:
                return work()
            finally:
                with self._lock:
                    self._running -= 1
                    if self._running == 0 and self._was_enabled:
                        gc.freeze()
                        gc.enable()

        return paused


async def _finished(future: asyncio.Future[T]) -> T:
    """The future's outcome; when the awaiting task is cancelled, the work is waited out
    first (it holds the session's turn until it ends), then the cancellation goes on."""
    try:
        return await asyncio.shield(future)
    except asyncio.CancelledError:
        while not future.done():
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.wait([future])
        raise


def _running_loop() -> asyncio.AbstractEventLoop | None:
    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        return None


__all__ = ["WORKERS", "SessionWork"]
