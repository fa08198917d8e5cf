"""The replay picture: a panel per thread (so a sub-agent's requests never zig-zag the main
thread's line), the recorded run drawn, and ticks a reader takes in at a glance."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from compactd.clients.replay import human, plot, threads

matplotlib = pytest.importorskip("matplotlib")


def step(index: int, thread: str, tokens: int, tiers: list[str] | None = None) -> dict[str, Any]:
    return {
        "index": index,
        "thread": thread,
        "tokens": tokens,
        "tiers": tiers or [],
        "cannotFit": False,
        "cost": tokens / 10,
        "llmCost": 0.0,
        "baselineTokens": tokens + 1000 * index,
        "baselineCost": tokens / 8,
        "recordedTokens": tokens + 500 * index,
        "recordedCost": tokens / 9,
    }


def test_human_ticks() -> None:
    assert [human(v) for v in (950, 48_000, 175_000, 1_000_000, 1_500_000)] == [
        "950",
        "48K",
        "175K",
        "1M",
        "1.5M",
    ]


def test_threads_keep_their_own_order_and_main_comes_first() -> None:
    steps = [step(0, "main", 10), step(1, "function:f2", 5), step(2, "main", 12)]
    steps.append(step(3, "function:f2", 6))
    by_thread = threads(steps)
    assert list(by_thread) == ["main", "function:f2"]
    assert [position for position, _ in by_thread["main"]] == [0, 2]
    assert [s["tokens"] for _, s in by_thread["function:f2"]] == [5, 6]


def figures(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """Every figure `plot` saves, kept for the test to read."""
    import matplotlib.figure

    saved: list[matplotlib.figure.Figure] = []
    real_savefig = matplotlib.figure.Figure.savefig

    def keep(self: matplotlib.figure.Figure, *args: Any, **kw: Any) -> None:
        saved.append(self)
        real_savefig(self, *args, **kw)

    monkeypatch.setattr(matplotlib.figure.Figure, "savefig", keep)
    return saved


def test_plot_draws_a_panel_per_thread(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    steps = [step(0, "main", 20_000), step(1, "function:f7", 9_000), step(2, "main", 30_000)]
    steps += [step(3, "function:f9", 8_000, ["microcompact"]), step(4, "main", 41_000)]
    report = {"steps": steps, "limit": 44_000, "threshold": 40_000, "window": 64_000}
    report |= {"source": "s", "ttl": "1h", "provider": "digest"}
    saved = figures(monkeypatch)
    plot(report, str(tmp_path / "r.png"))
    (figure,) = saved
    titles = [ax.get_title(loc="left") for ax in figure.axes]
    assert titles[:3] == ["main thread", "sub-agent f7", "sub-agent f9"]
    main = figure.axes[0]
    labels = {line.get_label() for line in main.get_lines()}
    assert {"compactd", "no management", "recorded run"} <= labels
    (compactd,) = [line for line in main.get_lines() if line.get_label() == "compactd"]
    assert list(compactd.get_ydata()) == [20_000, 30_000, 41_000]  # the main thread only
    assert main.yaxis.get_major_formatter()(40_000, 0) == "40K"
    assert (tmp_path / "r.png").stat().st_size > 0


@pytest.mark.parametrize(
    "model, price, money",
    [
        ("claude-sonnet-4-5", {"inputPerMillion": 3.0, "taken": "2026-10"}, "$0.75"),
        ("some-local-model", None, "no published price for some-local-model"),
    ],
)
def test_the_plot_puts_the_saving_on_the_image_in_money_where_priced(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, model: str, price: Any, money: str
) -> None:
    """The cost panel says what compactd saved against no management, in input-token
    equivalents and, at the model's published price, in dollars; no price, no money."""
    steps = [step(0, "main", 20_000), step(1, "main", 30_000)]
    report = {"steps": steps, "limit": 44_000, "threshold": 40_000, "window": 64_000}
    report |= {"source": "s", "ttl": "1h", "provider": "digest", "model": model, "price": price}
    report["totals"] = {"compactd": {"cost": 750_000.0}, "baseline": {"cost": 1_000_000.0}}
    saved = figures(monkeypatch)
    plot(report, str(tmp_path / "r.png"))
    texts = [t.get_text() for ax in saved[0].axes for t in ax.texts]
    [said] = [t for t in texts if t.startswith("saved ")]
    assert "saved 250K input-token eq. against no management (25%)" in said
    assert money in said
