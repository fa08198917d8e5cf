"""Tier 5 — Reactive: the provider said the prompt is too long. The estimator adopts the
provider's count, the cascade brings the request under the provider's limit with the margin,
and a second overflow in the same turn is a clean "cannot fit", never a loop."""

from __future__ import annotations

import pytest
from compactd.context.engine import Engine
from compactd.context.errors import CannotFit
from compactd.context.summarizer.types import SummaryFailure, SummaryNeeded, SummaryResult
from compactd.context.tiers.reactive import parse_overflow

from tests.cascade.helpers import (
    assistant,
    cascade,
    check_no_split_turn,
    check_wire,
    filler,
    log_bytes,
    open_session,
    params,
    records,
    texts,
    user,
)

MESSAGE = "prompt is too long: 210345 tokens > 200000 maximum"
WINDOW = 200_000  # output reserve 20,000: limit 180,000, threshold 153,000


def never(need: SummaryNeeded) -> SummaryResult | SummaryFailure:
    raise AssertionError(f"no summary may be asked for here ({need.tier})")


def long_session(engine: Engine, turns: int = 36) -> str:
    """About 150K estimated tokens of plain conversation: under our own threshold."""
    sid = open_session(engine)
    for t in range(turns):
        engine.append(sid, messages=[user(filler(f"u{t}", 1000)), assistant(f"noted {t}")])
    engine.append(sid, messages=[user("now write the migration")])
    return sid


def test_overflow_recalibrates_and_fits_under_the_providers_limit(engine: Engine) -> None:
    sid = long_session(engine)
    p = params(WINDOW)
    before = engine.render(sid, p)
    assert 140_000 < before.total < 153_000  # we thought it fitted
    overflow = parse_overflow(400, MESSAGE)
    assert overflow is not None
    assert (overflow.prompt_tokens, overflow.limit_tokens) == (210_345, 200_000)

    out = cascade(engine, sid, p, answer=never, overflow=overflow)
    check_wire(out.rendered)
    reactive = out.events[0]
    assert reactive.tier == "reactive" and reactive.applied
    target = int(min(200_000, 180_000) * (1 - 0.05))
    assert reactive.details["target"] == target
    assert out.rendered.ratio == pytest.approx(210_345 / before.estimate, abs=1e-4)
    assert out.rendered.total <= target
    assert out.rendered.estimate < out.rendered.total  # the total counts as the provider does
    assert [e.tier for e in out.events if e.applied] == ["reactive", "snip"]
    # the snip counted in the provider's tokens: it removed just enough to reach the cascade's
    # target (50 % of the limit: headroom after an overflow too), not a third more
    snip = out.events[1]
    costs: dict[int, int] = {}
    for msg in before.conversation.messages:
        costs[msg.turn] = costs.get(msg.turn, 0) + msg.tokens
    last_removed = snip.details["removedTurns"]  # turns 1..n went (turn 0 is the task)
    one_fewer = out.rendered.total + round(costs[last_removed] * out.rendered.ratio)
    assert out.rendered.total <= 90_000 < one_fewer
    check_no_split_turn(engine, sid, out.rendered)
    assert "now write the migration" in texts(out.rendered.request)

    (rec,) = records(engine, sid, "reactive")
    assert reactive.record_ids == [rec.id]
    assert rec.data["reported"] == 210_345 and rec.data["limit"] == 200_000
    assert rec.data["estimated"] == before.estimate
    # the provider's count survives a reload: a fresh engine estimates exactly the same
    fresh = Engine(engine.store)
    again = fresh.render(sid, p)
    assert again.total == out.rendered.total
    assert again.request == out.rendered.request


def test_a_second_overflow_in_the_same_turn_cannot_fit_without_looping(engine: Engine) -> None:
    sid = long_session(engine)
    p = params(WINDOW)
    cascade(engine, sid, p, answer=never, overflow=parse_overflow(400, MESSAGE))
    log = log_bytes(engine, sid)
    asked: list[SummaryNeeded] = []

    def counting(need: SummaryNeeded) -> SummaryResult | SummaryFailure:
        asked.append(need)
        return SummaryFailure("other", "not reached")

    with pytest.raises(CannotFit) as caught:
        cascade(engine, sid, p, answer=counting, overflow=parse_overflow(400, MESSAGE))
    assert "once per turn" in str(caught.value)
    assert asked == []
    assert log_bytes(engine, sid) == log

    # a new turn may overflow (and recover) once again
    engine.append(sid, messages=[assistant("migration written"), user("and the rollback")])
    out = cascade(engine, sid, p, answer=never, overflow=parse_overflow(400, MESSAGE))
    assert out.events[0].tier == "reactive" and out.events[0].applied
    assert len(records(engine, sid, "reactive")) == 2


def test_http_413_names_no_numbers_so_the_request_shrinks_by_a_fifth(engine: Engine) -> None:
    sid = long_session(engine)
    p = params(WINDOW)
    before = engine.render(sid, p).total
    overflow = parse_overflow(413, "Request exceeds the maximum allowed number of bytes.")
    assert overflow is not None and overflow.prompt_tokens is None
    out = cascade(engine, sid, p, answer=never, overflow=overflow)
    assert out.events[0].details["target"] == int(before * 0.8 * 0.95)
    assert out.rendered.total <= before * 0.8 * 0.95
    assert out.rendered.ratio == 1.0  # nothing to calibrate from


def test_other_errors_are_not_overflows() -> None:
    assert parse_overflow(429, "rate limited") is None
    assert parse_overflow(400, "messages.3: `tool_use` ids were found without results") is None
    assert parse_overflow(529, "Overloaded") is None


def test_an_overflow_that_cannot_be_met_writes_nothing(engine: Engine) -> None:
    sid = open_session(engine)
    engine.append(sid, messages=[user(filler("only", 1000))])
    log = log_bytes(engine, sid)
    with pytest.raises(CannotFit) as caught:
        cascade(
            engine,
            sid,
            params(),
            answer=never,
            overflow=parse_overflow(400, "prompt is too long: 9000 tokens > 3000 maximum"),
        )
    assert log_bytes(engine, sid) == log  # not even the reactive record
    # the limit it names is the provider's, with the margin, and it says so
    assert caught.value.data["limit"] == 2_850
    assert "only 2,850 fit (the provider's overflow report, less a 5% margin)" in str(caught.value)


def test_an_overflow_that_cannot_be_met_leaves_the_estimates_as_they_were(
    engine: Engine,
) -> None:
    """Nothing was written, so nothing may change in memory either: this daemon estimates
    exactly as a restarted one would."""
    sid = open_session(engine)
    engine.append(sid, messages=[user(filler("only", 1000))])
    before = engine.render(sid, params())
    with pytest.raises(CannotFit):
        cascade(
            engine,
            sid,
            params(),
            answer=never,
            overflow=parse_overflow(400, "prompt is too long: 9000 tokens > 3000 maximum"),
        )
    after = engine.render(sid, params())
    assert after.ratio == before.ratio == Engine(engine.store).render(sid, params()).ratio
    assert after.total == before.total
