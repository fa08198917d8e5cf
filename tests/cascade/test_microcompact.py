"""Tier 1 — Microcompact: the count trigger (50, then every 25), keep-recent, the idle trigger,
the window forcing a clear, and the cache-aware path through the real SDK and the fake API."""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import anthropic
import orjson
import pytest
from compactd.context.engine import Engine
from compactd.context.policy import CLEARED_PLACEHOLDER
from compactd.context.stores.files import FileStore
from compactd.context.tiers.microcompact import CLEAR_EDIT, CONTEXT_MANAGEMENT_BETA

from tests.cascade.helpers import (
    MODEL,
    THRESHOLD,
    assistant,
    cascade,
    check_wire,
    covered_use_ids,
    filler,
    messages_bytes,
    open_session,
    params,
    record_by_id,
    records,
    result_blocks,
    results,
    tool_result,
    tool_use,
    user,
)
from tests.support.fake_anthropic import FakeAnthropic
from tests.support.invariants import server_cleared, server_view

BIG = 200_000
SHORT = "No files found"  # shorter than the placeholder: clearing it would only grow the request


def call_kind(k: int) -> tuple[str, str]:
    """The k-th call of the synthetic agent (1-based): mostly Reads, every 7th a TodoWrite
    (not compactable), every 11th a Grep that found nothing (too short to be worth clearing)."""
    if k % 7 == 0:
        return "TodoWrite", filler(f"todo{k}", 60)
    if k % 11 == 0:
        return "Grep", SHORT
    return "Read", filler(f"read{k}", 60)


def add_call(engine: Engine, sid: str, k: int, kind: tuple[str, str] | None = None) -> str:
    name, content = kind or call_kind(k)
    use_id = f"toolu_{k:03d}"
    engine.append(
        sid,
        messages=[
            assistant(f"step {k}", tool_use(use_id, name)),
            results(tool_result(use_id, content)),
        ],
    )
    return use_id


def expected_cleared(upto: int, keep: int = 5, mode: str = "time") -> set[str]:
    """Every compactable result but the `keep` newest, skipping results too short to clear —
    except on the server path: the provider clears every older result of a compactable tool."""
    compactable = [k for k in range(1, upto + 1) if call_kind(k)[0] in ("Read", "Grep")]
    kept = set(compactable[-keep:]) if keep else set()
    worth = ("Read", "Grep") if mode == "cache" else ("Read",)
    return {f"toolu_{k:03d}" for k in compactable if k not in kept and call_kind(k)[0] in worth}


def placeholders(request: dict[str, Any]) -> set[str]:
    """Results the model sees as cleared: by us (time path) or by the provider (server path,
    its edit applied by the documented rule)."""
    seen = server_view(request)
    return {i for i, b in result_blocks(seen).items() if b["content"] == CLEARED_PLACEHOLDER}


MODES = pytest.mark.parametrize("mode", ["cache", "time"])


@MODES
def test_count_trigger_fires_at_50_then_every_25_keeping_the_5_newest(
    engine: Engine, mode: str
) -> None:
    sid = open_session(engine, {"microcompactWarm": "apply", "microcompactMode": mode})
    engine.append(sid, messages=[user("one long agentic task")])
    p = params(BIG)
    fired: dict[int, dict[str, Any]] = {}
    for k in range(1, 81):
        add_call(engine, sid, k)
        out = cascade(engine, sid, p)
        check_wire(out.rendered)
        applied = [e for e in out.events if e.applied]
        if applied:
            assert [e.tier for e in applied] == ["microcompact"]
            fired[k] = applied[0]
        # everything cleared so far shows the placeholder; the rest is verbatim
        last = max((n for n in fired if n <= k), default=0)
        assert placeholders(out.rendered.request) == (
            expected_cleared(last, mode=mode) if last else set()
        )
    assert sorted(fired) == [50, 75]
    for k, event in fired.items():
        rec = record_by_id(engine, sid, event.record_ids[0])
        assert rec.kind == "clear"
        assert (rec.data["mode"], rec.data["trigger"], rec.data["atCalls"]) == (mode, "count", k)
        assert rec.data["results"] == rec.covers  # short inputs: no input was shortened
        assert rec.data["inputs"] == []
        assert event.details["trigger"] == "count"
        assert event.tokens_after < event.tokens_before
    first, second = records(engine, sid, "clear")
    assert covered_use_ids(engine, sid, first) == expected_cleared(50, mode=mode)
    assert covered_use_ids(engine, sid, second) == expected_cleared(75, mode=mode) - (
        expected_cleared(50, mode=mode)
    )
    # the single turn is the active one: clears reach into it, all but the 5 newest results
    final = result_blocks(server_view(out.rendered.request))
    newest = [f"toolu_{k:03d}" for k in range(1, 81) if call_kind(k)[0] in ("Read", "Grep")][-5:]
    for use_id in newest:
        assert final[use_id]["content"] != CLEARED_PLACEHOLDER
    todo = [f"toolu_{k:03d}" for k in range(1, 81) if call_kind(k)[0] == "TodoWrite"]
    assert all(final[t]["content"] != CLEARED_PLACEHOLDER for t in todo)


