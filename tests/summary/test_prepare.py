"""Background preparation of the next rolling summary: prepared while the session is idle, then
committed by the next compaction without calling the provider again when the range is
unchanged, and discarded when it is not."""

from __future__ import annotations

import asyncio

import pytest
from compactd.clients.client import CompactdClient
from compactd.context.engine import Engine
from compactd.context.stores.files import FileStore
from compactd.context.summarizer.driver import digest_answer

from tests.cascade.helpers import Recorder, cascade, params
from tests.cascade.helpers import open_session as open_engine_session
from tests.summary.helpers import (
    WINDOW,
    agree,
    open_session,
    prompts,
    records,
    sixteen,
    turn,
    wait_until,
)
from tests.support.fake_anthropic import FakeAnthropic, Reply

IDLE = {"prepareIdleSeconds": 0.3, "prepareOccupancy": 0.1}


async def prepared_session(daemon: CompactdClient, fake: FakeAnthropic, prefix: str) -> str:
    """A session the daemon's idle loop has prepared a summary for."""
    sid = await open_session(daemon, IDLE)
    await daemon.append(sid, sixteen(prefix))
    fake.push(Reply.answer(f"PREPARED-{prefix} checkpoint"))
    await daemon.render(sid, window=WINDOW)  # the params the preparation will use
    await wait_until(lambda: len(fake.messages_requests()) == 1)
    await asyncio.sleep(0.3)  # let the answer reach the daemon
    return sid


async def test_a_prepared_summary_is_committed_without_calling_the_provider_again(
    daemon: CompactdClient, fake: FakeAnthropic
) -> None:
    sid = await prepared_session(daemon, fake, "p")
    assert await records(daemon, sid, "summary") == []  # preparing writes nothing
    (prepared_prompt,) = prompts(fake)
    assert "Request p0" in prepared_prompt and "Request p2" not in prepared_prompt
    result = await daemon.compact(sid, window=WINDOW)
    assert result.applied and result.covered_turns == 2
    assert len(fake.messages_requests()) == 1  # no second call
    (summary,) = await records(daemon, sid, "summary")
    assert summary["data"]["text"] == "PREPARED-p checkpoint"
    assert summary["data"]["usage"]["reused"] is True
    await agree(daemon, sid)


async def test_a_prepared_summary_for_another_range_is_discarded(
    daemon: CompactdClient, fake: FakeAnthropic
) -> None:
    sid = await prepared_session(daemon, fake, "q")
    await daemon.append(sid, turn("q4"))  # the range to replace is now three turns
    fake.push(Reply.answer("FRESH checkpoint"))
    result = await daemon.compact(sid, window=WINDOW)
    assert result.applied and result.covered_turns == 3
    assert len(fake.messages_requests()) == 2
    assert "Request q2" in prompts(fake)[1]
    (summary,) = await records(daemon, sid, "summary")
    assert summary["data"]["text"] == "FRESH checkpoint"
    assert "reused" not in summary["data"]["usage"]


async def test_a_stale_preparation_does_not_block_the_next_one(
    daemon: CompactdClient, fake: FakeAnthropic
) -> None:
    sid = await prepared_session(daemon, fake, "s")
    await daemon.append(sid, turn("s4"))
    fake.push(Reply.answer("RE-PREPARED checkpoint"))
    await wait_until(lambda: len(fake.messages_requests()) == 2)


# ---- the engine's side -----------------------------------------------------------------------


def records_of(engine: Engine, sid: str) -> list[str]:
    return [r.kind for r in engine.session(sid).graph.records]


def test_engine_prepare_then_cascade_reuses_it(store: FileStore) -> None:
    engine = Engine(store, summary_provider="digest")
    sid = open_engine_session(engine, {"prepareOccupancy": 0.1, "evidenceEnabled": False})
    engine.append(sid, messages=sixteen("e"))
    p = params()
    background = Recorder()
    gen = engine.prepare(sid, p)
    assert gen is not None
    try:
        need = next(gen)
        while True:
            need = gen.send(background(need))
    except StopIteration as stop:
        assert stop.value is True
    assert engine.has_prepared(sid)
    again = engine.prepare(sid, p)  # prepared already, for this very range: nothing to ask
    assert again is not None
    with pytest.raises(StopIteration) as done:
        next(again)
    assert done.value.value is False
    assert records_of(engine, sid) == []

    foreground = Recorder()
    out = cascade(engine, sid, p, answer=foreground, manual=True)
    assert foreground.needs == []
    (event,) = [e for e in out.events if e.applied]
    assert event.details["reused"] is True and event.details["calls"] == 0
    (summary,) = engine.session(sid).graph.records
    assert summary.kind == "summary"
    assert summary.data["text"] == digest_answer(background.needs[0]).text
    assert not engine.has_prepared(sid)


def test_engine_prepare_is_skipped_when_not_worth_it(store: FileStore) -> None:
    engine = Engine(store, summary_provider="digest")
    sid = open_engine_session(engine)  # default occupancy: 80 %
    engine.append(sid, messages=sixteen("w"))
    assert engine.prepare(sid, params()) is None
    no_provider = Engine(store)
    assert no_provider.prepare(sid, params(window=8_000)) is None
    assert records_of(engine, sid) == []
