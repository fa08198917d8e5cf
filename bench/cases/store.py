"""The session store on PostgreSQL against the files, in one run on one machine.

A throwaway cluster (`tests/support/postgres.py`) with fsync and synchronous commit on, its data
on the same disk as the files' scratch dir, so both acknowledge an append only once it is
durable. Skipped (NaN, saying why) where no PostgreSQL server binaries exist.
"""

from __future__ import annotations

import itertools
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from compactd.context.engine import Engine
from compactd.context.importers import load_transcript
from compactd.context.importers.apply import import_session
from compactd.context.stores import open_store
from compactd.context.stores.files import FileStore
from registry import REPO, Context, Measurement, case

from cases.core import ANTHROPIC, BIG

if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))


@contextmanager
def _database() -> Iterator[str | None]:
    from tests.support import postgres

    if postgres.find_bindir() is None:
        yield None
        return
    with postgres.running(durable=True) as cluster:
        yield cluster.database("bench")


def _skipped() -> Measurement:
    return Measurement(float("nan"), {}, "skipped: no PostgreSQL server binaries on this machine")


def _both(ctx: Context, run: Callable[[Engine, Engine, Any], Measurement]) -> Measurement:
    with _database() as url, ctx.scratch() as root:
        if url is None:
            return _skipped()
        pg = open_store(url, None)
        try:
            return run(Engine(pg), Engine(FileStore(root)), url)
        finally:
            pg.close()


@case("postgres_render_ratio", target=2.0)
def postgres_render_ratio(ctx: Context) -> Measurement:
    """a warm render of the largest transcript with its session on PostgreSQL, against the
    same on the files (each render reads what other writers appended first)."""

    def run(on_pg: Engine, on_files: Engine, url: Any) -> Measurement:
        sids = {}
        for name, engine in (("postgres", on_pg), ("files", on_files)):
            (imported,) = load_transcript(BIG)
            sids[name] = import_session(engine.library, imported).id
            engine.render(sids[name], ANTHROPIC)  # cold: fills the per-node caches
        t = ctx.medians(
            {
                "warm render, PostgreSQL": lambda: on_pg.render(sids["postgres"], ANTHROPIC),
                "warm render, files": lambda: on_files.render(sids["files"], ANTHROPIC),
            }
        )
        return Measurement(t["warm render, PostgreSQL"] / t["warm render, files"], t)

    return _both(ctx, run)


@case("postgres_append_ratio", target=None)
def postgres_append_ratio(ctx: Context) -> Measurement:
    """one append (a user message, acknowledged once durable: committed, or fsync'ed) on
    PostgreSQL, against the same on the files; reported, no target."""

    def run(on_pg: Engine, on_files: Engine, url: Any) -> Measurement:
        steps = {}
        for name, engine in (("PostgreSQL", on_pg), ("files", on_files)):
            sid = engine.open(None)[0].id
            counter = itertools.count()

            def step(engine: Engine = engine, sid: str = sid, n: Iterator[int] = counter) -> None:
                engine.append(sid, messages=[{"role": "user", "content": f"m {next(n)}"}])

            steps[f"append, {name}"] = step
        t = ctx.medians(steps)
        return Measurement(t["append, PostgreSQL"] / t["append, files"], t)

    return _both(ctx, run)
