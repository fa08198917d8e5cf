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
    p.add_argument(
        "--summary-provider",
        choices=("digest", "anthropic", "client"),
        dest="replay_provider",
        default="digest",
        help="who writes summaries during the replay (default: digest, offline)",
    )
    p.add_argument("--config", help="session config for the replay, as JSON (policy knobs)")
    p.add_argument("--index", type=int, default=0, help="which session of a multi-session file")
    p.add_argument("--steps", action="store_true", help="print every step, not only totals")
    p.add_argument("--json", action="store_true")
    p.add_argument("--plot", metavar="FILE.png", help="draw tokens per step and cumulative cost")


async def run_replay(ns: argparse.Namespace, client: CompactdClient) -> int:
    params: dict[str, Any] = {
        "path": ns.path,
        "ttl": ns.ttl,
        "summaryProvider": ns.replay_provider,
        "index": ns.index,
    }
    if ns.window is not None:
        params["window"] = ns.window
    if ns.reserve is not None:
        params["reserve"] = ns.reserve
    if ns.config:
        params["config"] = orjson.loads(ns.config)
    if ns.system_tokens is not None:
        params["systemTokens"] = ns.system_tokens
    if ns.replay_model:
        params["model"] = ns.replay_model
    if ns.write_price is not None:
        params["writePrice"] = ns.write_price
    report = await client.request("session/replay", params, timeout=3600)
    if ns.plot:
        plot(report, ns.plot)
    if ns.json:
        print(orjson.dumps(report).decode())
        return 0
    print_report(report, show_steps=ns.steps)
    return 0


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
        "cache rewrites /100",
        "cannot fit",
        "removed w/o summarizer",
        "requests",
        box=None,
    )
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
            f"{totals.get('rewritesPer100', 0):.1f}",
            str(totals.get("cannotFit", 0)),
            f"{totals['removedWithoutSummary']:,}",
            str(totals["requests"]),
        )
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


def plot(report: dict[str, Any], path: str) -> None:
    """Tokens per step against the window and threshold, tier events marked, and cumulative
    cost for compactd and for no management."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as exc:  # an optional dependency
        raise SystemExit(
            "compactd: --plot needs matplotlib (pip install 'compactd[plot]')"
        ) from exc
    steps = report["steps"]
    xs = list(range(len(steps)))
    fig, (top, bottom) = plt.subplots(
        2, 1, figsize=(11, 7), sharex=True, gridspec_kw={"height_ratios": [3, 2]}
    )
    top.plot(xs, [s["tokens"] for s in steps], color="tab:blue", label="compactd", lw=1.5)
    if any(s.get("baselineTokens") is not None for s in steps):
        top.plot(
            xs,
            [s.get("baselineTokens") or 0 for s in steps],
            color="tab:gray",
            lw=1,
            ls="--",
            label="no management",
        )
    top.axhline(report["limit"], color="black", lw=1, label="window − reserve")
    top.axhline(report["threshold"], color="black", lw=0.8, ls=":", label="cascade threshold")
    seen: set[str] = set()
    for x, s in zip(xs, steps, strict=True):
        for tier in s["tiers"]:
            colour = TIER_COLOURS.get(tier, "tab:olive")
            top.axvline(x, color=colour, alpha=0.35, lw=1, label=tier if tier not in seen else None)
            seen.add(tier)
    top.set_ylabel("tokens per request")
    top.set_title(
        f"replay of {report['source']} · window {report['window']:,} · TTL {report['ttl']}"
    )
    top.legend(loc="upper left", fontsize=8)
    cumulative, base, running, running_base = [], [], 0.0, 0.0
    for s in steps:
        running += s["cost"] + s["summaryInput"] + 5 * s["summaryOutput"]
        running_base += s.get("baselineCost") or 0.0
        cumulative.append(running)
        base.append(running_base)
    bottom.plot(xs, cumulative, color="tab:blue", label="compactd")
    if any(s.get("baselineCost") is not None for s in steps):
        bottom.plot(xs, base, color="tab:gray", ls="--", label="no management")
    bottom.set_ylabel("cumulative cost\n(input-token eq.)")
    bottom.set_xlabel("model request")
    bottom.legend(loc="upper left", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
