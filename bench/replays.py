"""The economy table: every shared Claude Code session replayed at 200K, 64K and 48K, compactd
beside each anchor policy (`compactd replay`'s figures, economy.md's instrument); with `--codex`,
the two shared Codex sessions instead (their own rows: a different agent, model and tokenizer).

    .venv/bin/python bench/replays.py run OUT_DIR              # every session at every window
    .venv/bin/python bench/replays.py run OUT_DIR --windows 64000 --only 64da7265
    .venv/bin/python bench/replays.py run CODEX_DIR --codex    # the Codex sessions
    .venv/bin/python bench/replays.py table OUT_DIR [--before OLD_DIR]

`run` writes one JSON report per session and window (`<session>-<window>.json`, the report
`compactd replay --json` prints, without its per-step rows), one at a time: a replay is CPU
work, and minutes of it. `table` prints the Markdown table docs/decisions.md keeps — per
session and window, compactd's cost against the cheapest anchor that serves the window, the
requests over the window, "cannot fit", LLM calls and cache rewrites per 100 requests, and
fidelity — with `--before`, each figure as before → after. Each anchor's cost is there too (the
cheapest marked *, server-side "n/a" under its 50K minimum); beside compactd's calls,
rewrites and share in view, the cheapest anchor's in brackets.

The replay's settings are economy.md's: a 20,000-token system prompt, an 8,000-token output
reserve, a one-hour cache TTL, every cache write at 1.25×, digest summaries, recall on (as the
proxy runs), the main thread's figures.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import orjson

REPO = Path(__file__).resolve().parents[1]
TRANSCRIPTS = REPO / "tests" / "data" / "transcripts"
SESSIONS = sorted(
    [
        *(TRANSCRIPTS / "claude-code").glob("*.jsonl"),
        *(TRANSCRIPTS / "more" / "claude-code").glob("*.jsonl"),
    ]
)
CODEX = sorted((TRANSCRIPTS / "more" / "codex").glob("rollout-*.jsonl"))
WINDOWS = (200_000, 64_000, 48_000)
SETTINGS = {"reserve": 8_000, "ttl": "1h", "system_tokens": 20_000, "write_price": 1.25}
ANCHORS = {
    "codex": "Codex-like",
    "opencode": "opencode-like",
    "claude-code": "CC-like",
    "server": "server-side",
}


def label(path: str | Path) -> str:
    """A session's short name: its id's first eight characters (a Codex rollout's file name
    starts with `rollout-` and its start time, then the id)."""
    name = Path(path).name
    return name.removeprefix("rollout-")[20:28] if name.startswith("rollout-") else name[:8]


def replay_one(
    path: Path, window: int, config: dict[str, Any], system_breakpoint: bool = False
) -> dict[str, Any]:
    from compactd.context.engine import Engine
    from compactd.context.importers import load_transcript
    from compactd.context.replay import ReplayOptions, replay
    from compactd.context.stores.files import FileStore
    from compactd.context.summarizer.driver import digest_answer, drive

    with tempfile.TemporaryDirectory() as tmp:
        engine = Engine(FileStore(tmp), summary_provider="digest")
        imported = load_transcript(str(path))[0]
        options = ReplayOptions(
            window=window,
            config={"recall": True, **config},
            system_breakpoint=system_breakpoint,
            **SETTINGS,
        )
        report = drive(replay(engine, imported, options), digest_answer)
    out = report.to_json()
    # each step in brief: enough to see where the cost went
    out["steps"] = [
        {
            "index": s["index"],
            "thread": s["thread"],
            "tokens": s["tokens"],
            "tiers": s["tiers"],
            "cost": s["cost"],
            "llmCost": s["llmCost"],
            "rewrite": s["rewrite"],
            "cacheRead": s["cacheRead"],
            "anchorTokens": s["anchorTokens"],
        }
        for s in out["steps"]
    ]
    return out


def run(args: argparse.Namespace) -> int:
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    config = orjson.loads(args.config) if args.config else {}
    windows = [int(w) for w in args.windows.split(",")] if args.windows else WINDOWS
    only = args.only or []
    fleet = CODEX if args.codex else SESSIONS
    sessions = [p for p in fleet if not only or any(label(p).startswith(o) for o in only)]
    for path in sessions:
        for window in windows:
            target = out / f"{label(path)}-{window // 1000}k.json"
            if target.exists() and not args.again:
                continue
            start = time.monotonic()
            report = replay_one(path, window, config, args.system_breakpoint)
            report["seconds"] = round(time.monotonic() - start, 1)
            target.write_bytes(orjson.dumps(report, option=orjson.OPT_INDENT_2))
            print(f"{target.name}: {report['seconds']} s", file=sys.stderr, flush=True)
    return 0


def cheapest(main: dict[str, Any], notes: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    """The cheapest anchor that serves the window (server-side compaction cannot under a
    50K limit)."""
    serving = {
        name: main[name]
        for name in ANCHORS
        if main.get(name) and notes.get(name, {}).get("servesWindow", True)
    }
    name = min(serving, key=lambda n: serving[n]["cost"])
    return name, serving[name]


def row(report: dict[str, Any]) -> dict[str, Any]:
    main = report["mainThread"]
    mine = main["compactd"]
    name, anchor = cheapest(main, report.get("anchors") or {})
    return {
        "cost": mine["cost"],
        "anchor": ANCHORS[name],
        "anchorCost": anchor["cost"],
        "ratio": mine["cost"] / anchor["cost"],
        "over": mine["overWindow"],
        "cannotFit": mine["cannotFit"],
        "calls": mine["llmCallsPer100"],
        "anchorCalls": anchor["llmCallsPer100"],
        "rewrites": mine["rewritesPer100"],
        "anchorRewrites": anchor["rewritesPer100"],
        "visible": mine["fidelity"]["visible"],
        "oneCall": mine["fidelity"]["oneCall"],
        "anchorVisible": anchor["fidelity"]["visible"],
        "all": {n: main[n]["cost"] for n in ANCHORS if main.get(n)},
        "serves": {
            n: v.get("servesWindow", True) for n, v in (report.get("anchors") or {}).items()
        },
    }


def table(args: argparse.Namespace) -> int:
    after = _load(Path(args.out))
    before = _load(Path(args.before)) if args.before else {}
    print(
        "| session | window | compactd | Codex-like | opencode-like | CC-like | server-side "
        "| × the cheapest | over / cannot fit | LLM calls /100 | rewrites /100 "
        "| visible · one recall away |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    wins = total = 0
    for (session, window), report in sorted(after.items(), key=lambda kv: (kv[0][0], -kv[0][1])):
        now = row(report)
        old = row(before[(session, window)]) if (session, window) in before else None
        total += 1
        wins += now["ratio"] <= 1.0

        def pair(key: str, fmt: str, now: dict[str, Any] = now, old: Any = old) -> str:
            value = format(now[key], fmt)
            if old is None or format(old[key], fmt) == value:
                return value
            return f"{format(old[key], fmt)} → {value}"

        anchors = " | ".join(
            (f"{now['all'][name] / 1e6:.3f}M" if name in now["all"] else "-")
            + ("*" if ANCHORS[name] == now["anchor"] else "")
            + (" n/a" if not now["serves"].get(name, True) else "")
            for name in ANCHORS
        )
        print(
            f"| {session} | {window // 1000}K | {pair('cost', ',.0f')} | {anchors} "
            f"| {pair('ratio', '.2f')} | {pair('over', 'd')} / "
            f"{pair('cannotFit', 'd')} | {pair('calls', '.1f')} ({now['anchorCalls']:.1f}) | "
            f"{pair('rewrites', '.1f')} ({now['anchorRewrites']:.1f}) | {pair('visible', '.2f')} · "
            f"{pair('oneCall', '.2f')} ({now['anchorVisible']:.2f}) |"
        )
    print(f"\ncompactd at or under the cheapest anchor: {wins} of {total}", file=sys.stderr)
    return 0


def _load(folder: Path) -> dict[tuple[str, int], dict[str, Any]]:
    out = {}
    for path in folder.glob("*.json"):
        report = orjson.loads(path.read_bytes())
        out[(label(report["source"]), report["window"])] = report
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("run", help="replay every session at every window")
    p.add_argument("out")
    p.add_argument("--windows", help="comma-separated (default 200000,64000,48000)")
    p.add_argument("--only", nargs="*", help="session id prefixes")
    p.add_argument("--config", help="session config overrides, as JSON")
    p.add_argument("--again", action="store_true", help="replay even where a report exists")
    p.add_argument(
        "--system-breakpoint",
        action="store_true",
        help="a sensitivity, not economy.md's instrument: every policy reads its system prompt "
        "and tools back after any change, at the breakpoint agents put there",
    )
    p.add_argument("--codex", action="store_true", help="the shared Codex sessions instead")
    p = sub.add_parser("table", help="the Markdown table of a run")
    p.add_argument("out")
    p.add_argument("--before", help="an earlier run's folder: figures as before → after")
    args = parser.parse_args(argv)
    return run(args) if args.command == "run" else table(args)


if __name__ == "__main__":
    sys.exit(main())
