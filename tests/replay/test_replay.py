"""`compactd replay` on the shared transcripts, in the provider's units: a live agent's 20K
system prompt on every request, the provider's count reported back after each one. Every
request fits at 48K and 64K (no "cannot fit", none over the window), the fit of the recorded
prompt sizes is good enough that "no management" and the recorded run agree, the report is
complete, and the CLI writes a real PNG."""

from __future__ import annotations

import functools
import json
import struct
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from compactd.context.engine import Engine
from compactd.context.importers import load_transcript
from compactd.context.replay import ReplayOptions, ReplayReport, fit_prompt_sizes, replay
from compactd.context.stores.files import FileStore
from compactd.context.summarizer.driver import digest_answer, drive

DATA = Path(__file__).resolve().parents[1] / "data" / "transcripts"
CLAUDE = sorted((DATA / "claude-code").glob("*.jsonl"))
LARGEST = DATA / "claude-code" / "64da7265-8f07-4967-b79f-0ae374c13330.jsonl"
SYSTEM = 20_000  # the system prompt and tools of a live coding agent, in the provider's tokens
RESERVE = 8_000


@functools.cache
def run(
    path: Path,
    window: int,
    ttl: str = "1h",
    system: int | None = SYSTEM,
    provider: str = "digest",
    write_price: float | None = None,
    reserve: int | None = RESERVE,
) -> ReplayReport:
    """One replay per set of options, shared by the tests (each takes seconds); `reserve`
    None is the replay's default (min(20K, a quarter of the window) here)."""
    with tempfile.TemporaryDirectory() as tmp:
        engine = Engine(FileStore(tmp), summary_provider=provider)
        imported = load_transcript(str(path))[0]
        options = ReplayOptions(
            window=window, reserve=reserve, ttl=ttl, system_tokens=system, write_price=write_price
        )
        return drive(replay(engine, imported, options), digest_answer)


# economy.md's table for 64da7265 (main thread, 1-hour TTL, every write at 1.25x)
ECONOMY_CODEX_LIKE = {64_000: 853_000, 48_000: 930_000}


@pytest.mark.parametrize("window", sorted(ECONOMY_CODEX_LIKE))
def test_the_codex_like_anchor_agrees_with_the_economy_notes(window: int) -> None:
    """The instrument that measured the issue's table: the Codex-like policy on the same
    messages, priced the same way, within 10 % of its figure; and compactd's every LLM call
    — tool evidence and background preparation included — is counted and priced."""
    report = run(LARGEST, window, write_price=1.25)
    codex = report.main["codex"]
    assert abs(codex.cost / ECONOMY_CODEX_LIKE[window] - 1) <= 0.10
    assert codex.requests == report.main["compactd"].requests
    assert codex.llm_calls > 0 and codex.over_limit > 0  # it overflows, as the notes say
    mine = report.main["compactd"]
    steps = [s for s in report.steps if s.thread == "main"]
    assert mine.llm_calls == sum(s.llm_calls for s in steps)
    assert abs(mine.llm_cost - sum(s.llm_cost for s in steps)) < 1.0
    # a summary call is priced at no less than its input — a tenth of what a fork read from
    # the cache — plus 5x 2,000 tokens of output; here every summary is such a fork
    assert 0 < mine.summary_read < mine.summary_input
    fresh = mine.summary_input - mine.summary_read
    summaries = mine.llm_calls - mine.evidence_calls
    assert mine.llm_cost >= fresh + 0.1 * mine.summary_read + 5 * 2_000 * summaries
    assert 0 <= mine.prepared_unused <= mine.prepared


@pytest.mark.parametrize("window", [48_000, 64_000, 200_000])
@pytest.mark.parametrize("path", CLAUDE, ids=lambda p: p.name[:8])
def test_every_request_fits_in_the_providers_units(path: Path, window: int) -> None:
    """The acceptance of the long-turn issue: no "cannot fit", no request over the window,
    counted as the provider counts (system prompt included), sub-agents' requests too."""
    report = run(path, window)
    totals = report.compactd
    assert totals.requests > 0
    assert totals.cannot_fit == 0
    assert totals.over_limit == 0
    assert all(step.tokens <= step.limit for step in report.steps)
    assert report.limit == window - RESERVE
    # every request carries the system prompt: nothing is smaller than it
    assert min(step.tokens for step in report.steps) > SYSTEM
    # headroom, no thrash: most requests read what the previous one wrote
    assert totals.rewrites_per_100 < 25


