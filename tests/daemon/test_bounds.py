"""Bounds on a request's size, through the real daemon on both stores: a `window` above 2^53−1
(more than a JSON peer holds exactly) and `maxOutputTokens: 0` (a request that allows no
answer) were rendered; now each is a typed error (4013 naming the field), nothing written."""

from __future__ import annotations

from pathlib import Path

import pytest

from .convo import assistant, user
from .test_hardening import snapshot
from .wire import seeded_daemon

pytestmark = pytest.mark.asyncio(loop_scope="module")

INVALID_CONFIG = 4013
TRANSCRIPT = (
    Path(__file__).resolve().parents[1]
    / "data/transcripts/claude-code/fe5e1c67-53e7-4862-81ae-d0e013e3270b.jsonl"
)


@pytest.mark.parametrize(
    ("field", "value"),
    [("window", 2**53), ("window", 2**60), ("maxOutputTokens", 0)],
)
async def test_a_window_past_2_53_or_no_room_to_answer_is_refused(
    tmp_path: Path, field: str, value: int
) -> None:
    data_dir = tmp_path / "data"
    async with seeded_daemon(data_dir, {"b": [user("q"), assistant("a")]}) as raw:
        before = snapshot(data_dir)
        for method in ("context/render", "context/measure", "context/compact"):
            error = await raw.error(method, {"sessionId": "b", field: value})
            assert error["code"] == INVALID_CONFIG and error["data"]["field"] == field, error
        render = await raw.error(
            "context/render", {"sessionId": "b", "cascade": True, field: value}
        )
        assert render["code"] == INVALID_CONFIG, render
        if field == "window":
            replay = await raw.error("session/replay", {"path": str(TRANSCRIPT), field: value})
            assert replay["code"] == INVALID_CONFIG, replay
        assert snapshot(data_dir) == before
        ok = await raw.call("context/render", {"sessionId": "b", "window": 2**53 - 1})
        assert ok["tokens"]["window"] == 2**53 - 1
