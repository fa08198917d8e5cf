"""The driver loop: run a computation that yields `SummaryNeeded` to its end, answering each.

Cascades, background preparation and replays are generators so the engine stays pure; this
is the one loop that answers them. `drive` answers synchronously (the offline digest, tests);
`drive_async` awaits an async answer (the daemon's providers). A computation left early —
an exception in the answer, a cancellation — is closed, so it writes nothing.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TypeVar

from . import digest
from .types import Answer, Steps, SummaryFailure, SummaryNeeded

T = TypeVar("T")


def drive(steps: Steps[T], answer: Callable[[SummaryNeeded], Answer]) -> T:
    """Run `steps` to its end, answering each summary request with `answer(need)`."""
    try:
        need = next(steps)
        while True:
            need = steps.send(answer(need))
    except StopIteration as stop:
        return stop.value
    finally:
        steps.close()


async def drive_async(steps: Steps[T], answer: Callable[[SummaryNeeded], Awaitable[Answer]]) -> T:
    """Run `steps` to its end, awaiting `answer(need)` for each summary request."""
    try:
        need = next(steps)
        while True:
            need = steps.send(await answer(need))
    except StopIteration as stop:
        return stop.value
    finally:
        steps.close()


def digest_answer(need: SummaryNeeded) -> Answer:
    """Answers of the offline `digest` provider (pure, so the engine may call it itself)."""
    try:
        return digest.summarize(need.request)
    except SummaryFailure as failure:
        return failure
