"""`compactd replay`: how a real session would have gone under the cascade, priced.

The daemon does the replay (`session/replay`, in a scratch store); this module prints its
report — per-step rows, and totals for compactd, "no management" and the recorded run — and
draws the picture.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import orjson

from .. import install_advice

if TYPE_CHECKING:
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
    p.epilog = EXPLAINED  # the table's terms, laid out as written
    p.formatter_class = argparse.RawDescriptionHelpFormatter
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
    """Exit 1 when a summary provider failed during the replay (its figures then describe a
    run without those summaries, which is not what was asked for) or when a request could not
    be made to fit (what the cascade is for), each said in a line. A `--plot` that could not
    be written is said before the replay runs (exit 2)."""
    problem = ns.plot and plot_problem(ns.plot)
    if problem:
        print(f"compactd: --plot {ns.plot}: {problem}", file=sys.stderr)
        return 2
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
    from rich.console import Console  # here: the parser imports this module for every command

    console = Console(stderr=True, highlight=False, soft_wrap=True)
    for reason, count in failures.items():
        console.print(f"[red]summary failed[/red] {count}×: {reason}")
    unfit = cannot_fit(report)
    if unfit:
        console.print(f"compactd: {unfit}")
    return 1 if failures or unfit else 0


def cannot_fit(report: dict[str, Any]) -> str | None:
    """Why the replay is not good when some of its requests could not be made to fit, in one
    line: how many, the limit, and the system prompt when it alone is over the limit."""
    totals = report["totals"]["compactd"]
    count = totals.get("cannotFit", 0)
    if not count:
        return None
    limit, window = report["limit"], report["window"]
    line = (
        f"{count:,} of {totals['requests']:,} requests cannot fit the limit of {limit:,} "
        f"tokens ({window:,} window − {window - limit:,} output reserve)"
    )
    units = report.get("units") or {}
    system = units.get("systemTokens") or {}
    largest = max((v for v in system.values() if isinstance(v, int)), default=0)
    how = (
        "assumed: the transcript records no call to fit it on"
        if units.get("source") == "prior"
        else "as fitted on the recorded calls"
    )
    if largest >= limit:
        return (
            f"{line}: the system prompt alone is {largest:,} tokens ({how}); replay with a "
            "larger --window, or give the prompt's size with --system-tokens N"
        )
    return (
        f"{line}: the system prompt ({largest:,} tokens, {how}) with what each request keeps "
        "verbatim is over it (--steps shows which requests)"
    )


def plot_needs() -> str:
    """What is missing for `--plot`, and the command that adds it to this installation."""
    return f"needs matplotlib: {install_advice('matplotlib>=3.9')}"


def plot_problem(path: str) -> str | None:
    """Why the picture could not be written to `path`, or None (checked before minutes of
    replay, which would otherwise end in a traceback)."""
    target = Path(path)
    folder = target.parent
    if target.is_dir():
        return "is a folder; give the picture's file name"
    if not folder.is_dir():
        return f"the folder {str(folder)!r} does not exist"
    if not os.access(folder, os.W_OK):
        return f"the folder {str(folder)!r} is not writable"
    if importlib.util.find_spec("matplotlib") is None:
        return plot_needs()
    return None


def provider_failures(report: dict[str, Any]) -> dict[str, int]:
    """Each distinct failure of the summary provider during the replay, with its count."""
    out: dict[str, int] = {}
    for step in report["steps"]:
        for event in step["events"]:
            if event.get("failed"):
                out[event["reason"]] = out.get(event["reason"], 0) + 1
    return out


RUNS = {"compactd": "compactd", "baseline": "no management", "recorded": "recorded run"}
# the columns of the anchors' table, named short so six fit 80 columns (`replay -h` says what
# each policy is)
ANCHORS = {
    "compactd": "compactd",
    "codex": "Codex",
    "opencode": "opencode",
    "claude-code": "CC",
    "server": "server",
}
# the rows of the totals table: each a measure, in the words `replay -h` explains
MEASURES: tuple[tuple[str, str], ...] = (
    ("cost", "cost (input-token eq.)"),
    ("saved", "saved vs no management"),
    ("savedVsRecorded", "saved vs the recorded run"),
    ("peak", "largest request (tokens)"),
    ("overLimit", "requests over the limit"),
    ("overWindow", "requests over the window"),
    ("cannotFit", "requests that cannot fit"),
    ("cacheReadShare", "read from the cache"),
    ("rewritesPer100", "cache rewrites per 100"),
    ("llmCalls", "LLM calls"),
    ("removedWithoutSummary", "removed unsummarized"),
    ("requests", "requests"),
)
# the rows of the table beside the anchor policies (economy.md)
ANCHOR_MEASURES: tuple[tuple[str, str], ...] = (
    ("cost", "cost (input-token eq.)"),
    ("llmCost", "of which LLM calls"),
    ("overLimit", "requests over the limit"),
    ("overWindow", "requests over the window"),
    ("llmCalls", "LLM calls"),
    ("llmCallsPer100", "LLM calls per 100"),
    ("rewritesPer100", "cache rewrites per 100"),
    ("peak", "largest request (tokens)"),
    ("uses", "later uses of a result"),
    ("visible", "  in view"),
    ("oneCall", "  one recall call away"),
    ("further", "  further"),
)
FIDELITY = ("uses", "visible", "oneCall", "further")
EXPLAINED = """\
The totals table has a column per run: compactd (the cascade at this window),
no management (every request whole, nothing removed) and the recorded run
(what the agent sent, from the transcript's usage). Its rows:
  cost              input tokens priced as the provider bills them, in
                    input-token equivalents: a cache read 0.1, a cache write
                    --write-price, an LLM call its input + 5x its output
                    (the output counted at no less than 2,000 tokens for a
                    summary, 100 a collapse segment, 200 a result for tool
                    evidence; a named cheaper summary model at its price)
  saved vs ...      how much less the column's run cost than that run
                    (negative: it cost more)
  largest request   the peak request, in the provider's tokens
  over the limit    requests larger than window - output reserve (no room
                    left for the reply); over the window: those the
                    provider refuses outright; cannot fit: those the
                    cascade could not bring under the limit
  read from cache   the share of input tokens read from the prompt cache
  cache rewrites    requests that re-wrote part of the previous request's
                    live cache (read less than 90 % of it), per 100
  LLM calls         calls for summaries, collapses and tool evidence, those
                    of background preparation included (failed: the
                    provider failed; the figures are then without them)
  removed           tokens cleared or snipped away with no summary of them
  unsummarized
With sub-agents, a second table shows the main thread alone. Then compactd
beside the anchor policies, simulated on the same messages and priced the
same way: Codex-like (tool output recorded cut to 10,000 characters; after a
request at 90 % of the window, a summary plus the newest user messages up to
20K tokens, everything else dropped), opencode-like (old tool output pruned
beyond the newest 40K tool tokens; a summary plus the tail of the last two
user turns at window - min(20K, reserve)), CC-like (Claude Code's autocompact:
a summary and ~10K of restored files at window - min(reserve, 20K) - 13K) and
server-side (Anthropic's compact_20260112: the provider summarizes a request
over min(150K, limit - 10K), never under its 50K minimum, reading it as a
cached fork; under a 50K limit it cannot serve the window, marked "n/a").
Their last rows are fidelity: of the terms (identifiers, paths, numbers) the
agent's recorded answers used that it had only seen in tool results, the share
in view in the request it answered (summaries aside), one compactd_recall call
away (a handle or tool_use id of a result holding it is in the request;
compactd with recall on), or further. Last, how many checkpoints background
preparation wrote (during recorded gaps of prepareIdleSeconds) and how many of
them no compaction used."""


def print_report(
    report: dict[str, Any], show_steps: bool = False, console: Console | None = None
) -> None:
    from rich.console import Console

    console = console or Console(highlight=False)
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
        console.print(steps_table(report))
    failed = sum(provider_failures(report).values())
    console.print(totals_table(report["totals"], failed, "all threads"))
    main = report.get("mainThread")
    if (
        main
        and main.get("compactd")
        and main["compactd"]["requests"] < (report["totals"]["compactd"]["requests"])
    ):
        console.print(totals_table(main, None, "main thread"))
    anchors = main if main and main.get("compactd") else report["totals"]
    if any(anchors.get(name) for name in ANCHORS if name != "compactd"):
        scope = "main thread" if anchors is main else "all threads"
        title = f"beside the anchor policies ({scope})"
        console.print(anchors_table(anchors, title, report.get("anchors") or {}))
    mine = report["totals"]["compactd"]
    if report.get("provider") and "prepared" in mine:  # said even when it is none
        console.print(
            f"background preparation: {mine['prepared']} checkpoint(s) prepared, "
            f"{mine['preparedUnused']} never used"
        )
    recall = report.get("recall")
    if recall:
        console.print(
            f"recall: {recall['cutResults']} tool results cut on arrival "
            f"({recall['cutChars']:,} characters), {recall['clearedResults']} cleared by Tier 1, "
            f"{recall['handlesShown']} handles shown"
        )


def savings(cost: float, other: dict[str, Any] | None) -> str:
    """How much less `cost` is than the other run's (negative: more)."""
    if not other or not other.get("cost"):
        return "-"
    share = round(1 - cost / other["cost"], 3)
    return f"{share + 0.0:.1%}"  # + 0.0: a saving that rounds to nothing is 0.0 %, not -0.0 %


def totals_table(totals: dict[str, Any], failed: int | None, title: str) -> Table:
    """One column per run that has figures, one row per measure: fits 80 columns."""
    from rich.table import Table

    totals = {name: t for name, t in totals.items() if name in RUNS}
    runs = [(RUNS[name], t) for name, t in totals.items() if t is not None]
    table = Table(title=title, title_justify="left", box=None, pad_edge=False)
    table.add_column("")
    for label, _ in runs:
        table.add_column(label, justify="right")
    baseline, recorded = totals.get("baseline"), totals.get("recorded")
    for key, label in MEASURES:
        cells: list[str] = []
        for name, t in totals.items():
            if t is None:
                continue
            cells.append(_measure(key, name, t, baseline, recorded, failed))
        if key == "savedVsRecorded" and not recorded:
            continue
        table.add_row(label, *cells)
    return table


def anchors_table(
    totals: dict[str, Any], title: str, notes: dict[str, dict[str, Any]] | None = None
) -> Table:
    """compactd beside the anchor policies: a column each, a row per measure (an anchor that
    cannot serve the window, server-side compaction under its 50K minimum, is marked)."""
    from rich.table import Table

    runs = [(name, label, totals[name]) for name, label in ANCHORS.items() if totals.get(name)]
    table = Table(title=title, title_justify="left", box=None, pad_edge=False)
    table.add_column("")
    for name, label, _ in runs:
        serves = (notes or {}).get(name, {}).get("servesWindow", True)
        table.add_column(label if serves else f"{label} (n/a)", justify="right")
    for key, label in ANCHOR_MEASURES:
        cells = []
        for _, _, t in runs:
            if key in FIDELITY:
                fidelity = t.get("fidelity") or {}
                value = fidelity.get(key, 0)
                cells.append(f"{value:,}" if key == "uses" else f"{value:.0%}")
                continue
            value = t.get(key, 0)
            cells.append(f"{value:.1f}" if key.endswith("Per100") else f"{value:,.0f}")
        table.add_row(label, *cells)
    return table


def _measure(
    key: str,
    run: str,
    t: dict[str, Any],
    baseline: dict[str, Any] | None,
    recorded: dict[str, Any] | None,
    failed: int | None,
) -> str:
    if key == "saved":
        return "-" if run == "baseline" else savings(t["cost"], baseline)
    if key == "savedVsRecorded":
        return savings(t["cost"], recorded) if run == "compactd" else "-"
    if key == "cost":
        return f"{t['cost']:,.0f}"
    if key == "cacheReadShare":
        return f"{t['cacheReadShare']:.1%}"
    if key == "rewritesPer100":
        return f"{t.get('rewritesPer100', 0):.1f}"
    if key == "llmCalls":
        if run != "compactd":
            return "-"
        return f"{t['llmCalls']} ([red]{failed} failed[/red])" if failed else str(t["llmCalls"])
    if key in ("removedWithoutSummary", "cannotFit") and run != "compactd":
        return "-"  # only the cascade removes, or fails to fit
    return f"{t.get(key, 0):,}"


def steps_table(report: dict[str, Any]) -> Table:
    from rich.table import Table

    steps = Table(
        "step",
        "thread",
        "tokens",
        "tiers",
        "read",
        "written",
        "cost",
        "no mgmt",
        "recorded",
        box=None,
        pad_edge=False,
        title="each request: its tokens, what the cascade did, the cache read and written",
        title_justify="left",
    )
    for s in report["steps"]:
        steps.add_row(
            str(s["index"]),
            s["thread"].removeprefix("function:"),
            f"{s['tokens']:,}",
            " ".join(s["tiers"]) + (" CANNOT FIT" if s["cannotFit"] else ""),  # wraps
            f"{s['cacheRead']:,}",
            f"{s['cacheWrite']:,}",
            f"{s['cost']:,.0f}",
            _num(s.get("baselineTokens")),
            _num(s.get("recordedTokens")),
        )
    return steps


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


def saving_text(report: dict[str, Any]) -> str | None:
    """What compactd saved against no management, in input-token equivalents and, where the
    model has a published price, in US$ (equivalents priced at its input price)."""
    totals = report.get("totals") or {}
    ours, baseline = totals.get("compactd"), totals.get("baseline")
    if not ours or not baseline or not baseline.get("cost"):
        return None
    saved = baseline["cost"] - ours["cost"]
    text = (
        f"saved {human(saved)} input-token eq. against no management "
        f"({saved / baseline['cost']:.0%})"
    )
    price = report.get("price")
    model = report.get("model") or "the model"
    if price:
        money = saved * price["inputPerMillion"] / 1e6
        text += (
            f"\n≈ {'-' if money < 0 else ''}${abs(money):,.2f} at {model}'s price "
            f"(${price['inputPerMillion']:g}/M input, {price['taken']})"
        )
    else:
        text += f"\nno published price for {model}: no money figure"
    return text


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
        raise SystemExit(f"compactd: --plot {plot_needs()}") from exc
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
        totals["compactd"] += s["cost"] + s["llmCost"]
        totals["no management"] += s.get("baselineCost") or 0.0
        totals["recorded run"] += s.get("recordedCost") or 0.0
        for name in lines:
            lines[name].append(totals[name])
    styles = {"compactd": "tab:blue", "no management": "tab:gray", "recorded run": "tab:pink"}
    for name, values in lines.items():
        if values and values[-1] > 0:
            cost.plot(values, color=styles[name], label=name)
    said = saving_text(report)
    if said:
        cost.text(
            0.99,
            0.05,
            said,
            transform=cost.transAxes,
            ha="right",
            va="bottom",
            fontsize=9,
            bbox={"boxstyle": "round", "facecolor": "white", "alpha": 0.85},
        )
    cost.yaxis.set_major_formatter(formatter)
    cost.set_ylabel("cumulative cost\n(input-token eq.)")
    cost.set_xlabel("model request (all threads, in order)")
    cost.legend(loc="upper left", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
