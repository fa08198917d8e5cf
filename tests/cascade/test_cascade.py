"""The cascade as a whole: cheapest tier first, advancing only while over the threshold; every
applied tier leaves a record and an event; a render after a cascade is the cascade's request;
"cannot fit" and failures write nothing; no loop; and the prompt-cache rules (an append keeps
the previous request a prefix, a clear or snip at p keeps every byte before p)."""

from __future__ import annotations

import itertools
from typing import Any

import orjson
import pytest
from compactd.context.engine import Engine, RenderParams
from compactd.context.errors import CannotFit
from compactd.context.policy import CLEARED_PLACEHOLDER
from compactd.context.summarizer.driver import digest_answer
from compactd.context.summarizer.types import SummaryFailure, SummaryNeeded, SummaryResult

from tests.cascade.helpers import (
    LIMIT,
    TARGET,
    THRESHOLD,
    Recorder,
    assistant,
    cascade,
    check_no_split_turn,
    check_wire,
    common_prefix,
    covered_use_ids,
    exchange,
    filler,
    log_bytes,
    messages_bytes,
    open_session,
    params,
    record_by_id,
    records,
    result_blocks,
    results,
    texts,
    tool_result,
    tool_use,
    user,
)
from tests.support.invariants import server_view, strip_cache_control

ORDER = ["reactive", "microcompact", "snip", "collapse", "summary"]
RECORD_OF = {
    "reactive": "reactive",
    "microcompact": "clear",
    "snip": "snip",
    "collapse": "collapse",
    "summary": "summary",
}


def read(tag: str, words: int = 360) -> tuple[str, str]:
    return ("Read", filler(tag, words))


def only_results(engine: Engine, config: dict[str, Any] | None = None) -> str:
    """Fifteen turns whose bulk is old Read results: a clear is enough."""
    sid = open_session(engine, {"summaryProvider": "digest", **(config or {})})
    for t in range(15):
        engine.append(sid, messages=exchange(f"t{t}", [read(f"r{t}")]))
    return sid


def results_and_talk(engine: Engine) -> str:
    """Twelve turns of long requests and big results: a clear is not enough, a snip is."""
    sid = open_session(engine, {"summaryProvider": "digest"})
    for t in range(12):
        engine.append(
            sid,
            messages=exchange(f"t{t}", [read(f"r{t}")], ask=f"ask {t}: " + filler(f"a{t}", 300)),
        )
    return sid


def explained_turn(
    tag: str, ask: str, words: int, reads: int, read_words: int = 100
) -> list[dict[str, Any]]:
    """A complete turn whose bulk is the assistant's own explanation, with a few reads."""
    msgs = [user(ask), assistant(filler(f"{tag}x", words))]
    for k in range(reads):
        use_id = f"toolu_{tag}_{k}"
        msgs.append(assistant(f"read {k}", tool_use(use_id, "Read")))
        msgs.append(results(tool_result(use_id, filler(f"{tag}r{k}", read_words))))
    msgs.append(assistant(f"done {tag}"))
    return msgs


def few_big_turns(engine: Engine, config: dict[str, Any] | None = None) -> str:
    """A big task turn, a middle turn, a big latest complete turn and the active turn: a
    clear and a snip free too little, so the rolling summary has to act."""
    sid = open_session(engine, {"summaryProvider": "digest", **(config or {})})
    engine.append(sid, messages=explained_turn("t0", "the task: port the parser", 2400, 6))
    engine.append(sid, messages=exchange("t1", [read("r1")]))
    engine.append(sid, messages=explained_turn("t2", "then: the tests", 2100, 2))
    engine.append(
        sid,
        messages=[
            user("now: finish it"),
            assistant("finishing", tool_use("toolu_act", "Read")),
            results(tool_result("toolu_act", filler("act", 200))),
        ],
    )
    return sid