@MODES
def test_keep_recent_is_configurable(engine: Engine, mode: str) -> None:
    config = {"microcompactWarm": "apply", "microcompactKeepRecent": 2, "microcompactMode": mode}
    sid = open_session(engine, config)
    engine.append(sid, messages=[user("task")])
    for k in range(1, 51):
        add_call(engine, sid, k)
    out = cascade(engine, sid, params(BIG))
    assert placeholders(out.rendered.request) == expected_cleared(50, keep=2, mode=mode)


@MODES
def test_count_trigger_defers_while_warm_then_clears_with_the_forced_change(
    engine: Engine, mode: str
) -> None:
    sid = open_session(engine, {"microcompactWarm": "defer", "microcompactMode": mode})
    engine.append(sid, messages=[user("task")])
    for k in range(1, 56):
        add_call(engine, sid, k)
    before = engine.render(sid, params(BIG)).request
    out = cascade(engine, sid, params(BIG))
    (event,) = out.events
    assert event.tier == "microcompact" and not event.applied
    assert event.reason.startswith("deferred")
    assert records(engine, sid, "clear") == []
    assert messages_bytes(out.rendered.request) == messages_bytes(before)
    # the same session rendered for a window it does not fit: the deferred clear is applied now
    small = params(window=20_000)  # limit 15,000, threshold 12,750
    assert engine.render(sid, small).total > 12_750
    out = cascade(engine, sid, small)
    applied = [e for e in out.events if e.applied]
    assert [e.tier for e in applied] == ["microcompact"]
    assert applied[0].details["trigger"] == "count"
    assert placeholders(out.rendered.request) == expected_cleared(55, mode=mode)
    assert out.rendered.total <= 12_750


def sized_session(engine: Engine, words: list[int]) -> str:
    """One Read per entry of `words` (its result's size), in a single agentic turn."""
    sid = open_session(engine)
    engine.append(sid, messages=[user("task")])
    for k, n in enumerate(words, start=1):
        add_call(engine, sid, k, ("Read", filler(f"r{k}", n)))
    return sid


def test_economic_mode_clears_while_warm_when_the_savings_pay_for_the_rewrite(
    engine: Engine,
) -> None:
    """DESIGN §4: 0.1 × saved × requests to come > 1.25 × re-written tokens (horizon 25)."""
    sid = sized_session(engine, [600] * 40 + [30] * 10)  # big old results, a small tail
    out = cascade(engine, sid, params(BIG))
    assert out.rendered.total < 0.85 * 180_000
    (event,) = [e for e in out.events if e.applied]
    assert event.tier == "microcompact" and event.details["trigger"] == "count"
    saved = event.tokens_before - event.tokens_after
    rewritten_at_most = event.tokens_after  # what follows the first cleared result
    assert 0.1 * saved * 25 > 1.25 * rewritten_at_most
    assert engine.render(sid, params(BIG)).total == event.tokens_after


DEFERRED = [30] * 45 + [600] * 5
"""Small old results, big kept ones: a warm clear of them does not pay for its rewrite."""


