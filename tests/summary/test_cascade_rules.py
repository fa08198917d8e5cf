"""The summary stage's rules through the real daemon and the real SDK against the fake: a chained
summary sees the user's own words, a prepared checkpoint is reused only for the model and
budget it was written for, and a /compact that did nothing is a result and a notification."""

from __future__ import annotations

import asyncio
from typing import Any

from compactd.clients.client import CompactdClient

from tests.summary.helpers import (
    WINDOW,
    open_session,
    prompts,
    records,
    sixteen,
    turn,
    wait_until,
)
from tests.support.fake_anthropic import FakeAnthropic, Reply


async def test_a_chained_summary_is_given_the_earlier_requests_verbatim(
    daemon: CompactdClient, fake: FakeAnthropic
) -> None:
    """From the second compaction on, the summarizer sees the prior summary and every user
    request it replaced, word for word (the spec's summary input), not the prior summary
    alone."""
    sid = await open_session(daemon)
    await daemon.append(sid, sixteen("ch"))
    fake.push(Reply.answer("FIRST checkpoint: the modules were inspected."))
    assert (await daemon.compact(sid, window=WINDOW)).applied
    await daemon.append(sid, turn("ch4") + turn("ch5"))
    fake.push(Reply.answer("SECOND checkpoint"))
    assert (await daemon.compact(sid, window=WINDOW)).applied
    first, second = prompts(fake)
    assert "Request ch0: inspect module ch0" in first
    assert "FIRST checkpoint" in second  # the prior summary …
    for tag in ("ch0", "ch1"):  # … and the requests it replaced, verbatim
        assert f"Request {tag}: inspect module {tag} and report what it does." in second


async def test_a_prepared_checkpoint_is_not_reused_for_another_model_or_budget(
    daemon: CompactdClient, fake: FakeAnthropic
) -> None:
    # prepared as soon as idle (the 200K limit is far from full)
    # (that range is worth a call at 200K only with the bar this low)
    config = {"prepareIdleSeconds": 0.3, "prepareOccupancy": 0.01, "summaryMinGain": 0.001}
    sid = await open_session(daemon, config)
    # turns enough that their summary is shorter than they are, even a 200K window's 5K one
    await daemon.append(sid, [m for k in range(12) for m in turn(f"pm{k}")])
    fake.push(Reply.answer("PREPARED for sonnet at 200K"))
    await daemon.render(sid, model="claude-sonnet-4-5")  # the params the preparation uses
    await wait_until(lambda: len(fake.messages_requests()) == 1)
    await asyncio.sleep(0.3)  # let the answer reach the daemon
    fake.push(Reply.answer("WRITTEN for haiku at 100K"))
    result = await daemon.compact(sid, model="claude-haiku-4-5", window=100_000)
    assert result.applied
    assert len(fake.messages_requests()) == 2  # asked again: that checkpoint was not for this
    (summary,) = await records(daemon, sid, "summary")
    assert summary["data"]["text"] == "WRITTEN for haiku at 100K"
    assert "reused" not in summary["data"]["usage"]


async def test_a_compact_that_did_nothing_is_a_result_and_is_notified(
    daemon: CompactdClient, fake: FakeAnthropic
) -> None:
    heard: list[dict[str, Any]] = []
    daemon.on_notification("context/compacted", heard.append)
    # the summary is all there is: no snip, and Tier 1 keeps the four calls there are
    sid = await open_session(daemon, {"snipEnabled": False, "microcompactKeepRecentShare": 1.0})
    await daemon.append(sid, sixteen("nd"))
    fake.push(Reply.empty())
    result = await daemon.compact(sid, window=WINDOW)
    assert result.applied is False and result.failure == "empty"
    assert result.tokens_after == result.tokens_before > 0
    assert "empty" in (result.reason or "")
    assert await records(daemon, sid, "summary") == []
    await daemon.status()  # notifications sent before this answer have been read
    (event,) = [n for n in heard if n["sessionId"] == sid]
    assert event["tier"] == "summary" and event["applied"] is False
    assert event["tokensBefore"] == event["tokensAfter"] == result.tokens_before
    # an automatic attempt that failed is notified too
    fake.default = Reply.empty()
    await daemon.render(sid, window=9_500, cascade=True)  # over its threshold, under its limit
    await daemon.status()
    attempts = [n for n in heard if n["sessionId"] == sid and n["tier"] == "summary"]
    assert len(attempts) == 2 and attempts[1]["applied"] is False
