"""The command line's read-only commands: `compactd sessions` and `compactd context S` run as a
user runs them (the console script, a process each), in seconds of wall time, beside the floor
of the same kind — `python -c pass`, the interpreter starting and stopping — timed in the same
run, in turns with them.

The session is the bundled 47,427-token Claude Code one, imported into a scratch data dir; its
counts are kept at import, so `sessions` reads them. Byte code is written and used as on a
user's install (`PYTHONDONTWRITEBYTECODE` is unset for the commands: with it every run would
compile compactd's modules again).
"""

from __future__ import annotations

import os
import resource
import statistics
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

from compactd.context.engine import Engine
from compactd.context.stores.files import FileStore
from registry import TRANSCRIPTS, Context, Measurement, case

BIG = TRANSCRIPTS / "claude-code" / "64da7265-8f07-4967-b79f-0ae374c13330.jsonl"
SCRIPT = str(Path(sys.executable).with_name("compactd"))


def _runner(argv: list[str], env: dict[str, str], cpu: list[float]) -> Callable[[], None]:
    """Runs the command once; its CPU seconds (user + system) go to `cpu`: on a busy machine
    they say what a quiet one's wall time would be better than the wall time does."""

    def run() -> None:
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        subprocess.run(argv, env=env, stdout=subprocess.DEVNULL, check=True)
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpu.append(after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime)

    return run


def _measure(ctx: Context, command: list[str]) -> Measurement:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    floor = "python -c pass"
    with ctx.scratch() as root:
        engine = Engine(FileStore(root))
        sid = engine.import_file(str(BIG)).session_ids[0]
        env["COMPACTD_DATA_DIR"] = str(root)
        argv = [SCRIPT, *(sid if part == "S" else part for part in command)]
        label = "compactd " + " ".join(command)
        cpu: dict[str, list[float]] = {label: [], floor: []}
        t = ctx.medians(
            {
                label: _runner(argv, env, cpu[label]),
                floor: _runner([sys.executable, "-c", "pass"], env, cpu[floor]),
            }
        )
    used = {name: statistics.median(times) for name, times in cpu.items()}
    return Measurement(
        t[label],
        t,
        f"{t[label] - t[floor]:.3f} s over the interpreter's own start "
        f"({t[label] / t[floor]:.1f}x); CPU (user + system) {used[label]:.3f} s against "
        f"{used[floor]:.3f} s",
    )


@case("cli_sessions_seconds", target=0.35)
def cli_sessions_seconds(ctx: Context) -> Measurement:
    """`compactd sessions`, in seconds of wall time (a quiet machine's target; `python -c pass`
    beside it in the same run)."""
    return _measure(ctx, ["sessions"])


@case("cli_context_seconds", target=0.35)
def cli_context_seconds(ctx: Context) -> Measurement:
    """`compactd context S` of a 47K-token session, in seconds of wall time (a quiet
    machine's target; `python -c pass` beside it in the same run)."""
    return _measure(ctx, ["context", "S"])
