"""Tier 4's rules at the engine: which turns the rolling summary replaces, what its input and
its marker hold, and that nothing is written when generation fails or the session moves."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from compactd.context.engine import Engine
from compactd.context.errors import HeadConflict
from compactd.context.summarizer.driver import digest_answer
from compactd.context.summarizer.types import SummaryFailure, SummaryNeeded, SummaryResult
from compactd.service.providers.anthropic_provider import AnthropicSummaryProvider

from tests.cascade.helpers import (
    MODEL,
    THRESHOLD,
    Recorder,
    assistant,
    cascade,
    check_no_split_turn,
    check_wire,
    filler,
    log_bytes,
    open_session,
    params,
    records,
    results,
    texts,
    tool_result,
    tool_use,
    user,
)
from tests.summary.helpers import turn
from tests.support.fake_anthropic import FakeAnthropic, Reply

REMOVED = "[the work of this turn was removed earlier to fit the window]"


def explained(tag: str, words: int) -> list[dict[str, Any]]:
    """A complete turn whose bulk is the assistant's explanation (kept out of the marker)."""
    return [
        user(f"Request {tag}: explain module {tag}."),
        assistant(filler(f"{tag}x", words)),
        assistant(f"Module {tag} explained."),
    ]


def turn_starts(engine: Engine, sid: str) -> list[str]:
    g = engine.session(sid).graph
    path = g.branch_path()
    return [path.line.ids[s] for s, _ in path.turn_bounds()]


def manual(engine: Engine, sid: str, answer: Any = None) -> tuple[Recorder, Any]:
    recorder = Recorder(answer or digest_answer)
    out = cascade(engine, sid, params(), answer=recorder, manual=True)
    return recorder, out


@pytest.fixture
def digest_engine(store: Any) -> Engine:
    # the checkpoint alone: tool evidence has its own tests (test_summary_stage.py)
    return Engine(store, summary_provider="digest", defaults={"evidenceEnabled": False})


def test_the_latest_two_complete_turns_and_the_active_one_stay(digest_engine: Engine) -> None:
    engine = digest_engine
    sid = open_session(engine)
    engine.append(sid, messages=[m for k in range(6) for m in turn(f"k{k}")])
    engine.append(sid, messages=[user("Request k6: go on.")])
    recorder, out = manual(engine, sid)
    (summary,) = records(engine, sid, "summary")
    starts = turn_starts(engine, sid)
    assert summary.data["turns"] == starts[:4]
    (need,) = recorder.needs
    for k in range(4):
        assert f"USER: Request k{k}:" in need.request.prompt
        assert f"TOOL RESULT (toolu_k{k})" in need.request.prompt
    for k in (4, 5, 6):
        assert f"Request k{k}" not in need.request.prompt
    shown = check_no_split_turn(engine, sid, out.rendered)
    assert shown[4:6] == [True, True]
    assert "Request k6: go on." in texts(out.rendered.request)
    check_wire(out.rendered)


@pytest.mark.parametrize("active", [False, True])
def test_short_history_under_the_threshold_is_left_alone(
    digest_engine: Engine, active: bool
) -> None:
    engine = digest_engine
    sid = open_session(engine)
    engine.append(sid, messages=turn("z0") + turn("z1"))
    if active:
        engine.append(sid, messages=[user("Request z2: and now?")])
    log = log_bytes(engine, sid)
    recorder, out = manual(engine, sid)
    assert recorder.needs == []
    (event,) = out.events
    assert not event.applied and event.reason.startswith("short history")
    assert log_bytes(engine, sid) == log