SCENARIOS = {
    "clear": (only_results, ["microcompact"]),
    "clear+snip": (results_and_talk, ["microcompact", "snip"]),
    # a snip of the same run is withdrawn so the summary sees those turns whole; the turns it
    # must keep are 53 % of the limit, so the target here is 60 %
    "snip+summary": (
        lambda engine: few_big_turns(engine, {"cascadeTarget": 0.6}),
        ["microcompact", "summary"],
    ),
}
TARGETS = {"snip+summary": int(0.6 * LIMIT)}


@pytest.mark.parametrize("name", list(SCENARIOS))
def test_cheapest_first_and_only_while_over(engine: Engine, name: str) -> None:
    build, tiers = SCENARIOS[name]
    sid = build(engine)
    p = params()
    before = engine.render(sid, p)
    assert before.total > THRESHOLD
    recorder = Recorder()
    out = cascade(engine, sid, p, answer=recorder)
    check_wire(out.rendered)
    applied = [e for e in out.events if e.applied]
    assert [e.tier for e in applied] == tiers
    target = TARGETS.get(name, TARGET)
    assert out.rendered.total <= target
    # each tier starts where the previous left off, and only because that was still over the
    # target (once over the threshold, the tiers free down to the target: headroom)
    assert applied[0].tokens_before == before.total
    for prev, nxt in itertools.pairwise(applied):
        assert prev.tokens_after == nxt.tokens_before > target
        assert ORDER.index(prev.tier) < ORDER.index(nxt.tier)
    for event in applied:
        assert event.tokens_after < event.tokens_before
    assert applied[-1].tokens_after == out.rendered.total
    assert (len(recorder.needs) > 0) == ("summary" in tiers)
    check_no_split_turn(engine, sid, out.rendered)


@pytest.mark.parametrize("name", list(SCENARIOS))
def test_every_change_has_its_record_and_event_and_nothing_changes_silently(
    engine: Engine, name: str
) -> None:
    sid = SCENARIOS[name][0](engine)
    p = params()
    out = cascade(engine, sid, p)
    written = records(engine, sid)
    applied = [e for e in out.events if e.applied]
    assert sorted(r.id for r in written) == sorted(i for e in applied for i in e.record_ids)
    assert out.record_ids == [r.id for r in written]
    for event in applied:
        (rid,) = event.record_ids
        assert record_by_id(engine, sid, rid).kind == RECORD_OF[event.tier]
        assert isinstance(event.reason, str) and event.reason
        assert isinstance(event.details, dict) and event.tokens_before >= 0
    # a render after the cascade is the cascade's request, byte for byte
    again = engine.render(sid, p)
    assert orjson.dumps(again.request) == orjson.dumps(out.rendered.request)
    assert again.total == out.rendered.total
    # and a second cascade has nothing left to do
    log = log_bytes(engine, sid)
    second = cascade(engine, sid, p, answer=lambda need: pytest.fail("asked again"))
    assert not any(e.applied for e in second.events)
    assert orjson.dumps(second.rendered.request) == orjson.dumps(out.rendered.request)
    assert log_bytes(engine, sid) == log


def test_cannot_fit_writes_nothing_though_tiers_had_acted(engine: Engine) -> None:
    sid = few_big_turns(engine)
    engine.append(sid, messages=[assistant("done"), user("last: " + filler("huge", 8500))])
    recorder = Recorder()
    log = log_bytes(engine, sid)
    with pytest.raises(CannotFit) as caught:
        cascade(engine, sid, params(), answer=recorder)
    assert len(recorder.needs) >= 1  # the summary was generated, then found not to be enough
    tiers = {e.tier for e in caught.value.data["events"] if e.applied}
    assert "summary" in tiers  # (the snip this run drafted was withdrawn for the summary)
    assert caught.value.data["limit"] == LIMIT
    assert log_bytes(engine, sid) == log
    assert records(engine, sid) == []


def always(kind: str) -> Recorder:
    return Recorder(lambda need: SummaryFailure(kind, f"scripted {kind}"))


