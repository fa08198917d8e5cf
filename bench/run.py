"""Run the benchmarks and print one `name: value` line each (`make bench`).

    .venv/bin/python bench/run.py                  # every case
    .venv/bin/python bench/run.py warm_render_ratio  # some cases, by name
    .venv/bin/python bench/run.py --quick           # smoke run: 1 repetition, numbers meaningless

Each case prints `name: value` (a ratio measured within this run), then `#` comment lines: its
target, what it compares, and the raw median timings it was computed from.

Adding a benchmark: put a module in `bench/cases/` (any name; all are imported) with

    from registry import Context, Measurement, case

    @case("my_ratio", target=2.0)
    def my_ratio(ctx: Context) -> Measurement:
        \"\"\"What it compares, in one line.\"\"\"
        t = ctx.medians({"ours": thing_we_do, "baseline": the_obvious_baseline})
        return Measurement(t["ours"] / t["baseline"], t)

Time with `ctx.medians` (medians of several interleaved repetitions after a warm-up), put
scratch data in `ctx.scratch()`, and never assert on a time: a ratio that misses its target is
reported, not enforced.
"""

from __future__ import annotations

import argparse
import importlib
import pkgutil
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))

from registry import CASES, Context  # noqa: E402


def load_cases() -> None:
    """Import every module of `bench/cases/`, which registers its cases."""
    import cases

    for info in sorted(pkgutil.iter_modules(cases.__path__), key=lambda m: m.name):
        importlib.import_module(f"cases.{info.name}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("names", nargs="*", help="cases to run (default: all)")
    parser.add_argument("--quick", action="store_true", help="one repetition (a smoke run)")
    parser.add_argument("--repeat", type=int, default=15, help="repetitions per timing")
    args = parser.parse_args(argv)
    load_cases()
    unknown = [n for n in args.names if n not in CASES]
    if unknown:
        parser.error(f"unknown benchmark(s) {unknown}; known: {sorted(CASES)}")
    ctx = Context(repeat=1 if args.quick else args.repeat, quick=args.quick)
    missed = []
    for name in args.names or list(CASES):
        bench = CASES[name]
        result = bench.fn(ctx)
        print(f"{name}: {result.value:.3f}")
        if bench.target is not None:
            verdict = "ok" if result.value <= bench.target else "MISSED"
            print(f"#   target <= {bench.target} ({verdict}); {bench.doc}")
            if result.value > bench.target:
                missed.append(name)
        else:
            print(f"#   {bench.doc}")
        for label, seconds in result.timings.items():
            print(f"#   {label}: {seconds * 1000:.3f} ms")
        if result.note:
            print(f"#   {result.note}")
        sys.stdout.flush()
    if missed:
        print(f"# missed targets: {', '.join(missed)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
