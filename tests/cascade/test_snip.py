"""Tier 2 — Snip: whole turns go, oldest first, re-measuring after each; the protected turns
(first user turn, latest complete turn, active turn, a running function's turn) never go;
completed functions go with their turn; `context/snip` to a target."""

from __future__ import annotations

from typing import Any

import orjson
import pytest
from compactd.context.engine import Engine
from compactd.context.errors import CannotFit
from compactd.context.policy import RUNNING_FUNCTION_PLACEHOLDER
from compactd.protocol.errors import code_for

from tests.cascade.helpers import (
    TARGET,
    THRESHOLD,
    assistant,
    cascade,
    check_no_split_turn,
    check_wire,
    common_prefix,
    exchange,
    filler,
    log_bytes,
    open_session,
    params,
    records,
    result_blocks,
    results,
    texts,
    tool_result,
    tool_use,
    turn_calls,
    user,
)
from tests.support.invariants import strip_cache_control

NO_CLEAR = {"microcompactWhenOver": False}  # so Tier 2 is what has to act


def read(tag: str, words: int = 360) -> tuple[str, str]:
    return ("Read", filler(tag, words))


def build(engine: Engine, config: dict[str, Any] | None = None, middle: int = 8) -> str:
    """Turn 0: the task; turns 1..middle: two big reads each (one of them runs a sub-agent
    that completes); then the latest complete turn and an active turn."""
    sid = open_session(engine, {**NO_CLEAR, **(config or {})})
    engine.append(sid, messages=exchange("t0", [read("t0r")], ask="the task: port the parser"))
    for t in range(1, middle + 1):
        if t == 2:
            engine.append(
                sid,
                messages=[
                    user("request t2: research the format"),
                    assistant("asking a sub-agent", tool_use("toolu_agent", "Task", prompt="go")),
                ],
            )
            session = engine.session(sid)
            fid = session.function_start("Task", {"prompt": "go"}, tool_use_id="toolu_agent")
            engine.append(sid, messages=[user("go"), assistant("found it")], function=fid)
            session.function_complete(fid, filler("agentout", 300))
            engine.append(sid, messages=exchange("t2b", [read("t2r")])[1:])
            continue
        engine.append(sid, messages=exchange(f"t{t}", [read(f"t{t}a"), read(f"t{t}b")]))
    engine.append(sid, messages=exchange("latest", [read("latest")]))
    engine.append(
        sid,
        messages=[
            user("request active: keep going"),
            assistant("on it", tool_use("toolu_active", "Read")),
            results(tool_result("toolu_active", filler("activeres", 200))),
        ],
    )
    return sid


def message_offsets(request: dict[str, Any]) -> list[int]:
    """Byte offset of each wire message inside the stripped `messages` array."""
    msgs = strip_cache_control(request)["messages"]
    out, at = [], 1
    for msg in msgs:
        out.append(at)
        at += len(orjson.dumps(msg)) + 1
    return out


def test_snip_removes_the_oldest_whole_turns_just_enough(engine: Engine) -> None:
    sid = build(engine)
    p = params()
    before = engine.render(sid, p)
    assert before.total > THRESHOLD
    costs = {}
    for msg in before.conversation.messages:
        costs[msg.turn] = costs.get(msg.turn, 0) + msg.tokens
    out = cascade(engine, sid, p, answer=lambda need: pytest.fail("no summary is needed"))
    check_wire(out.rendered)
    applied = [e for e in out.events if e.applied]
    assert [e.tier for e in applied] == ["snip"]
    event = applied[0]
    assert event.tokens_before == before.total
    assert event.tokens_after == out.rendered.total <= TARGET

    (snip,) = records(engine, sid, "snip")
    assert event.record_ids == [snip.id]
    shown = check_no_split_turn(engine, sid, out.rendered)
    removed = [i for i, on in enumerate(shown) if not on]
    n = event.details["removedTurns"]
    assert removed == list(range(1, 1 + n))  # oldest first, after the protected task turn
    assert len(snip.data["turns"]) == n
    # just enough: one turn fewer would still have been over the target (over the threshold,
    # a tier frees down to the target)
    assert before.total - sum(costs[i] for i in removed[:-1]) > TARGET
    # a turn goes whole: every node of it is covered, the calls included
    g = engine.session(sid).graph
    covered = {g.nodes[c].tool_use_id for c in snip.covers if g.nodes[c].kind == "tool"}
    assert covered == {c for i in removed for c in turn_calls(engine, sid)[i]}
    # the marker says so, where the turns were
    marker = [t for t in texts(out.rendered.request) if t.startswith("[compactd:")]
    assert marker == [
        f"[compactd: {n} earlier turns removed here to fit the context window; the originals "
        "are kept in the session graph]"
    ]
    # the snip leaves every byte before its position unchanged (the cache up to it stays)
    old = orjson.dumps(strip_cache_control(before.request)["messages"])
    new = orjson.dumps(strip_cache_control(out.rendered.request)["messages"])
    first_removed_message = 2  # turn 0 is one user and one assistant wire message pair
    assert common_prefix(old, new) >= message_offsets(before.request)[first_removed_message]
    # and what is left is exactly what was there
    assert orjson.dumps(engine.render(sid, p).request) == orjson.dumps(out.rendered.request)


def test_a_completed_function_goes_with_its_turn(engine: Engine) -> None:
    sid = build(engine)
    p = params()
    assert "toolu_agent" in result_blocks(engine.render(sid, p).request)
    out = cascade(engine, sid, p)
    assert "toolu_agent" not in result_blocks(out.rendered.request)
    (snip,) = records(engine, sid, "snip")
    g = engine.session(sid).graph
    fn = next(n for n in g.nodes.values() if n.kind == "function")
    assert fn.id in snip.covers  # the function node is covered with its call
    assert fn.status == "completed"


