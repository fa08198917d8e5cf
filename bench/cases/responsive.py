"""Responsiveness (issue "Reliability, round two"): no request waits behind another session's
work.

A data dir of about 500 MB (12 synthetic sessions of ~42 MB that no one has counted: what an
older compactd left, so the first listing must count every one) and a 60 MB session, made here
with `cases.scale` (nothing committed). One daemon is asked, at once, for the first listing of
the whole data dir and the first render of the 60 MB session with the cascade (load, tokenize,
compact with the digest provider, render), while a small session's `session/get` is sent to it
every 20 ms. The floor: the same request, sent alternately with those, to a second daemon that
has nothing else to do — on a shared machine it shows how much of a slow answer is the machine.
The value is the 99th percentile of the busy daemon's answers, in ms.
"""

from __future__ import annotations

import asyncio
import statistics
import time
from pathlib import Path

from compactd.clients.client import CompactdClient
from compactd.context.engine import Engine
from compactd.context.stores.files import FileStore
from registry import Context, Measurement, case

from cases.scale import build

BIG_SESSIONS = 12
BIG_MESSAGES = 27_000  # ~42 MB of log each
RENDERED_MESSAGES = 39_000  # ~60 MB
PROBE_EVERY = 0.02
ARGS = ["--no-watch", "--summary-provider", "digest"]


def _small(root: Path) -> str:
    engine = Engine(FileStore(root))
    engine.open("small")
    engine.append("small", messages=[{"role": "user", "content": "hello"}])
    return "small"


def _data_dir(root: Path, quick: bool) -> tuple[str, float]:
    """The big data dir (with a small session in it); the id of the session to render, and
    the data dir's size in MB."""
    count, messages = (2, 3_000) if quick else (BIG_SESSIONS, BIG_MESSAGES)
    for _ in range(count):
        build(root, messages)
    rendered = build(root, 5_000 if quick else RENDERED_MESSAGES)
    _small(root)
    size = sum(p.stat().st_size for p in (root / "sessions").glob("*.jsonl")) / 1e6
    return rendered, size


async def _probe(client: CompactdClient) -> float:
    start = time.perf_counter()
    await client.get("small")
    return time.perf_counter() - start


def _p99(samples: list[float]) -> float:
    return (
        statistics.quantiles(samples, n=100, method="inclusive")[98] if samples[1:] else samples[0]
    )


async def _under_load(big: Path, idle_root: Path, rendered: str) -> dict[str, float]:
    busy = await CompactdClient.spawn(data_dir=str(big), args=ARGS, timeout=900)
    idle = await CompactdClient.spawn(data_dir=str(idle_root), args=ARGS, timeout=900)
    try:
        await asyncio.gather(busy.status(), idle.status())
        await asyncio.sleep(1.5)  # their tokenizers load in the background
        start = time.perf_counter()
        listing = asyncio.ensure_future(busy.list_sessions())
        render = asyncio.ensure_future(busy.render(rendered, cascade=True))
        spans: dict[str, float] = {}
        listing.add_done_callback(lambda _: spans.setdefault("list", time.perf_counter() - start))
        render.add_done_callback(lambda _: spans.setdefault("render", time.perf_counter() - start))
        loaded: list[float] = []
        floor: list[float] = []
        while not (listing.done() and render.done()):
            loaded.append(await _probe(busy))
            floor.append(await _probe(idle))
            await asyncio.sleep(PROBE_EVERY)
        listed = len((await listing).sessions)
        await render
        again = time.perf_counter()
        await busy.list_sessions()  # the counts are kept now
        kept = time.perf_counter() - again
    finally:
        await asyncio.gather(busy.close(), idle.close())
    restarted = await CompactdClient.spawn(data_dir=str(big), args=ARGS, timeout=900)
    try:
        await restarted.status()  # started
        after = time.perf_counter()
        await restarted.list_sessions()
        restart_kept = time.perf_counter() - after
    finally:
        await restarted.close()
    return {
        "p99 answer, busy daemon": _p99(loaded),
        "slowest answer, busy daemon": max(loaded),
        "median answer, busy daemon": statistics.median(loaded),
        "p99 answer, idle daemon (floor)": _p99(floor),
        "slowest answer, idle daemon (floor)": max(floor),
        "median answer, idle daemon (floor)": statistics.median(floor),
        f"first listing ({listed} sessions, none counted before)": spans["list"],
        "first render of the 60 MB session (cascade)": spans["render"],
        "second listing (counts kept)": kept,
        "listing after a restart (counts kept)": restart_kept,
        "probes": float(len(loaded)),
        "probes over 100 ms": float(sum(1 for b in loaded if b > 0.1)),
    }


@case("responsive_p99_ms", target=100.0)
def responsive_p99_ms(ctx: Context) -> Measurement:
    """The 99th percentile, in ms, of a small session's `session/get` answers while the same
    daemon lists a ~500 MB data dir for the first time and renders a 60 MB session."""
    with ctx.scratch(memory=True) as big, ctx.scratch(memory=True) as idle_root:
        rendered, size = _data_dir(big, ctx.quick)
        _small(idle_root)
        timings = asyncio.run(_under_load(big, idle_root, rendered))
    probes, over = timings.pop("probes"), timings.pop("probes over 100 ms")
    return Measurement(
        timings["p99 answer, busy daemon"] * 1000,
        timings,
        f"data dir {size:.0f} MB; {probes:.0f} probes to each daemon while it worked, {over:.0f} "
        "of the busy daemon's over 100 ms",
    )
