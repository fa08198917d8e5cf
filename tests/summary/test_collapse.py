"""Tier 3 — Context Collapse through the daemon: with Snip disabled, segments of 5–10 old turns
are collapsed, each once; `context/uncollapse` brings the originals back; and auto-compact
waits while collapse keeps the request under its blocking limit."""

from __future__ import annotations

import pytest
from compactd.clients.client import CompactdClient, RpcError
from compactd.protocol.errors import CODE_BY_KIND

from tests.summary.helpers import open_session, prompts, records, systems, turn, wire_blocks
from tests.support.fake_anthropic import FakeAnthropic, Reply

# a threshold and target just over where one collapsed segment lands (87.5 %), so each segment
# is its own step and auto-compact has reason to wait
CONFIG = {
    "snipEnabled": False,
    "collapseMaxTurns": 5,
    "cascadeThreshold": 0.90,
    "cascadeTarget": 0.88,
}
TOOL = "mcp__docs__fetch"  # not compactable: Tier 1 frees nothing here, so Tier 3 must act
MARKER = "[compactd: 5 turns collapsed into this summary"


def requests_shown(request: dict[str, object]) -> set[str]:
    return {
        b["text"].split(":")[0]
        for _, b in wire_blocks(request)  # type: ignore[arg-type]
        if b.get("type") == "text" and b["text"].startswith("Request ")
    }


async def test_collapse_segments_once_each_reversibly_while_auto_compact_waits(
    daemon: CompactdClient, fake: FakeAnthropic
) -> None:
    sid = await open_session(daemon, CONFIG)
    totals = []
    for k in range(18):
        await daemon.append(sid, turn(f"c{k:02d}", 3000, tool=TOOL))
        totals.append((await daemon.measure(sid, window=1_000_000)).total)
    per_turn = totals[-1] - totals[-2]
    total = totals[-1]
    # a window where collapsing one segment of five turns lands at 87.5 %, under the target
    # (88 % here) but over 85 %: auto-compact, which waits while collapse holds, is not asked
    saved = 5 * per_turn - 60
    limit = int((total - saved) / 0.875)
    window = limit * 4 // 3
    measure = await daemon.measure(sid, window=window)
    assert measure.total > 0.9 * measure.limit

    fake.push(Reply.answer("SEGMENT-ONE: modules c01 to c05 were inspected"))
    first = await daemon.render(sid, window=window, cascade=True)
    applied = [e for e in first.events if e.applied]
    assert [e.tier for e in applied] == ["collapse"]
    assert applied[0].details["turns"] == 5
    tokens = first.tokens
    assert 0.85 * tokens.limit < tokens.total <= 0.9 * tokens.limit
    assert not [e for e in first.events if e.tier == "summary"]  # not even tried
    (sent,) = prompts(fake)
    assert systems(fake)[0].startswith("Summarize this segment")
    for k in range(1, 6):
        assert f"Request c{k:02d}:" in sent
    assert "Request c00:" not in sent and "Request c06:" not in sent
    (collapse,) = await records(daemon, sid, "collapse")
    assert applied[0].record_ids == [collapse["id"]]
    assert len(collapse["data"]["turns"]) == 5
    shown = requests_shown(first.request)
    assert {f"Request c{k:02d}" for k in range(1, 6)}.isdisjoint(shown)
    assert {"Request c00", "Request c06", "Request c17"} <= shown
    markers = [
        b["text"] for _, b in wire_blocks(first.request) if b.get("text", "").startswith(MARKER)
    ]
    assert len(markers) == 1 and "SEGMENT-ONE" in markers[0]

    # once: the next request finds nothing over the target and asks for nothing
    again = await daemon.render(sid, window=window, cascade=True)
    assert not any(e.applied for e in again.events)
    assert again.request == first.request
    assert len(prompts(fake)) == 1

    # growing past it again collapses the next five turns, never the same ones
    for k in range(18, 23):
        await daemon.append(sid, turn(f"c{k:02d}", 3000, tool=TOOL))
    fake.push(Reply.answer("SEGMENT-TWO: modules c06 to c10"))
    second = await daemon.render(sid, window=window, cascade=True)
    assert [e.tier for e in second.events if e.applied] == ["collapse"]
    assert len(prompts(fake)) == 2
    assert "Request c06:" in prompts(fake)[1] and "Request c01:" not in prompts(fake)[1]
    one, two = await records(daemon, sid, "collapse")
    assert set(one["data"]["turns"]).isdisjoint(two["data"]["turns"])
    assert set(one["covers"]).isdisjoint(two["covers"])

    # reversible: the originals show again, exactly as they were
    before_undo = await daemon.measure(sid, window=window)
    undone = await daemon.uncollapse(sid, one["id"])
    assert undone.applied and undone.record_id
    restored = await daemon.render(sid, window=window)
    assert {f"Request c{k:02d}" for k in range(1, 6)} <= requests_shown(restored.request)
    assert "SEGMENT-ONE" not in str(restored.request)
    assert "SEGMENT-TWO" in str(restored.request)
    after_undo = await daemon.measure(sid, window=window)
    assert after_undo.total > before_undo.total
    assert not (await daemon.uncollapse(sid, one["id"])).applied  # undone once is enough
    assert len(await records(daemon, sid, "collapse")) == 2  # nothing deleted


async def test_uncollapse_of_something_else_is_a_clear_error(
    daemon: CompactdClient, fake: FakeAnthropic
) -> None:
    sid = await open_session(daemon, CONFIG)
    await daemon.append(sid, turn("u0"))
    with pytest.raises(RpcError) as caught:
        await daemon.uncollapse(sid, "r999")
    assert caught.value.code == CODE_BY_KIND["invalid_content"]
    assert "r999" in caught.value.message
    assert fake.messages_requests() == []
