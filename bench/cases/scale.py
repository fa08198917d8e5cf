"""Scale (issue "Scale"): a step's cost follows the context, not the history.

Synthetic agent sessions of 1k, 10k and 100k messages, generated here (nothing committed):
every turn is a request, three tool calls with their results and a reply, sized so that even
the 1k session is over the window once its old results are cleared — so every size renders
about the same context and only the history behind it grows. Times are CPU seconds of this
process (`time.process_time`): the machine is shared, and a neighbour's load would blur wall
time; medians of interleaved runs, as everywhere in `make bench`.
"""

from __future__ import annotations

import gc
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from compactd.context.decompose import from_anthropic
from compactd.context.engine import Engine, RenderParams
from compactd.context.render.request import RequestSpec
from compactd.context.stores.files import FileStore
from compactd.context.summarizer.driver import digest_answer, drive
from compactd.context.tokens import encoding
from registry import MEMORY_DIR, Context, Measurement, case

SIZES = (1_000, 10_000, 100_000)
MESSAGES_PER_TURN = 8
CONFIG = {"summaryProvider": "digest"}
PARAMS = RenderParams(spec=RequestSpec(format="anthropic", model="claude-sonnet-4-5"))
_FILLER = "the parser keeps the offsets of every token it has read so far, "


def agent_turn(k: int) -> list[dict[str, Any]]:
    """One synthetic turn of 8 messages (~2.2 KB of log each)."""
    out: list[dict[str, Any]] = [
        {"role": "user", "content": f"request {k}: fix the parser. " + _FILLER * 10}
    ]
    for j in range(3):
        tid = f"t{k}_{j}"
        out.append(
            {
                "role": "assistant",
                "content": [
                    {"type": "text", "text": f"step {k}.{j}: " + _FILLER * 12},
                    {
                        "type": "tool_use",
                        "id": tid,
                        "name": "Read" if j == 0 else "Bash",
                        "input": {"command": f"cat src/parser_{k}_{j}.py"},
                    },
                ],
            }
        )
        result = f"src/parser_{k}_{j}.py\n" + "def parse(x): return x.split() + [1]\n" * 60
        out.append(
            {
                "role": "user",
                "content": [{"type": "tool_result", "tool_use_id": tid, "content": result}],
            }
        )
    out.append({"role": "assistant", "content": f"done {k}: " + _FILLER * 12})
    return out