def test_economic_mode_defers_when_the_rewrite_costs_more(engine: Engine) -> None:
    sid = sized_session(engine, DEFERRED)
    out = cascade(engine, sid, params(BIG))
    (event,) = out.events
    assert not event.applied and event.reason.startswith("deferred")
    found = re.search(r"save ([\d,]+) tokens per request but re-write ([\d,]+)", event.reason)
    assert found is not None
    saved, rewritten = (int(g.replace(",", "")) for g in found.groups())
    assert saved > 0 and 0.1 * saved * 25 <= 1.25 * rewritten
    assert records(engine, sid, "clear") == []


@pytest.mark.parametrize(
    ("fmt", "ttl", "pause", "cold"),
    [
        ("anthropic", "1h", 600, False),
        ("anthropic", "1h", 3_600, True),
        ("anthropic", "5m", 600, True),
        ("anthropic", None, 299, False),
        ("openai", None, 600, False),
        ("openai", None, 3_600, True),
    ],
)
def test_a_warm_clear_that_would_not_pay_is_made_once_the_cache_has_expired(
    store: FileStore, fmt: str, ttl: str | None, pause: float, cold: bool
) -> None:
    """The rewrite a warm clear is deferred for is no cost once the provider's cache has
    expired (no request reported within the breakpoints' TTL; on OpenAI, whose cache is best
    effort, within the hour it may live): the next request is written whole either way, so
    the clear is made then."""
    clock = Clock(1_000_000.0)
    engine = Engine(store, clock=clock)
    sid = sized_session(engine, DEFERRED)
    p = params(BIG, cache_ttl=ttl, format=fmt)
    assert not cascade(engine, sid, p).events[0].applied  # the same session, warm: deferred
    engine.record_usage(sid, MODEL, {"input_tokens": engine.render(sid, p).total})
    clock.now += pause
    out = cascade(engine, sid, p)
    (event,) = out.events
    assert event.applied is cold
    assert ("the provider's cache has expired" in event.reason) is cold
    assert len(records(engine, sid, "clear")) == int(cold)
    assert (out.rendered.total < event.tokens_before) is cold


def test_a_session_never_reported_counts_as_warm(store: FileStore) -> None:
    clock = Clock(1_000_000.0)
    engine = Engine(store, clock=clock)
    sid = sized_session(engine, DEFERRED)
    clock.now += 10 * 3_600
    (event,) = cascade(engine, sid, params(BIG, cache_ttl="1h")).events
    assert not event.applied and event.reason.startswith("deferred")


def over_threshold_session(engine: Engine, config: dict[str, Any] | None = None) -> str:
    """20 calls (under the count trigger) whose results put the request over 90 %."""
    sid = open_session(engine, config)
    engine.append(sid, messages=[user("read the whole module")])
    for k in range(20):
        use_id = f"toolu_{k:03d}"
        content = SHORT if k % 4 == 1 else filler(f"part{k}", 360)
        engine.append(
            sid,
            messages=[
                assistant(f"part {k}", tool_use(use_id, "Grep" if k % 4 == 1 else "Read")),
                results(tool_result(use_id, content)),
            ],
        )
    return sid


def test_over_threshold_forces_a_clear_before_any_turn_goes(engine: Engine) -> None:
    # the five newest calls kept whatever they cost (their share is another test's)
    sid = over_threshold_session(
        engine, {"microcompactMode": "time", "microcompactKeepRecentShare": 1.0}
    )
    p = params()
    before = engine.render(sid, p)
    assert before.total > THRESHOLD
    out = cascade(engine, sid, p)
    assert [e.tier for e in out.events if e.applied] == ["microcompact"]
    event = out.events[0]
    assert event.details["trigger"] == "forced"
    assert event.tokens_before == before.total
    assert event.tokens_after == out.rendered.total < THRESHOLD
    cleared = placeholders(out.rendered.request)
    reads = [f"toolu_{k:03d}" for k in range(20) if k % 4 != 1]
    greps = [f"toolu_{k:03d}" for k in range(20) if k % 4 == 1]
    newest = sorted(reads + greps)[-5:]
    assert cleared == {r for r in reads if r not in newest}
    # short results stay: clearing them would have made the request bigger
    assert not cleared & set(greps)
    assert all(result_blocks(out.rendered.request)[g]["content"] == SHORT for g in greps)