def test_the_protected_turns_stay_even_when_nothing_fits(engine: Engine) -> None:
    """Every removable turn goes; then the request is still over its limit: cannot fit, and
    nothing at all is written."""
    sid = open_session(engine, NO_CLEAR)
    engine.append(sid, messages=exchange("t0", [read("t0r", 700)], ask="the task"))
    for t in range(1, 4):
        engine.append(sid, messages=exchange(f"t{t}", [read(f"t{t}")]))
    engine.append(sid, messages=exchange("latest", [read("l1", 700), read("l2", 700)]))
    engine.append(sid, messages=[user("active: " + filler("huge", 8500))])
    log = log_bytes(engine, sid)
    with pytest.raises(CannotFit) as caught:
        cascade(engine, sid, params())
    assert code_for(caught.value.kind) == 4040
    assert caught.value.data["tokens"] > caught.value.data["limit"] == 24_000
    assert "no summary provider is configured" in str(caught.value)  # why nothing more ran
    assert log_bytes(engine, sid) == log
    assert records(engine, sid) == []


def test_a_running_function_keeps_its_turn(engine: Engine) -> None:
    sid = open_session(engine, NO_CLEAR)
    engine.append(sid, messages=exchange("t0", [read("t0r")], ask="the task"))
    for t in range(1, 8):
        engine.append(sid, messages=exchange(f"t{t}", [read(f"t{t}a"), read(f"t{t}b")]))
    engine.append(
        sid,
        messages=[
            user("active: research it"),
            assistant("asking a sub-agent", tool_use("toolu_bg", "Task", prompt="deep dive")),
        ],
    )
    session = engine.session(sid)
    fid = session.function_start("Task", {"prompt": "deep dive"}, tool_use_id="toolu_bg")
    engine.append(sid, messages=[user("deep dive"), assistant(filler("inside", 200))], function=fid)
    out = cascade(engine, sid, params())
    shown = check_no_split_turn(engine, sid, out.rendered)
    assert shown[-1]  # the running function's turn
    assert result_blocks(out.rendered.request)["toolu_bg"]["content"] == (
        RUNNING_FUNCTION_PLACEHOLDER
    )
    (snip,) = records(engine, sid, "snip")
    assert fid not in snip.covers
    assert not any(i in snip.covers for i in engine.session(sid).graph.function_path(fid).ids)
    assert shown[0] and shown[-2]  # the task and the latest complete turn too


def test_the_first_turn_can_be_given_up(engine: Engine) -> None:
    sid = build(engine, {"snipKeepFirstTurn": False})
    out = cascade(engine, sid, params())
    shown = check_no_split_turn(engine, sid, out.rendered)
    assert not shown[0]
    assert "the task: port the parser" not in texts(out.rendered.request)
    n = next(e for e in out.events if e.applied).details["removedTurns"]
    assert [i for i, on in enumerate(shown) if not on] == list(range(n))


def test_snip_can_be_disabled(engine: Engine) -> None:
    sid = build(engine, {"snipEnabled": False})
    try:
        events = cascade(engine, sid, params()).events
    except CannotFit as cannot:
        events = cannot.data["events"]
    (note,) = [e for e in events if e.tier == "snip"]
    assert not note.applied and note.reason == "snip is disabled for this session"
    assert records(engine, sid, "snip") == []


def test_snip_on_demand_to_a_target(engine: Engine) -> None:
    sid = build(engine, middle=4)
    p = params()
    before = engine.render(sid, p)
    assert before.total < THRESHOLD  # the cascade would do nothing here
    target = before.total - 5_000
    outcome = engine.snip(sid, p, target)
    (event,) = outcome.events
    assert event.tier == "snip" and event.applied
    assert outcome.tokens_before == event.tokens_before == before.total
    assert event.tokens_after == outcome.rendered.total <= target
    assert event.details["removedTurns"] >= 2
    assert event.record_ids == [r.id for r in records(engine, sid, "snip")]
    assert engine.render(sid, p).total == outcome.rendered.total
    check_no_split_turn(engine, sid, outcome.rendered)

    # already under the target: nothing is written, and the reason says why
    log = log_bytes(engine, sid)
    again = engine.snip(sid, p, outcome.rendered.total + 1)
    (note,) = again.events
    assert not note.applied
    assert "already under the target" in note.reason
    assert log_bytes(engine, sid) == log


def test_snip_on_demand_stops_at_the_protected_turns(engine: Engine) -> None:
    sid = build(engine, middle=3)
    outcome = engine.snip(sid, params(), 1)
    (event,) = outcome.events
    assert event.applied and event.details["removedTurns"] == 3
    shown = check_no_split_turn(engine, sid, outcome.rendered)
    assert shown == [True, False, False, False, True, True]


def test_a_snip_that_would_grow_the_request_is_not_applied(engine: Engine) -> None:
    """The only removable turn is smaller than the marker that would replace it."""
    sid = open_session(engine, NO_CLEAR)
    engine.append(sid, messages=exchange("t0", [read("t0r")], ask="the task " + filler("a", 6000)))
    engine.append(sid, messages=[user("ok?"), assistant("ok")])
    engine.append(sid, messages=exchange("latest", [read("l1")], ask="then " + filler("b", 3700)))
    engine.append(sid, messages=[user("active: go")])
    p = params()
    before = engine.render(sid, p)
    assert before.total > THRESHOLD
    log = log_bytes(engine, sid)
    out = cascade(engine, sid, p)
    (note,) = [e for e in out.events if e.tier == "snip"]
    assert not note.applied and note.reason.startswith("no gain")
    assert out.rendered.total == before.total
    assert log_bytes(engine, sid) == log
