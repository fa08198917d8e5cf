"""`compactd replay`: how a real session would have gone under the cascade, priced.

The daemon does the replay (`session/replay`, in a scratch store); this module prints its
report — per-step rows, and totals for compactd, "no management" and the recorded run — and
draws the picture.
"""

from __future__ import annotations

import argparse
from typing import Any

import orjson
from rich.console import Console
from rich.table import Table

from .client import CompactdClient

TIER_COLOURS = {
    "microcompact": "tab:orange",
    "snip": "tab:red",
    "collapse": "tab:purple",
    "summary": "tab:green",
    "reactive": "tab:brown",
}


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("path", help="a transcript (Claude Code, Codex, OpenHands, SWE-agent)")
    p.add_argument("--window", type=int, help="context window (default: the model's)")
    p.add_argument(
        "--reserve", type=int, help="output reserve (default: min(model max, 20K, window/4))"
    )
    p.add_argument("--ttl", choices=("5m", "1h"), default="1h", help="prompt-cache TTL")
    p.add_argument(
        "--system-tokens",
        type=int,
        help="the system prompt on every request, in the provider's tokens (default: fitted "
        "on the recorded calls, or 20,000)",
    )
    p.add_argument("--model", dest="replay_model", help="model id (default: the transcript's)")
    p.add_argument(
        "--write-price",
        type=float,
        help="price of a cache write (default: 1.25 for 5m, 2 for 1h; the economy notes' "
        "instrument uses 1.25 throughout)",
    )
    p.add_argument("--index", type=int, default=0, help="which session of a multi-session file")
    p.add_argument("--steps", action="store_true", help="print every step, not only totals")
    p.add_argument("--json", action="store_true", help="print the whole report as JSON")
    p.add_argument("--plot", metavar="FILE.png", help="draw tokens per step and cumulative cost")


async def run_replay(
    ns: argparse.Namespace, client: CompactdClient, token: str | None = None
) -> int:
    """Exit 1 when a summary provider failed during the replay: its figures then describe a
    run without those summaries, which is not what was asked for."""
    report = await client.replay(
        ns.path,
        window=ns.window,
        reserve=ns.reserve,
        ttl=ns.ttl,
        summary_provider=ns.summary_provider or "digest",
        config=ns.session_config or None,
        index=ns.index,
        model=ns.replay_model,
        system_tokens=ns.system_tokens,
        write_price=ns.write_price,
        work_done_token=token,
    )
    if ns.plot:
        plot(report, ns.plot)
    failures = provider_failures(report)
    if ns.json:
        print(orjson.dumps(report).decode())
    else:
        print_report(report, show_steps=ns.steps)
    if failures:
        console = Console(stderr=True, highlight=False)
        for reason, count in failures.items():
            console.print(f"[red]summary failed[/red] {count}×: {reason}")
        return 1
    return 0


def provider_failures(report: dict[str, Any]) -> dict[str, int]:
    """Each distinct failure of the summary provider during the replay, with its count."""
    out: dict[str, int] = {}
    for step in report["steps"]:
        for event in step["events"]:
            if event.get("failed"):
                out[event["reason"]] = out.get(event["reason"], 0) + 1
    return out