def test_when_two_kept_turns_are_still_too_many_the_latest_complete_one_stays_whole(
    digest_engine: Engine,
) -> None:
    """Keeping two complete turns, then one, still leaves the request over its target — but
    it fits its limit with the latest complete turn whole, so a summary sent as a transcript
    (no fork of the cached request) replaces whole turns only (a cut inside that turn would
    only buy headroom)."""
    engine = digest_engine
    sid = open_session(engine, {"summaryFork": False})
    for k in range(4):
        engine.append(sid, messages=turn(f"s{k}", 1200))
    engine.append(sid, messages=explained("b4", 2600) + explained("b5", 2600))
    engine.append(sid, messages=[user("Request a6: now finish.")])
    before = engine.render(sid, params())
    assert before.total > THRESHOLD
    _, out = manual(engine, sid)
    (summary,) = records(engine, sid, "summary")
    starts = turn_starts(engine, sid)
    assert summary.data["turns"] == starts[:5]
    assert "partialTurn" not in summary.data and "through" not in summary.data
    assert out.rendered.total < out.rendered.budget.limit and out.rendered.total < before.total
    shown = texts(out.rendered.request)
    assert "Request b5: explain module b5." in shown and "Request a6: now finish." in shown
    assert "Module b5 explained." in shown
    assert filler("b5x", 2600) in shown  # its explanation stays, verbatim
    # the checkpoint still quotes every request it replaced
    marker = next(t for t in shown if t.startswith("[compactd: summary"))
    for tag in ("s0", "s3", "b4"):
        assert f"Request {tag}:" in marker
    assert "Request b5" not in marker


