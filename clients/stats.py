"""`compactd stats` in the terminal: a table per session and per day, and the totals, from the
report's JSON (`{"sessions", "days", "totals"}`) alone."""

from __future__ import annotations

import datetime as dt
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table

NOTE = (
    "saved: what the client's own requests would have cost sent straight, less what compactd "
    "sent and its own calls, in input-token equivalents (cache reads 0.1×, writes 1.25×, "
    "output 5×); $ at each model's published price"
)


def tokens(value: Any) -> str:
    """1,234 → 1.2K; 1,234,567 → 1.23M."""
    n = float(value or 0)
    sign = "-" if n < 0 else ""
    n = abs(n)
    if n >= 1_000_000:
        return f"{sign}{n / 1_000_000:.2f}M"
    if n >= 10_000:
        return f"{sign}{n / 1000:.0f}K"
    if n >= 1000:
        return f"{sign}{n / 1000:.1f}K"
    return f"{sign}{n:.0f}"


def money(sums: dict[str, Any]) -> str:
    """The saving in US$, or why there is none (a model without a published price)."""
    if sums.get("savedUsd") is None:
        unknown = ", ".join(sums.get("unpricedModels") or []) or "?"
        return f"? (no price: {unknown})"
    value = sums["savedUsd"]
    return f"{'-' if value < 0 else ''}${abs(value):,.2f}"


def saved_share(sums: dict[str, Any]) -> str:
    client = sums.get("clientInputTokens") or 0
    if not client:
        return ""
    return f" ({100 * sums['savedInputTokens'] / client:.0f}%)"


def _columns(table: Table) -> None:
    for name in ("requests", "client sent", "upstream", "cache read", "cache write", "output"):
        table.add_column(name, justify="right")
    table.add_column("compactd calls", justify="right")
    table.add_column("saved", justify="right")
    table.add_column("saved $", justify="right")


def _figures(sums: dict[str, Any]) -> list[str]:
    return [
        str(sums["requests"]),
        tokens(sums["clientInputTokens"]),
        tokens(sums["upstreamInputTokens"]),
        tokens(sums["cacheReadInputTokens"]),
        tokens(sums["cacheCreationInputTokens"]),
        tokens(sums["outputTokens"]),
        str(sums["compactdCalls"]),
        tokens(sums["savedInputTokens"]) + saved_share(sums),
        money(sums),
    ]


def sessions_table(sessions: list[dict[str, Any]]) -> Table:
    table = Table(title="per session (newest first)", box=None, title_justify="left")
    table.add_column("session")
    table.add_column("agent")
    table.add_column("model")
    table.add_column("state")
    table.add_column("last")
    _columns(table)
    for s in sessions:
        last = dt.datetime.fromtimestamp(s["lastAt"]).strftime("%m-%d %H:%M") if s["lastAt"] else ""
        table.add_row(
            s["sessionId"][:20],
            escape((s.get("agent") or "")[:24]),
            escape(s.get("model") or ""),
            s["state"],
            last,
            *_figures(s),
        )
    return table


def days_table(days: list[dict[str, Any]]) -> Table:
    table = Table(title="per day", box=None, title_justify="left")
    table.add_column("day")
    _columns(table)
    for d in days:
        table.add_row(d["date"], *_figures(d))
    return table


def print_stats(report: dict[str, Any], color: bool | None = None) -> None:
    console = Console(force_terminal=color, width=max(160, Console().width))
    totals = report["totals"]
    if not report["sessions"]:
        console.print(
            "nothing recorded yet: `compactd claude` (or `compactd proxy`) records every request "
            "it relays"
        )
        return
    console.print(sessions_table(report["sessions"]))
    console.print()
    console.print(days_table(report["days"]))
    console.print()
    passed = totals["passedThrough"]
    console.print(
        f"[bold]{totals['sessions']} session(s), {totals['requests']} request(s)"
        + (f", {passed} passed through unmanaged" if passed else "")
        + f": saved {tokens(totals['savedInputTokens'])} input-token equivalents"
        + f"{saved_share(totals)}, {money(totals)}[/bold]",
        highlight=False,
    )
    console.print(f"[dim]{NOTE}[/dim]", highlight=False)
