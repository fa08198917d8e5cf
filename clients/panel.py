"""The `/context` panel: a coloured grid of the window and a table of token categories.

Built from a `context/measure` (or render `tokens`) result only, so every client that has the
wire data can show the same panel the CLI shows.
"""

from __future__ import annotations

from typing import Any

from rich.console import Console, Group
from rich.table import Table
from rich.text import Text

# category -> (label, colour, glyph)
CATEGORY_STYLE: dict[str, tuple[str, str, str]] = {
    "system": ("System prompt", "grey62", "⛁"),
    "tools": ("Tool definitions", "cyan", "⛁"),
    "schema": ("Response schema", "bright_cyan", "⛁"),
    "user": ("User messages", "bright_blue", "⛁"),
    "assistant": ("Assistant text", "magenta", "⛁"),
    "thinking": ("Thinking", "bright_magenta", "⛁"),
    "tool_calls": ("Tool calls", "yellow", "⛁"),
    "tool_results": ("Tool results", "bright_yellow", "⛁"),
    "markers": ("Summaries & markers", "green", "⛁"),
    "output_reserve": ("Output reserve", "red", "⛝"),
    "free": ("Free space", "grey35", "⛶"),
}
GRID_CELLS = 100  # 10 × 10, one cell per 1 % of the window


def grid_cells(categories: dict[str, int], window: int) -> list[str]:
    """Which category each of the 100 cells shows (largest-remainder rounding, so the cells
    add up to the window and every non-empty category gets its fair share)."""
    order = [k for k in CATEGORY_STYLE if k != "free"]
    used = {k: max(0, int(categories.get(k, 0))) for k in order}
    scale = max(window, sum(used.values()))  # over-full: the cells show its makeup
    exact = {k: used[k] * GRID_CELLS / scale if scale else 0 for k in order}
    cells = {k: int(v) for k, v in exact.items()}
    budget = GRID_CELLS - sum(cells.values())
    for k in sorted(order, key=lambda k: exact[k] - cells[k], reverse=True):
        if budget <= 0:
            break
        if exact[k] - cells[k] > 0:
            cells[k] += 1
            budget -= 1
    out: list[str] = []
    for k in order:
        out.extend([k] * cells[k])
    out.extend(["free"] * max(0, GRID_CELLS - len(out)))
    return out[:GRID_CELLS]


def build_panel(measure: dict[str, Any], title: str = "Context") -> Group:
    window = int(measure.get("window", 0))
    categories: dict[str, int] = dict(measure.get("categories", {}))
    total = int(measure.get("total", 0))
    cells = grid_cells(categories, window)
    grid = Text()
    for row in range(10):
        for col in range(10):
            cat = cells[row * 10 + col]
            _, colour, glyph = CATEGORY_STYLE[cat]
            grid.append(glyph + " ", style=colour)
        grid.append("\n")
    pct = 100 * total / window if window else 0.0
    heading = Text(f"{title} · {total:,} / {window:,} tokens ({pct:.1f}%)", style="bold")
    table = Table(box=None, pad_edge=False, show_header=True, header_style="bold")
    table.add_column("")
    table.add_column("Category")
    table.add_column("Tokens", justify="right")
    table.add_column("% of window", justify="right")
    for key, (label, colour, glyph) in CATEGORY_STYLE.items():
        value = int(categories.get(key, 0))
        if value == 0 and key not in ("free", "output_reserve"):
            continue
        if key == "free" and value < 0:  # no free space: say by how much it is over
            label, colour, value = "Over the limit by", "bold red", -value
        share = 100 * value / window if window else 0.0
        table.add_row(Text(glyph, style=colour), label, f"{value:,}", f"{share:.1f}%")
    lines: list[Any] = [heading, grid, table]
    free = int(categories.get("free", 0))
    if free < 0:
        reserve = int(categories.get("output_reserve", 0))
        lines.append(
            Text(
                f"The request is {-free:,} tokens over its limit of {window - reserve:,} "
                f"(window {window:,} − output reserve {reserve:,}).",
                style="bold red",
            )
        )
    advice = measure.get("advice")
    if advice:
        lines.append(Text(str(advice), style="italic"))
    return Group(*lines)


def print_panel(
    measure: dict[str, Any], title: str = "Context", console: Console | None = None
) -> None:
    (console or Console()).print(build_panel(measure, title))