@pytest.mark.parametrize("window", [48_000, 64_000])
@pytest.mark.parametrize("path", CLAUDE, ids=lambda p: p.name[:8])
def test_small_windows_fit_and_cost_no_more_than_the_codex_like_policy(
    path: Path, window: int
) -> None:
    """At 48K and 64K with the default output reserve (a quarter of the window: 36K and 48K
    left for the request, 20K of it the system prompt), priced as the economy notes price it:
    no "cannot fit", nothing over the limit — and no more cost and no more LLM calls per 100
    requests than the Codex-like policy on the same messages (which sends some over the
    window), on the main thread and over every thread."""
    report = run(path, window, write_price=1.25, reserve=None)
    assert report.limit == window - window // 4
    for scope in (report.main, report.totals):
        mine, codex = scope["compactd"], scope["codex"]
        assert mine.cannot_fit == 0
        assert mine.over_limit == 0 and mine.over_window == 0
        assert mine.cost <= codex.cost
        assert mine.llm_calls_per_100 <= codex.llm_calls_per_100


@pytest.mark.parametrize("window", [48_000, 64_000])
@pytest.mark.parametrize("path", CLAUDE, ids=lambda p: p.name[:8])
def test_small_windows_cost_no_more_than_the_cheapest_anchor_that_serves_them(
    path: Path, window: int
) -> None:
    """economy.md's settings (8,000 reserved, writes at 1.25×): compactd's main thread costs no
    more than the cheapest of the Codex-like, opencode-like, CC-like and server-side policies —
    server-side only where its 50K minimum trigger fits the limit — with no more LLM calls per
    100 requests, nothing over the window and no "cannot fit". (The fourteen sessions' table,
    and where this does not hold, is in docs/decisions.md.)"""
    report = run(path, window, write_price=1.25)
    main = report.main
    serving = [
        name
        for name in ("codex", "opencode", "claude-code", "server")
        if report.anchor_notes.get(name, {}).get("servesWindow", True)
    ]
    assert ("server" in serving) is (window == 64_000)
    cheapest = min(serving, key=lambda name: main[name].cost)
    mine = main["compactd"]
    assert mine.cost <= main[cheapest].cost
    assert mine.llm_calls_per_100 <= main[cheapest].llm_calls_per_100
    assert mine.over_window == 0 and mine.cannot_fit == 0


