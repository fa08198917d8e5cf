"""The benchmark registry: named cases, each measuring one ratio in a single run.

A case is a function `(ctx: Context) -> Measurement`, registered with `@case(name, target=...)`
in any module of `bench/cases/` (`run.py` imports them all, in name order). It times what it
compares with `ctx.medians({...})` — medians of `ctx.repeat` interleaved runs — and returns the
ratio plus the raw timings. A ratio is measured within one run on one machine, so it means
something where absolute times would not; nothing asserts on it (targets are reported, never
enforced).
"""

from __future__ import annotations

import os
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import attrs

REPO = Path(__file__).resolve().parents[1]
TRANSCRIPTS = REPO / "tests" / "data" / "transcripts"
MEMORY_DIR = "/dev/shm"


@attrs.define
class Measurement:
    """A ratio and the timings (seconds) it was computed from."""

    value: float
    timings: dict[str, float]
    note: str = ""


@attrs.define
class Context:
    """What a case gets: how many repetitions to time, and scratch data dirs."""

    repeat: int = 15
    quick: bool = False  # a smoke run (`--quick`): fewer repetitions, numbers not meaningful

    def medians(self, fns: dict[str, Callable[[], object]]) -> dict[str, float]:
        """Median wall time (seconds) of each function over `repeat` runs. The functions take
        turns within every repetition, so a busy machine slows all of them alike and their
        ratio stays meaningful; one untimed warm-up round first (imports, first-use caches)."""
        for fn in fns.values():
            fn()
        times: dict[str, list[float]] = {name: [] for name in fns}
        for _ in range(self.repeat):
            for name, fn in fns.items():
                start = time.perf_counter()
                fn()
                times[name].append(time.perf_counter() - start)
        return {name: statistics.median(t) for name, t in times.items()}

    @contextmanager
    def scratch(self, *, memory: bool = False) -> Iterator[Path]:
        """An empty directory, removed afterwards. `memory=True` puts it on tmpfs when there is
        one, where fsync costs nothing: for a case about CPU work, whose ratio an fsync's
        disk-dependent latency would only blur."""
        where = MEMORY_DIR if memory and os.access(MEMORY_DIR, os.W_OK) else None
        path = Path(tempfile.mkdtemp(prefix="compactd-bench-", dir=where))
        try:
            yield path
        finally:
            shutil.rmtree(path, ignore_errors=True)


@attrs.frozen
class Case:
    name: str
    fn: Callable[[Context], Measurement]
    target: float | None  # the value should be at most this
    doc: str


CASES: dict[str, Case] = {}


def case(
    name: str, *, target: float | None = None
) -> Callable[[Callable[[Context], Measurement]], Callable[[Context], Measurement]]:
    """Register a benchmark under `name`; the first paragraph of its docstring says what it
    compares (printed with the result)."""

    def register(fn: Callable[[Context], Measurement]) -> Callable[[Context], Measurement]:
        if name in CASES:
            raise ValueError(f"benchmark {name!r} is registered twice")
        doc = " ".join((fn.__doc__ or "").strip().split("\n\n")[0].split())
        CASES[name] = Case(name, fn, target, doc)
        return fn

    return register