def test_forcing_can_be_switched_off(engine: Engine) -> None:
    sid = over_threshold_session(engine, {"microcompactWhenOver": False})
    out = cascade(engine, sid, params())
    assert not any(e.applied for e in out.events)
    assert records(engine, sid, "clear") == []
    assert placeholders(out.rendered.request) == set()


def test_a_clear_never_grows_the_request(engine: Engine) -> None:
    """Old results all shorter than the placeholder: nothing to clear, so nothing is cleared
    (it used to replace 'No files found' with the 90-character placeholder)."""
    sid = open_session(engine)
    engine.append(sid, messages=[user("find the config " + filler("ask", 7400))])
    for k in range(12):
        use_id = f"toolu_{k:03d}"
        engine.append(
            sid,
            messages=[
                assistant("grep", tool_use(use_id, "Grep")),
                results(tool_result(use_id, SHORT)),
            ],
        )
    p = params()
    assert engine.render(sid, p).total > THRESHOLD
    out = cascade(engine, sid, p)
    assert not [e for e in out.events if e.tier == "microcompact" and e.applied]
    assert records(engine, sid, "clear") == []


# ---- the idle trigger ---------------------------------------------------------------------------


class Clock:
    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def test_idle_clears_old_results_once_per_idle_period(store: FileStore) -> None:
    clock = Clock(1_000_000.0)
    engine = Engine(store, clock=clock)
    sid = open_session(engine)
    engine.append(sid, messages=[user("task")])
    for k in range(1, 9):
        add_call(engine, sid, k, ("Read", filler(f"read{k}", 60)))
    engine.append(sid, messages=[assistant("done")])
    session = engine.session(sid)
    start = session.graph.last_activity
    assert start == clock.now
    idle = engine.policy(session).idle_seconds
    assert idle == 90 * 60
    assert engine.idle_due(session, start + idle - 1) is None
    assert engine.idle_due(session, start + idle) == pytest.approx(idle)

    before = engine.render(sid, params(BIG))
    clock.now = start + idle + 5
    outcome = engine.run_idle(session)
    cleared = records(engine, sid, "clear")
    assert len(cleared) == 1 and cleared[0].data["trigger"] == "idle"
    assert outcome.cleared == len(cleared[0].covers) == 8 - 5
    (event,) = outcome.events
    assert event.tier == "microcompact" and event.applied
    assert event.record_ids == [cleared[0].id]
    assert event.tokens_before == before.total > event.tokens_after
    after = engine.render(sid, params(BIG))
    assert after.total == event.tokens_after
    assert placeholders(after.request) == covered_use_ids(engine, sid, cleared[0])
    assert placeholders(after.request) == {"toolu_001", "toolu_002", "toolu_003"}
    # the period is done: no second pass however long the session stays idle
    assert engine.idle_due(session, start + 10 * idle) is None
    assert len(records(engine, sid, "idle")) == 1

    # new activity starts a new period
    clock.now = start + 20_000
    for k in range(20, 23):
        add_call(engine, sid, k, ("Read", filler(f"read{k}", 60)))
    assert engine.idle_due(session, clock.now + idle - 1) is None
    assert engine.idle_due(session, clock.now + idle) is not None
    second = engine.run_idle(session)
    assert second.cleared == 3  # 11 compactable, 5 kept, 3 cleared before
    assert engine.idle_due(session, clock.now + 3 * idle) is None


def test_idle_with_nothing_to_clear_still_marks_the_period(store: FileStore) -> None:
    clock = Clock(5_000.0)
    engine = Engine(store, clock=clock)
    sid = open_session(engine)
    engine.append(sid, messages=[user("hi"), assistant("hello")])
    session = engine.session(sid)
    due = session.graph.last_activity + 90 * 60
    assert engine.idle_due(session, due) is not None
    outcome = engine.run_idle(session)
    assert outcome.cleared == 0 and outcome.events == []
    assert records(engine, sid, "clear") == []
    assert engine.idle_due(session, due + 1) is None


# ---- the cache-aware path -----------------------------------------------------------------------

TOOLS = [
    {
        "name": name,
        "description": f"the {name} tool",
        "input_schema": {"type": "object", "properties": {"file_path": {"type": "string"}}},
    }
    for name in ("Read", "Grep", "TodoWrite", "Task")
]