@pytest.mark.parametrize("path", CLAUDE, ids=lambda p: p.name[:8])
def test_the_fit_makes_no_management_agree_with_the_recorded_run(path: Path) -> None:
    """Fitted on the recorded calls before the first recorded compaction: the no-management
    rows, in the provider's units, are the recorded prompt sizes within 5 % (on 64da7265 the
    very first request is the exception: it carries ~3K tokens more than the line explains)."""
    report = run(path, 200_000, system=None)
    units = report.units
    assert units is not None and units.source == "fitted"
    fit = units.fits["main"]
    assert fit is not None and fit.points >= 5
    assert 1.25 < units.ratio < 1.4  # Claude counts coding transcripts ~1.3× what cl100k does
    assert fit.median_error < 0.02
    assert units.overhead["main"] == fit.overhead > 10_000  # Claude Code's system and tools
    main = [s for s in report.steps if s.thread == "main"][: fit.points]
    assert all(s.baseline_tokens is not None and s.recorded_tokens for s in main)
    close = [abs(s.baseline_tokens - s.recorded_tokens) <= 0.05 * s.recorded_tokens for s in main]
    assert sum(close) >= 0.9 * len(close) and all(close[1:20])
    # sub-agents: their own overhead at the main thread's ratio
    sub = [s for s in report.steps if s.thread != "main" and s.recorded_tokens]
    errors = sorted(abs(s.baseline_tokens - s.recorded_tokens) / s.recorded_tokens for s in sub)
    assert errors[len(errors) // 2] < 0.03


def test_a_line_is_fitted_exactly_and_too_few_points_say_nothing() -> None:
    fit = fit_prompt_sizes([(1_000, 21_300), (2_000, 22_600), (5_000, 26_500)])
    assert fit is not None
    assert fit.overhead == 20_000 and abs(fit.ratio - 1.3) < 1e-9 and fit.max_error < 1e-9
    assert fit_prompt_sizes([(1_000, 21_300)]) is None
    at = fit_prompt_sizes([(1_000, 21_300)], ratio=1.3)
    assert at is not None and at.overhead == 20_000


def test_the_report_compares_compactd_no_management_and_the_recorded_run() -> None:
    report = run(LARGEST, 64_000)
    baseline, recorded = report.totals["baseline"], report.totals["recorded"]
    # the same number of model requests in all three
    assert report.compactd.requests == baseline.requests == recorded.requests
    # with nothing managed, this session overflows a 64K window many times
    assert baseline.over_limit > 0
    assert report.compactd.cost < baseline.cost
    assert 0.0 < report.compactd.cache_read_share <= 1.0
    assert report.compactd.removed_without_summary > 0
    # the main thread alone, the figure the economy notes' instrument reports
    assert 0 < report.main["compactd"].requests < report.compactd.requests
    assert report.main["compactd"].cost < report.compactd.cost
    # every applied tier is visible per step
    fired = [t for s in report.steps for t in s.tiers]
    assert "microcompact" in fired and "summary" in fired
    data = report.to_json()
    assert data["totals"]["compactd"]["requests"] == report.compactd.requests
    assert data["mainThread"]["compactd"]["requests"] == report.main["compactd"].requests
    assert data["units"]["systemTokens"] == {"main": SYSTEM, "function": SYSTEM}
    assert "rewritesPer100" in data["totals"]["compactd"]
    assert {"tokens", "tiers", "cacheRead", "cacheWrite", "llmCalls", "llmCost", "rewrite"} <= set(
        data["steps"][0]
    )


def test_a_longer_ttl_changes_the_price() -> None:
    """The cascade weighs a pause against the TTL (a clear the warm rule defers is made once
    the cache has expired), so the TTL may change the context too; this session has no pause
    between five minutes and an hour, and the two agree on every request."""
    small = CLAUDE[-1]
    short, long = run(small, 200_000, "5m"), run(small, 200_000, "1h")
    assert [s.tokens for s in short.steps] == [s.tokens for s in long.steps]
    assert short.compactd.cost != long.compactd.cost


def _png_size(path: Path) -> tuple[int, int]:
    head = path.read_bytes()[:24]
    assert head[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    return struct.unpack(">II", head[16:24])


def test_the_cli_prints_the_report_and_draws_the_plot(tmp_path: Path) -> None:
    png = tmp_path / "replay.png"
    data_dir = tmp_path / "data"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "compactd",
            "--data-dir",
            str(data_dir),
            "replay",
            str(DATA / "claude-code" / "fe5e1c67-53e7-4862-81ae-d0e013e3270b.jsonl"),
            "--window",
            "48000",
            "--system-tokens",
            "20000",
            "--json",
            "--plot",
            str(png),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    assert report["window"] == 48_000
    assert report["totals"]["compactd"]["overLimit"] == 0
    width, height = _png_size(png)
    assert width >= 800 and height >= 500
    assert png.stat().st_size > 20_000
    # the replay ran in a scratch store: the user's data dir holds no session
    assert (
        not list((data_dir / "sessions").glob("*.jsonl"))
        if (data_dir / "sessions").exists()
        else True
    )


def test_a_replay_with_recall_comes_out_the_same_in_another_engine() -> None:
    """A replay's session is named by its transcript: its handles (a digest of the session id)
    and so every figure are the same on every run, in a fresh store or one that already holds
    that replay (which then takes a new id)."""

    def replay_in(tmp: str) -> ReplayReport:
        engine = Engine(FileStore(tmp), summary_provider="digest")
        imported = load_transcript(str(LARGEST))[0]
        options = ReplayOptions(
            window=64_000, reserve=RESERVE, ttl="1h", system_tokens=SYSTEM, config={"recall": True}
        )
        return drive(replay(engine, imported, options), digest_answer)

    with tempfile.TemporaryDirectory() as one, tempfile.TemporaryDirectory() as two:
        first, second = replay_in(one), replay_in(two)
        again = replay_in(one)  # the store holds the first: a new id, the same prices
    assert first.recall.handles  # recall was on: the requests named handles
    assert [s.tokens for s in first.steps] == [s.tokens for s in second.steps]
    assert first.main["compactd"].cost == second.main["compactd"].cost
    assert again.main["compactd"].requests == first.main["compactd"].requests


def test_the_cascade_runs_on_the_transcripts_clock() -> None:
    """What the cascade records during a replay carries the recorded session's times, so a
    pause in the transcript is one to the cascade (whether the provider's cache expired)."""
    with tempfile.TemporaryDirectory() as tmp:
        engine = Engine(FileStore(tmp), summary_provider="digest")
        imported = load_transcript(str(LARGEST))[0]
        options = ReplayOptions(window=64_000, reserve=RESERVE, ttl="1h", system_tokens=SYSTEM)
        report = drive(replay(engine, imported, options), digest_answer)
        (session,) = [s for s in engine.sessions.values() if s.id.startswith("replay-")]
        usage = [r.ts for r in session.graph.records if r.kind == "usage"]
    times = [s.time for s in report.steps]
    assert len(usage) == len(times)
    # each at its request's time (or the latest time seen, where threads interleave)
    assert all(0 <= u - t < 60 for u, t in zip(usage, times, strict=True))
    assert max(times) - min(times) > 3_600  # the session spans pauses the cache outlives
