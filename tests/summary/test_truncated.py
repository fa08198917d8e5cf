"""A truncated summary is not a summary, through the daemon and the fake Messages server: an
answer that stopped on `max_tokens` was committed as the checkpoint ("partial summ" in place of
twelve turns). Now it is a failure: the range is tried again in smaller chunks, and when those
are cut off too the compaction did nothing (a result with `applied: false` and the failure's
kind) and nothing is written."""

from __future__ import annotations

from compactd.clients.client import CompactdClient

from tests.summary.helpers import WINDOW, open_session, prompts, records, turn
from tests.support.fake_anthropic import FakeAnthropic, Reply

PROVIDER_FAILURE = 4050


async def test_a_summary_cut_off_at_max_tokens_is_never_committed(
    daemon: CompactdClient, fake: FakeAnthropic
) -> None:
    sid = await open_session(daemon)
    await daemon.append(sid, [m for k in range(12) for m in turn(f"cut{k}")])
    fake.default = Reply.answer("partial summ", stop_reason="max_tokens")
    failed = await daemon.compact(sid, window=WINDOW)  # a /compact that did nothing: a result
    assert not failed.applied and failed.failure == "truncated"
    assert "stop_reason=max_tokens" in failed.reason
    assert await records(daemon, sid, "summary") == []
    sizes = [len(p) for p in prompts(fake)]
    assert len(sizes) > 1 and sizes[1] < sizes[0], "tried again with a smaller chunk"
    rendered = await daemon.render(sid, window=10**6)
    assert "partial summ" not in str(rendered.request)


async def test_a_smaller_chunk_that_ends_is_the_summary(
    daemon: CompactdClient, fake: FakeAnthropic
) -> None:
    sid = await open_session(daemon)
    await daemon.append(sid, [m for k in range(12) for m in turn(f"half{k}")])
    fake.push(Reply.answer("partial summ", stop_reason="max_tokens"))
    fake.default = Reply.answer("WHOLE checkpoint of the work")
    compacted = await daemon.compact(sid, window=WINDOW)
    assert compacted.applied
    [summary] = await records(daemon, sid, "summary")
    assert "WHOLE checkpoint" in str(summary) and "partial summ" not in str(summary)