@pytest.fixture
def fake() -> Iterator[FakeAnthropic]:
    with FakeAnthropic(api_key="test") as server:
        yield server


def cache_session(engine: Engine, calls: int, config: dict[str, Any] | None = None) -> str:
    """One agentic turn of `calls` tool calls (the default config: Tier 1's server path)."""
    sid = open_session(engine, config)
    engine.append(sid, messages=[user("audit every module")])
    for k in range(1, calls + 1):
        name = "TodoWrite" if k % 9 == 0 else "mcp__linear__create_issue" if k == 13 else "Read"
        use_id = f"toolu_{k:03d}"
        text = f"module {k}: " + "the function returns the parsed value and logs it. " * 10
        engine.append(
            sid,
            messages=[
                assistant(f"look at {k}", tool_use(use_id, name)),
                results(tool_result(use_id, text)),
            ],
        )
    return sid


SERVER_CLEARED = 60 - 6 - 1 - 5  # not TodoWrite (every 9th) or the mcp tool, the 5 newest kept


def test_the_server_path_is_the_default_and_the_cascade_counts_it(
    engine: Engine, fake: FakeAnthropic
) -> None:
    """Over its threshold, the session is brought under by the provider's clear alone: the
    messages sent are the plain render's, no turn is snipped, the measure is what the model
    will see, and the real SDK sends it (beta header included) as documented."""
    sid = cache_session(engine, 60)
    p = params(window=10_000, tools=TOOLS, system="You are a careful auditor.")
    plain = engine.render(sid, p)
    assert plain.total > plain.budget.limit  # it would not even fit without Tier 1
    out = cascade(engine, sid, p)
    request = out.rendered.request
    assert [e.tier for e in out.events if e.applied] == ["microcompact"]
    (clear,) = records(engine, sid, "clear")
    assert clear.data["mode"] == "cache"
    assert records(engine, sid, "snip") == [] and records(engine, sid, "summary") == []
    # what is sent: the plain render's messages, system and tools, byte for byte, and the edit
    assert orjson.dumps(request["messages"]) == orjson.dumps(plain.request["messages"])
    assert request["system"] == plain.request["system"]
    assert request["tools"] == plain.request["tools"]
    assert CLEARED_PLACEHOLDER.encode() not in orjson.dumps(request)
    assert "betas" not in request  # not a body field: `messages.create(**request)` refuses it
    assert out.rendered.headers == {"anthropic-beta": CONTEXT_MANAGEMENT_BETA}
    (edit,) = request["context_management"]["edits"]
    assert edit["type"] == CLEAR_EDIT == "clear_tool_uses_20250919"
    assert edit["exclude_tools"] == ["Task", "TodoWrite", "mcp__linear__create_issue"]
    assert edit["keep"] == {"type": "tool_uses", "value": 5}
    assert 0 < edit["clear_at_least"]["value"] <= 5000
    # what is counted: the request after the provider's clear, by its documented rule
    assert len(server_cleared(request)) == SERVER_CLEARED
    assert out.rendered.total <= out.rendered.budget.limit * 0.9
    assert out.rendered.sent_estimate == plain.estimate
    check_wire(out.rendered)

    # the documented call: the beta resource, with the headers beside the body
    with anthropic.Anthropic(base_url=fake.base_url, api_key="test", max_retries=0) as sdk:
        response = sdk.beta.messages.create(**request, extra_headers=out.rendered.headers)
    sent = fake.last_request
    assert sent.betas == [CONTEXT_MANAGEMENT_BETA]
    assert sent.body["context_management"] == request["context_management"]
    assert sent.body["messages"] == request["messages"]
    assert response.context_management is not None
    applied = [e.model_dump(exclude_none=True) for e in response.context_management.applied_edits]
    assert applied[0]["type"] == CLEAR_EDIT
    assert applied[0]["cleared_tool_uses"] == SERVER_CLEARED

    # the provider's report becomes a record; measure then agrees with the provider's count
    usage = response.usage.model_dump(exclude_none=True)
    report = engine.report(sid, MODEL, usage, None, applied)
    (rec,) = records(engine, sid, "usage")
    assert rec.data["appliedEdits"] == applied
    assert (rec.data["estimated"], rec.data["sent"]) == (out.rendered.estimate, plain.estimate)
    assert report.reported == usage["input_tokens"]
    again = engine.render(sid, p)
    assert again.total == pytest.approx(usage["input_tokens"], rel=0.05)
    # a usage record changes no context: the next request is the same bytes
    assert orjson.dumps(again.request) == orjson.dumps(request)