def events_of(engine: Engine, sid: str, recorder: Recorder) -> list[dict[str, Any]]:
    """The cascade's events, whether it ended fitting or in "cannot fit"."""
    try:
        return cascade(engine, sid, params(), answer=recorder).events
    except CannotFit as cannot:
        return cannot.data["events"]


@pytest.mark.parametrize("kind", ["prompt_too_long", "too_large", "overloaded", "timeout"])
def test_a_failing_provider_is_asked_a_bounded_number_of_times(engine: Engine, kind: str) -> None:
    sid = few_big_turns(engine)
    recorder = always(kind)
    events = events_of(engine, sid, recorder)
    assert 1 <= len(recorder.needs) <= engine.policy(engine.session(sid)).summary_max_calls
    sizes = [n.request.input_tokens_estimate for n in recorder.needs]
    if kind in ("prompt_too_long", "too_large"):
        assert len(sizes) >= 2 and sizes[1] < sizes[0]  # retried, with a smaller prompt
    else:
        assert len(sizes) == 1  # nothing to retry with
    failed = [e for e in events if e.tier == "summary"]
    assert len(failed) == 1 and not failed[0].applied
    assert "nothing was written" in failed[0].reason
    assert records(engine, sid, "summary") == []


def test_a_summary_over_its_call_bound_fails_before_the_first_call(engine: Engine) -> None:
    """A range that needs more chunks than `summaryMaxCalls` cannot be summarized: said at
    once, with the figures, and no provider call is paid for in vain."""
    sid = few_big_turns(engine)
    engine.session(sid).update_config(
        {"summaryInputMaxTokens": 2000, "summaryMaxCalls": 2, "evidenceEnabled": False}
    )
    recorder = Recorder(digest_answer)
    events = events_of(engine, sid, recorder)
    assert [n.tier for n in recorder.needs if n.tier == "rolling"] == []
    (failed,) = [e for e in events if e.tier == "summary"]
    assert failed.details["failure"] == "call_limit" and not failed.applied
    assert "more than summaryMaxCalls (2); the provider was not called" in failed.reason
    assert records(engine, sid, "summary") == []


def test_a_summary_without_gain_is_tried_once(engine: Engine) -> None:
    sid = few_big_turns(engine)
    recorder = Recorder(lambda need: SummaryResult(text=filler("long", 9000), model="m"))
    events = events_of(engine, sid, recorder)
    assert len(recorder.needs) == 1
    (note,) = [e for e in events if e.tier == "summary"]
    assert not note.applied and note.reason.startswith("no gain")
    assert records(engine, sid, "summary") == []


def test_collapse_and_summary_failing_together_stay_bounded(engine: Engine) -> None:
    sid = open_session(engine, {"summaryProvider": "digest", "snipEnabled": False})
    for t in range(14):  # the bulk is the answers: a summary could free it, had it worked
        engine.append(
            sid, messages=exchange(f"t{t}", [], ask=f"ask {t}", answer=filler(f"a{t}", 500))
        )
    recorder = always("overloaded")
    with pytest.raises(CannotFit):
        cascade(engine, sid, params(), answer=recorder)
    assert [n.tier for n in recorder.needs] == ["collapse", "rolling"]
    assert records(engine, sid) == []


# ---- the prompt cache --------------------------------------------------------------------------


def stripped_messages(request: dict[str, Any]) -> bytes:
    return messages_bytes(request)[:-1]  # without the closing bracket