def test_the_range_is_priced_in_the_providers_tokens(digest_engine: Engine) -> None:
    """With a calibration ratio of 1.5, summarizing the older turns is enough: the two latest
    complete turns stay (pricing the range in raw tokens made it look too small to help). The
    target is the threshold here, so the range is the least that fits under it."""
    engine = digest_engine
    sid = open_session(engine, {"cascadeTarget": 0.85})
    engine.append(sid, messages=[m for k in range(6) for m in turn(f"w{k}")])
    p = params(window=14_100)  # limit 10,575, threshold 8,988
    raw = engine.render(sid, p).estimate
    engine.record_usage(sid, MODEL, {"input_tokens": raw * 3 // 2}, estimated=raw)
    before = engine.render(sid, p)
    assert before.ratio == pytest.approx(1.5, abs=0.01)
    assert before.total > before.budget.limit
    recorder = Recorder()
    out = cascade(engine, sid, p, answer=recorder, manual=True)
    (summary,) = records(engine, sid, "summary")
    assert summary.data["turns"] == turn_starts(engine, sid)[:4]
    assert out.rendered.total <= 0.85 * out.rendered.budget.limit


def test_the_active_turn_is_never_replaced_even_when_huge(digest_engine: Engine) -> None:
    engine = digest_engine
    sid = open_session(engine)
    for k in range(3):
        engine.append(sid, messages=turn(f"h{k}"))
    engine.append(
        sid,
        messages=[
            user("Request act: a big job."),
            assistant(filler("actx", 3000), tool_use("toolu_act", "Read")),
            results(tool_result("toolu_act", filler("actr", 300))),
        ],
    )
    _, out = manual(engine, sid)
    (summary,) = records(engine, sid, "summary")
    g = engine.session(sid).graph
    active_start = turn_starts(engine, sid)[-1]
    assert active_start not in summary.data["turns"]
    assert g.tool_by_use_id("toolu_act").id not in summary.covers  # type: ignore[union-attr]
    shown = check_no_split_turn(engine, sid, out.rendered)
    assert shown[-1]


def test_the_input_and_the_covered_range_are_the_same(digest_engine: Engine) -> None:
    engine = digest_engine
    sid = open_session(engine)
    engine.append(sid, messages=[m for k in range(5) for m in turn(f"r{k}")])
    recorder, _ = manual(engine, sid)
    (summary,) = records(engine, sid, "summary")
    (need,) = recorder.needs
    g = engine.session(sid).graph
    covered_tools = {g.nodes[n].tool_use_id for n in summary.covers if g.nodes[n].kind == "tool"}
    in_prompt = {
        line.split(")", 1)[0].removeprefix("TOOL CALL Read (")
        for line in need.request.prompt.splitlines()
        if line.startswith("TOOL CALL ")
    }
    assert in_prompt == covered_tools == {"toolu_r0", "toolu_r1", "toolu_r2"}
    covered_users = [
        g.nodes[n].content[0]["text"]
        for n in summary.covers
        if g.nodes[n].kind == "user" and not g.nodes[n].meta
    ]
    assert covered_users == summary.data["userRequests"]
    assert need.request.prompt.startswith(f"USER: {covered_users[0]}")
    assert [i["text"] for i in need.request.items if i["type"] == "user"] == covered_users


def test_the_marker_quotes_the_requests_and_last_answer_the_summary_left_out(
    digest_engine: Engine,
) -> None:
    engine = digest_engine
    sid = open_session(engine)
    engine.append(sid, messages=[m for k in range(4) for m in turn(f"q{k}")])
    _, out = manual(engine, sid, lambda need: SummaryResult(text="terse checkpoint", model="m"))
    marker = next(t for t in texts(out.rendered.request) if t.startswith("[compactd: summary"))
    assert "terse checkpoint" in marker
    assert "[the user's requests in that part, verbatim]" in marker
    for k in (0, 1):
        assert f"- Request q{k}: inspect module q{k} and report what it does." in marker
    assert "[the assistant's last message in that part, verbatim]" in marker
    assert marker.endswith("Module q1 parses the q1 records and writes a report.")


def test_snipped_turns_in_the_range_bring_their_requests(digest_engine: Engine) -> None:
    engine = digest_engine
    sid = open_session(engine)
    engine.append(sid, messages=[m for k in range(6) for m in turn(f"n{k}")])
    snip = engine.snip(sid, params(), 1)
    assert snip.events[0].details["removedTurns"] == 4  # n1..n4: n0 and n5 are protected
    recorder, out = manual(engine, sid)
    (need,) = recorder.needs
    prompt = need.request.prompt
    (summary,) = records(engine, sid, "summary")
    assert summary.data["turns"] == turn_starts(engine, sid)[:4]  # n4, n5 are the kept two
    assert prompt.count(REMOVED) == 3
    for k in range(1, 4):  # snipped: the request, never the results
        assert f"USER: Request n{k}:" in prompt and f"TOOL RESULT (toolu_n{k})" not in prompt
    assert "TOOL RESULT (toolu_n0)" in prompt  # the first turn was kept by snip
    # n4 stays snipped behind its own marker, after the summary's
    shown = texts(out.rendered.request)
    assert shown[0].startswith("[compactd: summary")
    assert shown[1].startswith("[compactd: 1 earlier turn removed here")
    assert "Request n5: inspect module n5 and report what it does." in shown


def test_one_rolling_summary_in_force_the_older_ones_stay(digest_engine: Engine) -> None:
    engine = digest_engine
    sid = open_session(engine)
    engine.append(sid, messages=[m for k in range(4) for m in turn(f"o{k}")])
    head = engine.session(sid).graph.head()
    manual(engine, sid, lambda need: SummaryResult(text="ONE", model="m"))
    engine.append(sid, messages=turn("o4") + turn("o5"))
    recorder, out = manual(engine, sid, lambda need: SummaryResult(text="TWO", model="m"))
    assert recorder.needs[0].request.prompt.startswith("<previous_checkpoint>\nONE\n")
    first, second = records(engine, sid, "summary")
    assert second.data["prior"] == first.id
    assert set(first.covers) < set(second.covers)
    markers = [t for t in texts(out.rendered.request) if t.startswith("[compactd: summary")]
    assert len(markers) == 1 and "TWO" in markers[0] and "ONE" not in markers[0]
    assert engine.session(sid).graph.nodes[head].kind == "assistant"  # nothing was rewritten
    assert out.rendered.projection.summary is not None
    assert out.rendered.projection.summary.id == second.id


def test_a_session_change_during_generation_writes_nothing(digest_engine: Engine) -> None:
    engine = digest_engine
    sid = open_session(engine)
    engine.append(sid, messages=[m for k in range(4) for m in turn(f"c{k}")])
    gen = engine.cascade(sid, params(), manual=True)
    need = next(gen)
    log = log_bytes(engine, sid)
    engine.append(sid, messages=[user("meanwhile, another request")])
    appended = log_bytes(engine, sid)
    assert appended != log
    with pytest.raises(HeadConflict):
        gen.send(digest_answer(need))
    assert log_bytes(engine, sid) == appended
    assert records(engine, sid, "summary") == []


def test_bookkeeping_during_generation_does_not_undo_the_summary(
    digest_engine: Engine,
) -> None:
    """A usage report or an activity mark is not a content change."""
    engine = digest_engine
    sid = open_session(engine)
    engine.append(sid, messages=[m for k in range(4) for m in turn(f"u{k}")])
    gen = engine.cascade(sid, params(), manual=True)
    need = next(gen)
    engine.record_usage(sid, "claude-opus-4-8", {"input_tokens": 3000}, estimated=2900)
    engine.session(sid).touch()
    with pytest.raises(StopIteration) as stop:
        gen.send(digest_answer(need))
    assert [e.applied for e in stop.value.value.events] == [True]
    assert [r.kind for r in engine.session(sid).graph.records] == ["usage", "summary"]


def test_a_checkout_during_generation_writes_nothing(digest_engine: Engine) -> None:
    engine = digest_engine
    sid = open_session(engine)
    engine.append(sid, messages=[m for k in range(4) for m in turn(f"v{k}")])
    session = engine.session(sid)
    session.create_branch("other", session.graph.head())
    gen = engine.cascade(sid, params(), manual=True)
    need = next(gen)
    session.checkout("other")
    with pytest.raises(HeadConflict):
        gen.send(digest_answer(need))
    assert records(engine, sid, "summary") == []


@pytest.mark.parametrize(
    "answer",
    [
        SummaryFailure("cancelled", "the caller cancelled"),
        SummaryFailure("empty", "no text"),
        SummaryResult(text="   ", model="m"),
    ],
    ids=["cancelled", "empty-failure", "blank-text"],
)
def test_a_failed_generation_writes_nothing_and_substitutes_nothing(
    digest_engine: Engine, answer: SummaryResult | SummaryFailure
) -> None:
    engine = digest_engine
    sid = open_session(engine)
    engine.append(sid, messages=[m for k in range(4) for m in turn(f"x{k}")])
    log = log_bytes(engine, sid)
    before = engine.render(sid, params()).request
    _, out = manual(engine, sid, lambda need: answer)
    (event,) = out.events
    assert not event.applied and "nothing was written" in event.reason
    assert log_bytes(engine, sid) == log
    assert out.rendered.request == before  # no structural stand-in either


# ---- a real provider timing out ---------------------------------------------------------------


@pytest.fixture
def fake() -> Iterator[FakeAnthropic]:
    with FakeAnthropic(api_key="test") as server:
        yield server


async def test_a_stall_past_the_providers_timeout_writes_nothing(
    digest_engine: Engine, fake: FakeAnthropic
) -> None:
    engine = digest_engine
    sid = open_session(engine)
    engine.append(sid, messages=[m for k in range(4) for m in turn(f"t{k}")])
    log = log_bytes(engine, sid)
    fake.push(Reply.stall(5))
    provider = AnthropicSummaryProvider(
        api_key="test", base_url=fake.base_url, timeout_seconds=0.3, max_retries=0
    )
    gen = engine.cascade(sid, params(), manual=True)
    need: SummaryNeeded = next(gen)
    try:
        answer: SummaryResult | SummaryFailure = await provider.summarize(need.request)
    except SummaryFailure as failure:
        answer = failure
    finally:
        await provider.aclose()
    assert isinstance(answer, SummaryFailure) and answer.kind == "timeout"
    with pytest.raises(StopIteration) as stop:
        gen.send(answer)
    (event,) = stop.value.value.events
    assert not event.applied and "timeout" in event.reason
    assert log_bytes(engine, sid) == log
    assert len(fake.messages_requests()) == 1
