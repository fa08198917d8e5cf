"""`compactd replay` on the shared transcripts: the defaults keep every request under the
window, the report is complete, and the CLI writes a real PNG."""

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
from compactd.context.replay import ReplayOptions, ReplayReport, replay
from compactd.context.store import Store
from compactd.context.summarizer.driver import digest_answer, drive

DATA = Path(__file__).resolve().parents[1] / "data" / "transcripts"
CLAUDE = sorted((DATA / "claude-code").glob("*.jsonl"))
LARGEST = DATA / "claude-code" / "64da7265-8f07-4967-b79f-0ae374c13330.jsonl"


@functools.cache
def run(path: Path, window: int, ttl: str = "5m") -> ReplayReport:
    """One replay per (transcript, window, ttl), shared by the tests (each takes seconds)."""
    with tempfile.TemporaryDirectory() as tmp:
        engine = Engine(Store(tmp), summary_provider="digest")
        imported = load_transcript(str(path))[0]
        options = ReplayOptions(window=window, ttl=ttl)
        return drive(replay(engine, imported, options), digest_answer)


@pytest.mark.parametrize("window", [64_000, 200_000])
@pytest.mark.parametrize("path", CLAUDE, ids=lambda p: p.name[:8])
def test_the_shipped_defaults_keep_every_request_under_the_window(path: Path, window: int) -> None:
    report = run(path, window)
    assert report.compactd.requests > 0
    assert report.compactd.over_window == 0
    assert report.compactd.cannot_fit == 0
    assert all(step.tokens <= step.limit for step in report.steps)
    assert report.compactd.peak <= report.limit


def test_the_report_compares_compactd_no_management_and_the_recorded_run() -> None:
    report = run(LARGEST, 64_000)
    assert report.baseline is not None and report.recorded is not None
    # the same number of model requests in all three
    assert report.compactd.requests == report.baseline.requests == report.recorded.requests
    # with nothing managed, this session overflows a 64K window many times
    assert report.baseline.over_window > 0
    assert report.compactd.cost < report.baseline.cost
    assert 0.0 < report.compactd.cache_read_share <= 1.0
    assert report.compactd.removed_without_summary > 0
    # every applied tier is visible per step
    fired = [t for s in report.steps for t in s.tiers]
    assert "microcompact" in fired
    data = report.to_json()
    assert data["totals"]["compactd"]["requests"] == report.compactd.requests
    assert {"tokens", "tiers", "cacheRead", "cacheWrite", "summaryCalls"} <= data["steps"][0].keys()


def test_a_longer_ttl_changes_the_price_not_the_context() -> None:
    small = CLAUDE[-1]
    short, long = run(small, 200_000), run(small, 200_000, "1h")
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
            "32000",
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
    assert report["window"] == 32_000
    assert report["totals"]["compactd"]["overWindow"] == 0
    width, height = _png_size(png)
    assert width >= 800 and height >= 500
    assert png.stat().st_size > 20_000
    # the replay ran in a scratch store: the user's data dir holds no session
    assert (
        not list((data_dir / "sessions").glob("*.jsonl"))
        if (data_dir / "sessions").exists()
        else True
    )