def test_without_a_report_of_applied_edits_the_server_path_still_calibrates(
    engine: Engine,
) -> None:
    """A client that reports only `usage`: the provider counted what the model saw."""
    sid = cache_session(engine, 60)
    p = params(window=15_000, tools=TOOLS)
    out = cascade(engine, sid, p)
    seen = out.rendered.estimate
    assert out.rendered.sent_estimate > seen
    engine.report(sid, MODEL, {"input_tokens": round(seen * 1.2), "output_tokens": 5}, None, None)
    assert engine.render(sid, p).ratio == pytest.approx(1.2, rel=0.01)


def test_the_edit_needs_the_beta_resource_and_its_header(fake: FakeAnthropic) -> None:
    """Why the beta travels in `headers`: the SDK's GA resource has no `context_management`
    keyword, and the API refuses the edit without the beta header."""
    body = {
        "model": MODEL,
        "max_tokens": 10,
        "messages": [{"role": "user", "content": "hi"}],
        "context_management": {"edits": [{"type": CLEAR_EDIT}]},
    }
    headers = {"anthropic-beta": CONTEXT_MANAGEMENT_BETA}
    with anthropic.Anthropic(base_url=fake.base_url, api_key="test", max_retries=0) as sdk:
        with pytest.raises(TypeError):
            sdk.messages.create(**body)  # type: ignore[call-overload]
        with pytest.raises(anthropic.BadRequestError):
            sdk.beta.messages.create(**body)
        assert sdk.beta.messages.create(**body, extra_headers=headers).content
    assert fake.last_request.betas == [CONTEXT_MANAGEMENT_BETA]


def test_the_openai_format_of_the_same_session_clears_client_side(engine: Engine) -> None:
    sid = cache_session(engine, 60)
    anthropic_out = cascade(engine, sid, params(window=15_000, tools=TOOLS))
    assert [e.tier for e in anthropic_out.events if e.applied] == ["microcompact"]
    out = cascade(engine, sid, params(window=15_000, format="openai"))
    text = orjson.dumps(out.rendered.request)
    # the provider's clear is not available there: the same calls show the placeholder
    assert text.count(CLEARED_PLACEHOLDER.encode()) == SERVER_CLEARED
    assert b"context_management" not in text and out.rendered.headers == {}
    assert out.rendered.total == pytest.approx(anthropic_out.rendered.total, rel=0.1)


def test_an_openai_session_takes_the_time_path(engine: Engine) -> None:
    sid = cache_session(engine, 60)
    out = cascade(engine, sid, params(window=15_000, format="openai"))
    (clear,) = records(engine, sid, "clear")
    assert clear.data["mode"] == "time"
    assert CLEARED_PLACEHOLDER.encode() in orjson.dumps(out.rendered.request)


def test_the_server_path_waits_for_the_count_trigger(engine: Engine) -> None:
    sid = cache_session(engine, 49)
    out = cascade(engine, sid, params(window=60_000, tools=TOOLS))
    assert "context_management" not in out.rendered.request
    assert out.rendered.headers == {}
    assert out.events == []


def test_usage_after_a_server_side_clear_agrees_with_the_provider(engine: Engine) -> None:
    sid = cache_session(engine, 60)
    p = params(window=15_000, tools=TOOLS)
    out = cascade(engine, sid, p)
    seen, sent = out.rendered.estimate, out.rendered.sent_estimate
    edits = [{"type": CLEAR_EDIT, "cleared_tool_uses": 48, "cleared_input_tokens": sent - seen}]
    # the provider counted exactly what we estimated, and cleared what we said it would
    engine.report(sid, MODEL, {"input_tokens": seen, "output_tokens": 50}, None, edits)
    assert engine.render(sid, p).total == pytest.approx(out.rendered.total, rel=0.02)
    # it cleared nothing after all and counted the whole request: the next estimates follow
    # the provider upwards (the safe side), not our expectation
    engine.report(sid, MODEL, {"input_tokens": sent, "output_tokens": 50}, None, [])
    assert engine.render(sid, p).total > out.rendered.total * 1.2