@pytest.mark.parametrize("mode", ["cache", "time"])
def test_appending_keeps_the_previous_request_a_byte_prefix(engine: Engine, mode: str) -> None:
    """An agent loop through the count trigger: each request extends the previous one, unless a
    clear fired — and then every byte before the first cleared result is unchanged. Judged on
    what the provider caches: on the server path, the request after the provider's clear (the
    messages sent never change at all)."""
    sid = open_session(engine, {"summaryProvider": "digest", "microcompactMode": mode})
    engine.append(sid, messages=[user("explore the repository")])
    p = params(200_000)
    sent_before = cascade(engine, sid, p).rendered.request
    previous = server_view(sent_before)
    appends = clears = 0
    for k in range(80):
        use_id = f"toolu_{k:03d}"
        engine.append(
            sid,
            messages=[
                assistant(f"step {k}", tool_use(use_id, "Read")),
                results(tool_result(use_id, filler(f"f{k}", 80 if k % 3 else 600))),
            ],
        )
        if k % 10 == 9:
            engine.append(sid, messages=[assistant(f"checkpoint {k}"), user(f"continue {k}")])
        out = cascade(engine, sid, p)
        applied = [e for e in out.events if e.applied]
        sent = out.rendered.request
        current = server_view(sent)
        if mode == "cache":
            assert stripped_messages(sent).startswith(stripped_messages(sent_before)), k
        sent_before = sent
        if not applied:
            appends += 1
            assert stripped_messages(current).startswith(stripped_messages(previous)), k
        else:
            clears += 1
            assert [e.tier for e in applied] == ["microcompact"]
            cleared = [
                u
                for u, b in result_blocks(current).items()
                if b["content"] == CLEARED_PLACEHOLDER
                and result_blocks(previous).get(u, {}).get("content") != CLEARED_PLACEHOLDER
            ]
            first = min(offset_of(previous, result_blocks(previous)[u]) for u in cleared)
            assert common_prefix(messages_bytes(previous), messages_bytes(current)) >= first
        previous = current
    assert appends >= 70 and clears >= 1


def offset_of(request: dict[str, Any], block: dict[str, Any]) -> int:
    data = messages_bytes(request)
    at = data.find(orjson.dumps(block))
    assert at >= 0
    return at


@pytest.mark.parametrize("mode", ["cache", "time"])
def test_a_clear_at_p_keeps_every_byte_before_p(engine: Engine, mode: str) -> None:
    sid = only_results(engine, {"microcompactMode": mode})
    p = params()
    before = server_view(engine.render(sid, p).request)
    out = cascade(engine, sid, p)
    (clear,) = records(engine, sid, "clear")
    after = server_view(out.rendered.request)
    cleared = [u for u, b in result_blocks(after).items() if b["content"] == CLEARED_PLACEHOLDER]
    assert set(cleared) == covered_use_ids(engine, sid, clear)
    old_blocks = result_blocks(before)
    first = min(offset_of(before, old_blocks[u]) for u in cleared)
    assert common_prefix(messages_bytes(before), messages_bytes(after)) >= first
    # and what comes after the cleared results is the same, in the same order
    assert [u for u in result_blocks(after)] == [u for u in old_blocks]
    assert texts(after) == texts(before)


def test_the_breakpoints_move_but_the_bytes_they_mark_do_not(engine: Engine) -> None:
    """cache_control markers travel with the tail; without them the requests are prefixes."""
    sid = only_results(engine)
    p = params(200_000)
    first = engine.render(sid, p).request
    engine.append(sid, messages=exchange("more", [read("more")]))
    second = engine.render(sid, p).request
    assert orjson.dumps(first) != orjson.dumps(second)
    assert stripped_messages(second).startswith(stripped_messages(first))
    assert (
        strip_cache_control(second)["messages"][: len(first["messages"])]
        == (strip_cache_control(first)["messages"])
    )


def test_a_render_of_another_window_does_not_write(engine: Engine) -> None:
    """Rendering (without the cascade) never writes, whatever the window."""
    sid = results_and_talk(engine)
    log = log_bytes(engine, sid)
    for window in (16_000, 32_000, 200_000):
        rendered = engine.render(sid, RenderParams(spec=params(window).spec))
        check_wire(rendered)
    assert log_bytes(engine, sid) == log