def build(root: Path, messages: int) -> str:
    """A session of `messages` messages written in one buffered block; its id."""
    engine = Engine(FileStore(root))
    session, _ = engine.open(None, CONFIG)
    with session.buffered():
        for k in range(messages // MESSAGES_PER_TURN):
            session.append(from_anthropic(agent_turn(k)))
    return session.id


@contextmanager
def sessions(sizes: tuple[int, ...] = SIZES) -> Iterator[dict[int, tuple[Path, str]]]:
    """A data dir per size with its session (on tmpfs when there is one: fsync and the disk
    are not what this measures), removed afterwards."""
    where = MEMORY_DIR if os.access(MEMORY_DIR, os.W_OK) else None
    top = Path(tempfile.mkdtemp(prefix="compactd-scale-", dir=where))
    try:
        yield {n: (top / str(n), build(top / str(n), n)) for n in sizes}
    finally:
        shutil.rmtree(top, ignore_errors=True)


def cascade(engine: Engine, sid: str) -> Any:
    return drive(engine.cascade(sid, PARAMS), digest_answer)


def cpu_medians(fns: dict[str, Callable[[], object]], repeat: int) -> dict[str, float]:
    """Median CPU seconds of each function, interleaved (`Context.medians` with CPU time)."""
    times: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(repeat):
        for name, fn in fns.items():
            start = time.process_time()
            fn()
            times[name].append(time.process_time() - start)
    return {name: statistics.median(t) for name, t in times.items()}


def _fresh_copy(src: Path, dst: Path) -> None:
    shutil.rmtree(dst, ignore_errors=True)
    shutil.copytree(src, dst)


@case("first_cascade_scaling", target=150.0)
def first_cascade_scaling(ctx: Context) -> Measurement:
    """A restarted daemon's first cascade on a 100k-message session (load the log, tokenize
    what the request needs, compact, render) against the same on a 1k-message session (linear
    would be 100x)."""
    encoding()  # the tokenizer loads once per process, before either
    sizes = (1_000, 100_000) if ctx.quick else SIZES
    spent: dict[int, list[float]] = {n: [] for n in sizes}
    with sessions(sizes) as made:

        def first(n: int) -> Callable[[], None]:
            root, sid = made[n]
            work = root.parent / f"{n}-work"

            def run() -> None:
                _fresh_copy(root, work)  # untimed below: the copy is not the daemon's work
                start = time.process_time()
                engine = Engine(FileStore(work))
                cascade(engine, sid)
                spent[n].append(time.process_time() - start)
                del engine
                gc.collect()

            return run

        runs = {n: first(n) for n in sizes}
        for _ in range(1 if ctx.quick else 3):
            for n in sizes:
                runs[n]()
    t = {f"{n:,} messages: first cascade (CPU)": statistics.median(spent[n]) for n in sizes}
    big, small = statistics.median(spent[100_000]), statistics.median(spent[1_000])
    return Measurement(big / small, t, "medians of 3 interleaved runs, each on a fresh copy")


@case("cascade_step_scaling", target=1.5)
def cascade_step_scaling(ctx: Context) -> Measurement:
    """One step (append a turn of 8 messages, cascade, render) on a 100k-message session
    against the same on a 1k-message one; both show about the same context."""
    encoding()
    sizes = (1_000, 100_000) if ctx.quick else SIZES
    with sessions(sizes) as made:
        engines: dict[int, tuple[Engine, str]] = {}
        for n in sizes:
            root, sid = made[n]
            engine = Engine(FileStore(root))
            cascade(engine, sid)  # the first cascade: compacted, as a live session is
            engines[n] = (engine, sid)
        counters = dict.fromkeys(sizes, 10**6)

        def step(n: int) -> Callable[[], None]:
            engine, sid = engines[n]

            def run() -> None:
                counters[n] += 1
                engine.append(sid, messages=agent_turn(counters[n]))
                cascade(engine, sid)

            return run

        for n in sizes:  # warm: the per-node caches of what is shown
            step(n)()
        t = cpu_medians(
            {f"{n:,} messages: step (CPU)": step(n) for n in sizes}, max(ctx.repeat, 5) * 2
        )
    ratio = t["100,000 messages: step (CPU)"] / t["1,000 messages: step (CPU)"]
    return Measurement(ratio, t, "append + cascade + render, in-process; tmpfs data dir")


# the peak of this process's own memory (VmHWM, KiB): `ru_maxrss` would also count the bench
# process's size when it forked the child (Linux keeps the larger across fork and exec)
_RSS_CHILD = """
import sys
from compactd.context.engine import Engine
from compactd.context.stores.files import FileStore
sys.path.insert(0, sys.argv[3])
from cases.scale import cascade
engine = Engine(FileStore(sys.argv[1]))
cascade(engine, sys.argv[2])
with open("/proc/self/status") as status:
    print(next(line.split()[1] for line in status if line.startswith("VmHWM:")))
"""


@case("rss_per_log_mb", target=2.0)
def rss_per_log_mb(ctx: Context) -> Measurement:
    """Peak RSS of a fresh process that loads a 100k-message session and runs its first
    cascade, less 80 MB (the interpreter, the tokenizer, the code), per MB of its log."""
    size = 10_000 if ctx.quick else 100_000
    with sessions((size,)) as made:
        root, sid = made[size]
        log_mb = sum(p.stat().st_size for p in root.rglob("*.jsonl")) / 1e6
        bench = str(Path(__file__).resolve().parents[1])
        out = subprocess.run(
            [sys.executable, "-c", _RSS_CHILD, str(root), sid, bench],
            check=True,
            capture_output=True,
            text=True,
        ).stdout
    peak_mb = int(out.split()[-1]) * 1024 / 1e6  # VmHWM is in KiB
    return Measurement(
        (peak_mb - 80) / log_mb,
        {},
        f"{size:,} messages: log {log_mb:.1f} MB, peak RSS {peak_mb:.1f} MB; "
        f"the target is RSS <= 2 x log + 80 MB",
    )


@case("evicted_sessions_kb", target=100.0)
def evicted_sessions_kb(ctx: Context) -> Measurement:
    """KB of memory still held after 1,000 sessions were created, rendered and evicted."""
    import tracemalloc

    encoding()
    count = 100 if ctx.quick else 1_000
    with tempfile.TemporaryDirectory(dir=_memory()) as tmp:
        engine = Engine(FileStore(Path(tmp)))

        def one(k: int) -> None:
            session, _ = engine.open(None)
            engine.append(session.id, messages=agent_turn(k)[:2] + agent_turn(k)[2:])
            engine.render(session.id, PARAMS)
            engine.evict(session.id)

        one(-1)  # first use: imports, the tokenizer's memo, the store's dirs
        # traced from before a warm-up as long as the run: the interpreter's interned-string
        # table (pathlib interns every file name it parses) is reallocated now and then, and a
        # reallocation of an untraced table would count as growth
        tracemalloc.start()
        for k in range(-count - 1, -1):
            one(k)
        gc.collect()
        before = tracemalloc.take_snapshot()
        for k in range(count):
            one(k)
        gc.collect()
        after = tracemalloc.take_snapshot()
        tracemalloc.stop()
    grown = sum(s.size_diff for s in after.compare_to(before, "filename"))
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return Measurement(
        grown / 1000 * (1_000 / count),
        {},
        f"{count:,} sessions; traced Python allocations still held (peak RSS {rss / 1024:.0f} MB)",
    )


def _memory() -> str | None:
    return MEMORY_DIR if os.access(MEMORY_DIR, os.W_OK) else None