def test_the_newest_steps_results_stay_whole_however_little_the_share_keeps(
    engine: Engine,
) -> None:
    """The calls of the last assistant message: the model has not read their results yet, so
    no pass clears them — not a share of the limit that keeps nothing else, not the last
    resort. Older ones go."""
    sid = open_session(engine, {"microcompactMode": "time", "microcompactKeepRecentShare": 0.001})
    msgs: list[dict[str, Any]] = [user("the task: read everything")]
    for k in range(10):
        msgs.append(assistant(f"step {k}", tool_use(f"toolu_o{k}", "Read")))
        msgs.append(results(tool_result(f"toolu_o{k}", filler(f"old{k}", 900))))
    newest = [f"toolu_n{k}" for k in range(3)]  # three reads at once
    msgs.append(assistant("three at once", *(tool_use(u, "Read") for u in newest)))
    msgs.append(results(*(tool_result(u, filler(u, 900)) for u in newest)))
    engine.append(sid, messages=msgs)
    out = cascade(engine, sid, params())
    shown = result_blocks(out.rendered.request)
    for use_id in newest:
        assert f"[{use_id}]" in str(shown[use_id]["content"])
    assert shown["toolu_o9"]["content"] == CLEARED_PLACEHOLDER  # the newest but those: gone


def test_the_newest_steps_long_inputs_go_last_of_all_and_the_request_fits(
    engine: Engine,
) -> None:
    """Over the limit with every other result cleared and nothing else to take, the newest
    step's own long input (a file the model just wrote) is shortened — on the server path too,
    by compactd — its unread result kept whole; without that the request could not be sent."""
    sid = open_session(engine, {"snipEnabled": False, "collapseEnabled": False})
    msgs: list[dict[str, Any]] = [user("the task: write the module")]
    for k in range(6):
        msgs.append(assistant(f"step {k}", tool_use(f"toolu_o{k}", "Read")))
        msgs.append(results(tool_result(f"toolu_o{k}", filler(f"old{k}", 300))))
    big = filler("written", 30_000)
    msgs.append(
        assistant("writing it", tool_use("toolu_w", "Write", file_path="/m.py", content=big))
    )
    msgs.append(results(tool_result("toolu_w", "File created successfully at: /m.py")))
    engine.append(sid, messages=msgs)
    out = cascade(engine, sid, params())
    assert out.rendered.total <= out.rendered.budget.limit
    sent = out.rendered.request
    (write,) = [b for m in sent["messages"] for b in m["content"] if b.get("id") == "toolu_w"]
    assert len(write["input"]["content"]) < 1000 and write["input"]["file_path"] == "/m.py"
    assert "File created successfully" in str(result_blocks(sent)["toolu_w"]["content"])
    (event,) = [e for e in out.events if e.applied and "newest step" in e.reason]
    assert event.tier == "microcompact"
    node = next(n for n in engine.session(sid).graph.nodes.values() if n.tool_use_id == "toolu_w")
    assert node.input["content"] == big  # the original is kept


def test_a_warm_clear_waits_for_the_change_the_window_forces_when_that_is_near(
    engine: Engine,
) -> None:
    """The clear that pays at 200K (the test above) saves reads only until the window forces a
    change — which clears these results anyway. With the threshold a request away, that is no
    saving: it waits, and the reason says for what; the cache is not re-written twice."""
    sid = sized_session(engine, [600] * 40 + [30] * 10)
    window = 130_000  # limit 110,000, threshold 99,000: 142 tokens above the request
    out = cascade(engine, sid, params(window))
    (event,) = out.events
    assert not event.applied and event.reason.startswith("deferred")
    assert "it fires with the change the window forces (in about 0 requests)" in event.reason
    assert records(engine, sid, "clear") == []
    # one request's growth later the window forces it, and the clear comes with that change
    add_call(engine, sid, 51, ("Read", filler("r51", 400)))
    out = cascade(engine, sid, params(window))
    applied = [e for e in out.events if e.applied]
    assert applied and applied[0].tier == "microcompact"
    assert applied[0].details["trigger"] == "count" and applied[0].tokens_before > 99_000