def print_report(
    report: dict[str, Any], show_steps: bool = False, console: Console | None = None
) -> None:
    console = console or Console(width=max(120, Console().width))
    console.print(
        f"[bold]replay of {report['source']}[/bold] · window {report['window']:,} · "
        f"limit {report['limit']:,} · threshold {report['threshold']:,} · "
        f"TTL {report['ttl']} · summaries: {report['provider'] or 'none'}"
    )
    units = report.get("units")
    if units:
        fit = units["fit"].get("main")
        how = (
            f"fitted on {fit['points']} recorded calls, median error {fit['medianError']:.1%}, "
            f"max {fit['maxError']:.1%}"
            if units["source"] == "fitted" and fit
            else units["source"]
        )
        system = units["systemTokens"]
        console.print(
            f"provider's units: {units['ratio']:.3f} per estimated token ({how}); system "
            f"prompt {system['main']:,} (main) / {system['function']:,} (sub-agents) tokens"
        )
    if show_steps:
        steps = Table(
            "step",
            "thread",
            "tokens",
            "tiers",
            "cache read",
            "cache write",
            "cost",
            "no mgmt",
            "recorded",
            box=None,
        )
        for s in report["steps"]:
            steps.add_row(
                str(s["index"]),
                s["thread"],
                f"{s['tokens']:,}",
                ",".join(s["tiers"]) + (" CANNOT FIT" if s["cannotFit"] else ""),
                f"{s['cacheRead']:,}",
                f"{s['cacheWrite']:,}",
                f"{s['cost']:,.0f}",
                _num(s.get("baselineTokens")),
                _num(s.get("recordedTokens")),
            )
        console.print(steps)
    table = Table(
        "",
        "cost (input-token eq.)",
        "peak tokens",
        "over window",
        "cache-read share",
        "LLM calls",
        "failed",
        "cache rewrites /100",
        "cannot fit",
        "removed w/o summarizer",
        "requests",
        box=None,
    )
    failed = sum(provider_failures(report).values())
    rows = [(name, t) for name, t in report["totals"].items()]
    rows += [(f"{name} (main)", t) for name, t in (report.get("mainThread") or {}).items()]
    for name, totals in rows:
        if totals is None:
            continue
        table.add_row(
            name,
            f"{totals['cost']:,.0f}",
            f"{totals['peak']:,}",
            str(totals["overWindow"]),
            f"{totals['cacheReadShare']:.1%}",
            str(totals["llmCalls"]),
            (f"[red]{failed}[/red]" if failed else "0") if name == "compactd" else "-",
            f"{totals.get('rewritesPer100', 0):.1f}",
            str(totals.get("cannotFit", 0)),
            f"{totals['removedWithoutSummary']:,}",
            str(totals["requests"]),
        )
    table.columns[0].no_wrap = True
    console.print(table)
    recall = report.get("recall")
    if recall:
        console.print(
            f"recall: {recall['cutResults']} tool results cut on arrival "
            f"({recall['cutChars']:,} characters), {recall['clearedResults']} cleared by Tier 1, "
            f"{recall['handlesShown']} handles shown"
        )


def _num(value: Any) -> str:
    return "-" if value is None else f"{value:,}"


MAX_THREAD_PANELS = 6


def human(value: float, _pos: object = None) -> str:
    """An axis tick a reader takes in at a glance: 950, 48K, 1.2M."""
    size = abs(value)
    if size >= 1_000_000:
        return f"{value / 1_000_000:.1f}".rstrip("0").rstrip(".") + "M"
    if size >= 1_000:
        return f"{value / 1_000:.0f}K"
    return f"{value:.0f}"


def threads(steps: list[dict[str, Any]]) -> dict[str, list[tuple[int, dict[str, Any]]]]:
    """Steps by thread (main first, then sub-agents in the order they start), each with its
    position in the whole run: a thread's requests are what share a cached prefix."""
    out: dict[str, list[tuple[int, dict[str, Any]]]] = {"main": []}
    for position, step in enumerate(steps):
        out.setdefault(step["thread"], []).append((position, step))
    return out