def test_digest_answers_are_deterministic(engine: Engine) -> None:
    """The offline provider gives the same checkpoint for the same input (replays rely on it)."""
    first, second = Recorder(), Recorder()
    a = few_big_turns(engine)
    b = few_big_turns(engine)
    out_a = cascade(engine, a, params(), answer=first)
    out_b = cascade(engine, b, params(), answer=second)
    texts_a = [digest_answer(n) for n in first.needs]
    texts_b = [digest_answer(n) for n in second.needs]
    assert texts_a == texts_b
    summary_a = next(r for r in records(engine, a, "summary"))
    summary_b = next(r for r in records(engine, b, "summary"))
    assert summary_a.data["text"] == summary_b.data["text"]
    assert out_a.rendered.total == out_b.rendered.total


def test_needs_carry_what_the_summarizer_is_given(engine: Engine) -> None:
    sid = few_big_turns(engine)
    recorder = Recorder()
    cascade(engine, sid, params(), answer=recorder)
    (need,) = recorder.needs
    assert isinstance(need, SummaryNeeded)
    assert need.tier == "rolling"
    assert need.request.purpose == "rolling"
    assert need.request.prompt.startswith("USER: the task: ")
    assert need.request.input_hash
    # summaryMaxTokens (5,000), but never more than a twentieth of what the request may hold,
    # and never less than the spec's 2,000 (a fifth of a limit that small)
    assert need.request.max_output_tokens == max(min(2000, LIMIT // 5), min(5000, LIMIT // 20))


def test_a_summary_that_would_free_too_little_is_not_asked_for(engine: Engine) -> None:
    """Over its threshold but inside its limit, with old turns whose summary would free
    under `summaryMinGain` of the limit (by the marker's bound): the provider is not called
    at all — a call and a cache rewrite for that little would be the next compaction a few
    requests away — and the cascade says so. With the bar lower, the same range is taken."""
    config = {"summaryProvider": "digest", "snipEnabled": False, "collapseEnabled": False}

    def build(min_gain: float) -> str:
        sid = open_session(engine, {**config, "summaryMinGain": min_gain})
        for t in range(3):
            engine.append(sid, messages=exchange(f"s{t}", [], ask=f"small ask {t}"))
        engine.append(
            sid, messages=explained_turn("big", "the big one: " + filler("b", 4000), 3000, 0)
        )
        engine.append(sid, messages=[user("and now: " + filler("now", 1000))])
        before = engine.render(sid, params()).total
        assert THRESHOLD < before <= LIMIT
        return sid

    sid = build(0.5)  # half the limit: more than any range here frees
    recorder = Recorder()
    events = events_of(engine, sid, recorder)
    assert recorder.needs == []
    (note,) = [e for e in events if e.tier == "summary"]
    assert not note.applied and note.reason.startswith("not worth a call")
    assert "the provider was not called" in note.reason
    assert records(engine, sid, "summary") == []

    sid = build(0.05)
    recorder = Recorder()
    events_of(engine, sid, recorder)
    assert len(recorder.needs) == 1 and records(engine, sid, "summary")


@pytest.mark.parametrize(
    ("config", "summarized"),
    [
        ({}, False),  # Anthropic, Tier 1 server-side: the provider holds the cache
        ({"microcompactMode": "time"}, True),  # compactd's own placeholders: headroom
        ({"summaryWhen": "pressed"}, True),
        ({"microcompactMode": "time", "summaryWhen": "threshold"}, False),
    ],
)
def test_the_llm_tiers_bar_follows_the_providers_cache(
    engine: Engine, config: dict[str, Any], summarized: bool
) -> None:
    """Tier 1 gets the request well under its threshold but not under its target. Where the
    provider holds the cache (`summaryWhen: auto` on Tier 1's server path) that is where the
    cascade stops — a summary would buy headroom the cache already makes cheap; elsewhere the
    summary frees down to the target."""
    sid = open_session(
        engine,
        {"summaryProvider": "digest", "snipEnabled": False, "collapseEnabled": False, **config},
    )
    for t in range(3):
        engine.append(sid, messages=explained_turn(f"t{t}", f"ask {t}", 700, 8))
    engine.append(sid, messages=[user("now: finish")])
    recorder = Recorder()
    out = cascade(engine, sid, params(), answer=recorder)
    applied = [e for e in out.events if e.applied]
    assert applied[0].tier == "microcompact"
    assert TARGET < applied[0].tokens_after <= THRESHOLD
    assert ("summary" in [e.tier for e in applied]) is summarized
    assert bool(recorder.needs) is summarized
    assert out.rendered.total <= (TARGET if summarized else THRESHOLD)


@pytest.mark.parametrize("turns", [3, 4])
def test_a_clear_that_buys_little_runway_brings_the_summary_into_the_same_run(
    engine: Engine, turns: int
) -> None:
    """On the server path, over the threshold: Tier 1's clear moves the cached prefix (the
    provider re-writes what follows it). Three turns: it leaves the request about eight
    requests' growth under the threshold, and the cascade stops there. Four: it leaves it a
    few requests from the threshold — the next forced change, and the next rewrite, would be
    that close — so the summary runs in the same cascade, one rewrite for both, and the
    request goes down to the target."""
    sid = open_session(
        engine, {"summaryProvider": "digest", "snipEnabled": False, "collapseEnabled": False}
    )
    for t in range(turns):
        engine.append(sid, messages=explained_turn(f"t{t}", f"ask {t}", 700, 8))
    engine.append(sid, messages=[user("now: finish")])
    recorder = Recorder()
    out = cascade(engine, sid, params(), answer=recorder)
    applied = [e for e in out.events if e.applied]
    assert applied[0].tier == "microcompact" and applied[0].tokens_before > THRESHOLD
    left = THRESHOLD - applied[0].tokens_after
    assert (left < 5_000) is (turns == 4)
    assert [e.tier for e in applied] == (
        ["microcompact", "summary"] if turns == 4 else ["microcompact"]
    )
    assert bool(recorder.needs) is (turns == 4)
    assert out.rendered.total <= (TARGET if turns == 4 else THRESHOLD)
    assert len(records(engine, sid, "clear")) == 1  # one cascade, one commit


@pytest.mark.parametrize("explained", [200, 1_500])
def test_a_warm_clear_brings_the_summary_along_when_the_summary_pays(
    engine: Engine, explained: int
) -> None:
    """At a large window, under the threshold and even the target: the count trigger's clear
    pays for its rewrite, and the turns before the retained ones are mostly the assistant's
    own text, which no clear frees. Every later request would read that text again; the
    summary that replaces it runs in the same run, one rewrite for both. Turns of little
    text are not worth a call: the clear goes alone."""
    sid = open_session(engine, {"summaryProvider": "digest", "snipEnabled": False})
    for t in range(5):
        engine.append(sid, messages=explained_turn(f"t{t}", f"ask t{t}", explained, 10, 150))
    engine.append(sid, messages=[user("now: finish")])
    p = params(200_000)  # limit 192,000: threshold 172,800, target 96,000
    start = engine.render(sid, p).total
    assert start < 96_000
    recorder = Recorder()
    out = cascade(engine, sid, p, answer=recorder)
    applied = [e for e in out.events if e.applied]
    assert applied[0].tier == "microcompact" and applied[0].details["trigger"] == "count"
    summarized = explained > 1_000
    assert [e.tier for e in applied] == (
        ["microcompact", "summary"] if summarized else ["microcompact"]
    )
    assert bool(recorder.needs) is summarized
    assert len(records(engine, sid, "summary")) == int(summarized)
    if summarized:
        assert applied[1].reason.startswith("the change this run made re-writes")
        assert out.rendered.total < applied[0].tokens_after / 2
    assert len(records(engine, sid, "clear")) == 1  # one cascade, one commit
