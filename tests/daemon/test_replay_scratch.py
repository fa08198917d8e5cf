"""A killed replay leaves nothing: its scratch store is under the data dir's `scratch/` (each
kill -9 during `session/replay` left a `/tmp/compactd-replay-*` copy), and the next daemon
sweeps what no live process holds — never a replay another daemon is running."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from .wire import RawDaemon

pytestmark = pytest.mark.asyncio(loop_scope="module")

TRANSCRIPT = (
    Path(__file__).resolve().parents[1]
    / "data/transcripts/claude-code/fe5e1c67-53e7-4862-81ae-d0e013e3270b.jsonl"
)
WAIT = 60.0  # a hang detector: a busy machine answers well inside it


async def replay_waiting_on_its_summary(data_dir: Path, log: Path) -> RawDaemon:
    """A daemon mid-replay: it asked us (the `client` provider) for a summary, unanswered."""
    raw = await RawDaemon.spawn(data_dir, log_path=log)
    raw.send_request(
        "session/replay",
        {"path": str(TRANSCRIPT), "window": 24_000, "summaryProvider": "client"},
    )
    await raw.wait_for(lambda m: m.get("method") == "context/summarize", timeout=WAIT)
    return raw


def scratch(data_dir: Path) -> list[str]:
    folder = data_dir / "scratch"
    return sorted(p.name for p in folder.iterdir()) if folder.is_dir() else []


async def test_a_replay_killed_mid_way_leaves_nothing_after_the_next_start(tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    killed = await replay_waiting_on_its_summary(data_dir, tmp_path / "killed.log")
    [left] = scratch(data_dir)
    assert left.startswith("replay-")
    live = await replay_waiting_on_its_summary(data_dir, tmp_path / "live.log")
    assert len(scratch(data_dir)) == 2
    await killed.kill()  # kill -9
    assert left in scratch(data_dir), "a killed replay's scratch stays until a sweep"

    after = await RawDaemon.spawn(data_dir, log_path=tmp_path / "after.log")
    try:
        await after.call("daemon/status")

        async def swept() -> None:  # the start-up sweep runs beside the first requests
            while left in scratch(data_dir):
                await asyncio.sleep(0.05)

        await asyncio.wait_for(swept(), WAIT)
        [held] = scratch(data_dir)
        assert held != left, "the live replay's scratch is still there"
        assert await after.shutdown_and_exit() == 0
    finally:
        await after.kill()
        await live.kill()
