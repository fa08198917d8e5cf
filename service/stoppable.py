"""Work in a worker thread that a cancelled request stops, answered only once it has stopped.

A `$/cancelRequest` cancels the handler's task, but a thread cannot be cancelled: left alone it
would go on and write what the client gave up on (an import kept whole after Ctrl-C). So the
work is given `stopped`, which it asks as it goes; a cancellation sets it and then waits for the
thread to end, so the client's answer (cancelled, −32800) comes when nothing more will be
written. Work that finished before it saw the request to stop keeps its result: the request is
then answered with it, which tells the client what was written.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")

Stop = Callable[[], bool]


async def run_stoppable(work: Callable[[Stop], T]) -> T:
    """`work(stopped)` in a worker thread; see the module's docstring."""
    stop = threading.Event()
    done = asyncio.ensure_future(asyncio.to_thread(work, stop.is_set))
    try:
        return await asyncio.shield(done)
    except asyncio.CancelledError:
        stop.set()
        await asyncio.wait({done})  # a second cancellation does not wait again
        if done.exception() is not None:
            raise  # stopped (or failed) on the way: the request was cancelled
        return done.result()