def plot(report: dict[str, Any], path: str) -> None:
    """One panel per thread — the main thread's requests, with where sub-agents ran shaded,
    then each sub-agent's own — tokens per request for compactd, no management and the
    recorded run against the limit and threshold, tier events marked; and cumulative cost."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        from matplotlib.ticker import FuncFormatter, MaxNLocator
    except ImportError as exc:  # an optional dependency
        raise SystemExit(
            "compactd: --plot needs matplotlib "
            "(in a clone: pip install '.[plot]', or pip install matplotlib)"
        ) from exc
    steps = report["steps"]
    by_thread = threads(steps)
    subs = [name for name in by_thread if name != "main"]
    shown = subs[:MAX_THREAD_PANELS]
    sub_rows = (len(shown) + 1) // 2
    heights = [3.0] + [1.7] * sub_rows + [2.0]
    fig = plt.figure(figsize=(12, sum(heights) + 1.2))
    grid = fig.add_gridspec(len(heights), 2, height_ratios=heights)
    formatter = FuncFormatter(human)
    seen: set[str] = set()

    def thread_panel(ax: Any, name: str, rows: list[tuple[int, dict[str, Any]]]) -> None:
        xs = list(range(len(rows)))
        series = (
            ("tokens", "compactd", "tab:blue", "-"),
            ("baselineTokens", "no management", "tab:gray", "--"),
            ("recordedTokens", "recorded run", "tab:pink", ":"),
        )
        for key, label, colour, style in series:
            points = [(x, s[key]) for x, (_, s) in zip(xs, rows, strict=True) if s.get(key)]
            if points:
                ax.plot(*zip(*points, strict=True), color=colour, ls=style, lw=1.3, label=label)
        ax.axhline(report["limit"], color="black", lw=1, label="window − reserve")
        ax.axhline(report["threshold"], color="black", lw=0.8, ls=":", label="threshold")
        for x, (_, s) in zip(xs, rows, strict=True):
            for tier in s["tiers"]:
                colour = TIER_COLOURS.get(tier, "tab:olive")
                ax.axvline(x, color=colour, alpha=0.4, lw=1, label=None if tier in seen else tier)
                seen.add(tier)
            if s["cannotFit"]:
                ax.plot(x, s["tokens"], "x", color="red")
        ax.yaxis.set_major_formatter(formatter)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set_title(name, fontsize=9, loc="left")
        ax.set_ylim(bottom=0)

    main = fig.add_subplot(grid[0, :])
    main_rows = by_thread["main"]
    thread_panel(main, "main thread", main_rows)
    # where sub-agents ran: between the main requests around their own
    positions = [position for position, _ in main_rows]
    for name in subs:
        first, last = by_thread[name][0][0], by_thread[name][-1][0]
        start = sum(1 for p in positions if p < first) - 0.5
        end = sum(1 for p in positions if p < last) - 0.5
        main.axvspan(start, max(end, start + 0.3), color="tab:purple", alpha=0.08, lw=0)
    if subs:
        main.axvspan(0, 0, color="tab:purple", alpha=0.15, label="sub-agents running")
    main.set_ylabel("tokens per request")
    main.set_title(
        f"replay of {report['source']} · window {human(report['window'])} · TTL {report['ttl']}"
        f" · summaries: {report['provider'] or 'none'}"
    )
    main.legend(loc="upper left", fontsize=7, ncol=3)
    for i, name in enumerate(shown):
        ax = fig.add_subplot(grid[1 + i // 2, i % 2])
        thread_panel(ax, f"sub-agent {name.removeprefix('function:')}", by_thread[name])
    if len(subs) > len(shown):
        fig.text(0.99, 0.01, f"{len(subs) - len(shown)} more sub-agent(s) not drawn", ha="right")
    cost = fig.add_subplot(grid[-1, :])
    lines = {"compactd": [], "no management": [], "recorded run": []}
    totals = {name: 0.0 for name in lines}
    for s in steps:
        totals["compactd"] += s["cost"] + s["summaryInput"] + 5 * s["summaryOutput"]
        totals["no management"] += s.get("baselineCost") or 0.0
        totals["recorded run"] += s.get("recordedCost") or 0.0
        for name in lines:
            lines[name].append(totals[name])
    styles = {"compactd": "tab:blue", "no management": "tab:gray", "recorded run": "tab:pink"}
    for name, values in lines.items():
        if values and values[-1] > 0:
            cost.plot(values, color=styles[name], label=name)
    cost.yaxis.set_major_formatter(formatter)
    cost.set_ylabel("cumulative cost\n(input-token eq.)")
    cost.set_xlabel("model request (all threads, in order)")
    cost.legend(loc="upper left", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
