"""Replays of every shared Claude Code transcript and the newer Codex rollouts under the cascade
(see `replay.py` for what is checked after every render): with the offline digest provider at
32K and 64K windows, and with no provider at all at 64K for the smaller transcript."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.cascade.replay import ALL, CODEX, LARGEST, SMALLER, replay, replayed, short

pytestmark = pytest.mark.slow

# main-thread and sub-agent model calls of each transcript (the importer tests count them)
STEPS = {
    LARGEST.name: (82, 74),
    SMALLER.name: (9, 161),
    CODEX[0].name: (278, 0),
    CODEX[1].name: (180, 0),
}


@pytest.mark.parametrize("window", [32_000, 64_000])
@pytest.mark.parametrize("path", ALL, ids=short)
def test_every_render_of_the_replay_fits_and_keeps_the_invariants(path: Path, window: int) -> None:
    report = replayed(path, window, "digest")
    print(report.line())
    assert (report.steps, report.functions.steps) == STEPS[path.name]
    assert report.peak <= report.limit == window - window // 4
    assert report.functions.peak <= report.limit


def test_the_largest_transcript_needs_every_cheap_tier_at_32k() -> None:
    report = replayed(LARGEST, 32_000, "digest")
    assert report.fired["microcompact"] >= 5
    # a summary inside the long last turn, every few requests (each frees down to the target)
    assert 1 <= report.fired["summary"] <= report.steps // 8
    assert report.functions.fired["microcompact"] >= 1
    # a tighter window never makes the cascade do less
    wider = replayed(LARGEST, 64_000, "digest")
    assert sum(wider.fired.values()) < sum(report.fired.values())
    assert wider.peak > report.peak


def test_without_a_provider_the_smaller_transcript_fits_at_64k() -> None:
    report = replay(SMALLER, 64_000, None)
    print(report.line())
    assert report.fired["summary"] == 0 and report.fired["collapse"] == 0
    assert (report.steps, report.functions.steps) == STEPS[SMALLER.name]
    assert report.peak <= report.limit
    assert report.functions.peak > report.peak  # the sub-agents carry the weight here
