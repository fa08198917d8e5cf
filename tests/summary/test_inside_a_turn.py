"""Tier 4 inside a turn: one user request, hundreds of tool calls. When the retained turns alone
do not fit, the rolling summary replaces the earlier part of a turn — at an assistant-message
boundary, never between a call and its result, never through a running function — keeping the
turn's request verbatim before the marker and its newest exchanges after it, and the summary's
input holds every result it replaces."""

from __future__ import annotations

import json
from typing import Any

import pytest
from compactd.context.engine import Engine, RenderParams
from compactd.context.errors import CannotFit
from compactd.context.policy import RUNNING_FUNCTION_PLACEHOLDER
from compactd.context.visibility import ViewOptions

from tests.cascade.helpers import (
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
    result_blocks,
    results,
    texts,
    tool_result,
    tool_use,
    use_ids,
    user,
)

TOOL = "mcp__repo__inspect"  # not compactable: Tier 1 cannot help, the summary must
REQUEST = "Refactor the storage layer: read every module, then rewrite them one by one."
# results whole (no Budget Reduction), so sizes are what the scenario says
CONFIG = {"summaryProvider": "digest", "maxToolResultChars": 10**9}


def calls(tag: str, n: int, words: int = 120, start: int = 0) -> list[dict[str, Any]]:
    """`n` assistant messages of one call each, every call answered."""
    out: list[dict[str, Any]] = []
    for k in range(start, start + n):
        use_id = f"toolu_{tag}{k}"
        out.append(assistant(f"step {tag}{k}", tool_use(use_id, TOOL, path=f"src/m{k}.py")))
        out.append(results(tool_result(use_id, filler(f"{tag}{k}", words))))
    return out


def first_text(request: dict[str, Any]) -> str:
    return texts(request)[0]


def marker_of(request: dict[str, Any]) -> str:
    return next(t for t in texts(request) if t.startswith("[compactd: summary"))


def test_a_turn_of_300_tool_calls_is_summarized_from_inside_and_goes_on(engine: Engine) -> None:
    sid = open_session(engine, CONFIG)
    engine.append(sid, messages=[user(REQUEST), *calls("a", 300)])
    recorder = Recorder()
    out = cascade(engine, sid, params(), answer=recorder)
    check_wire(out.rendered)
    request = out.rendered.request
    assert out.rendered.total <= out.rendered.budget.limit
    (summary,) = records(engine, sid, "summary")
    path = engine.session(sid).graph.branch_path()
    assert summary.data["turns"] == [] and summary.data["partialTurn"] == path.ids[0]
    # the request stays first, verbatim; the marker right after it; the newest steps last
    assert first_text(request) == REQUEST
    assert texts(request)[1].startswith("[compactd: summary of the work so far")
    shown = use_ids(request)
    assert shown == [f"toolu_a{k}" for k in range(300 - len(shown), 300)]
    assert len(shown) >= 5
    check_no_split_turn(engine, sid, out.rendered)
    # the summary's input held every result it replaced, and its covers are exactly them
    prompt = "\n".join(n.request.prompt for n in recorder.needs)
    replaced = 300 - len(shown)
    for k in range(replaced):
        assert f"[a{k}] a{k}w0" in prompt, k
    g = engine.session(sid).graph
    covered = {g.nodes[c].tool_use_id for c in summary.covers if g.nodes[c].kind == "tool"}
    assert covered == {f"toolu_a{k}" for k in range(replaced)}
    # it freed down to the target, not just under the threshold
    assert out.rendered.total <= 0.6 * out.rendered.budget.limit

    # the agent goes on: the next summary folds this one in and replaces only new steps
    engine.append(sid, messages=calls("a", 60, start=300))
    again = Recorder()
    out2 = cascade(engine, sid, params(), answer=again)
    check_wire(out2.rendered)
    newer = records(engine, sid, "summary")[-1]
    assert newer.id != summary.id and newer.data["prior"] == summary.id
    assert set(summary.covers) < set(newer.covers)
    assert first_text(out2.rendered.request) == REQUEST
    prompt2 = "\n".join(n.request.prompt for n in again.needs)
    assert "<previous_checkpoint>" in prompt2
    assert f"[a{replaced - 1}] " not in prompt2  # already in the previous checkpoint
    assert out2.rendered.total <= out2.rendered.budget.limit


def test_a_running_function_bounds_the_cut(engine: Engine) -> None:
    """A sub-agent that completed inside the turn goes into the summary like any call; one
    still running is never inside the replaced part: the cut stays before its message, and its
    call keeps its placeholder result."""
    sid = open_session(engine, CONFIG)
    engine.append(
        sid,
        messages=[
            user(REQUEST),
            *calls("b", 4, words=2500),
            assistant("delegating the survey", tool_use("toolu_done", "Task", prompt="survey")),
        ],
    )
    session = engine.session(sid)
    done = session.function_start("Task", {"prompt": "survey"}, tool_use_id="toolu_done")
    engine.append(sid, messages=[user("survey the modules"), assistant("surveyed")], function=done)
    session.function_complete(done, "the survey: six modules", "completed")
    engine.append(
        sid,
        messages=[
            *calls("c", 20, words=60),
            assistant("delegating the rewrite", tool_use("toolu_run", "Task", prompt="rewrite")),
        ],
    )
    running = session.function_start("Task", {"prompt": "rewrite"}, tool_use_id="toolu_run")
    engine.append(sid, messages=[user("rewrite m1"), assistant("working")], function=running)
    out = cascade(engine, sid, params())
    check_wire(out.rendered)
    (summary,) = records(engine, sid, "summary")
    path = session.graph.branch_path()
    last = path.ids[-1]
    assert path.index(summary.data["through"]) < path.index(last)
    assert running not in summary.covers and last not in summary.covers
    done_call = next(n.id for n in session.graph.nodes.values() if n.tool_use_id == "toolu_done")
    assert (done in summary.covers) == (done_call in summary.covers)  # a function with its call
    assert not set(session.graph.function_path(running).ids) & set(summary.covers)
    request = out.rendered.request
    assert use_ids(request)[-1] == "toolu_run"
    assert result_blocks(request)["toolu_run"]["content"] == RUNNING_FUNCTION_PLACEHOLDER
    assert "toolu_b0" not in use_ids(request)
    assert out.rendered.total <= out.rendered.budget.limit


def test_a_turn_whose_only_complete_message_is_the_first(engine: Engine) -> None:
    """The second assistant message waits on a running sub-agent: the only cut is after the
    first one, and the summary takes it and its big result."""
    sid = open_session(engine, CONFIG)
    engine.append(
        sid,
        messages=[
            user(REQUEST),
            assistant("reading everything", tool_use("toolu_big", TOOL)),
            results(tool_result("toolu_big", filler("big", 30_000))),
            assistant("delegating", tool_use("toolu_task", "Task", prompt="go")),
        ],
    )
    fid = engine.session(sid).function_start("Task", {"prompt": "go"}, tool_use_id="toolu_task")
    out = cascade(engine, sid, params())
    (summary,) = records(engine, sid, "summary")
    path = engine.session(sid).graph.branch_path()
    assert summary.data["through"] == path.ids[1]  # the first assistant message
    request = out.rendered.request
    assert first_text(request) == REQUEST
    assert use_ids(request) == ["toolu_task"]
    assert "toolu_big" not in result_blocks(request)
    assert fid not in summary.covers
    assert out.rendered.total <= out.rendered.budget.limit


def test_a_branch_forked_inside_the_summarized_part_renders_its_own_history(
    engine: Engine,
) -> None:
    sid = open_session(engine, CONFIG)
    engine.append(sid, messages=[user(REQUEST), *calls("d", 200)])
    cascade(engine, sid, params())
    (summary,) = records(engine, sid, "summary")
    session = engine.session(sid)
    path = session.graph.branch_path()
    through = path.index(summary.data["through"])
    inside = path.ids[through - 4]  # an assistant message the summary replaced
    assert session.graph.nodes[inside].kind == "assistant"
    session.create_branch("fork", inside)
    rendered = engine.render(sid, params(branch="fork"))
    assert "[compactd: summary" not in "".join(texts(rendered.request))
    assert rendered.projection.summary is None
    assert "toolu_d0" in use_ids(rendered.request)  # what main summarized, the fork shows
    # forked exactly at the cut: nothing would follow the marker, so it is not in force
    session.create_branch("at-cut", summary.data["through"])
    at_cut = engine.render(sid, params(branch="at-cut"))
    assert at_cut.projection.summary is None
    # forked after the cut: the summary holds there too
    after = path.ids[-1]
    session.create_branch("after", after)
    assert engine.render(sid, params(branch="after")).projection.summary is not None
    # the fork gets a summary of its own when it is over
    out = cascade(engine, sid, params(branch="fork"))
    fork_summary = records(engine, sid, "summary")[-1]
    assert fork_summary.id != summary.id
    assert out.rendered.projection.summary is not None
    assert out.rendered.projection.summary.id == fork_summary.id


def test_a_functions_own_thread_is_summarized_from_inside(engine: Engine) -> None:
    """A sub-agent's thread is one request and its tool loop: the same in-turn summary, on the
    function's thread, while the main thread is untouched."""
    sid = open_session(engine, CONFIG)
    engine.append(
        sid,
        messages=[
            user("Investigate the flaky test."),
            assistant("delegating", tool_use("toolu_agent", "Task", prompt="find it")),
        ],
    )
    session = engine.session(sid)
    fid = session.function_start("Task", {"prompt": "find it"}, tool_use_id="toolu_agent")
    engine.append(sid, messages=[user("Find why test_x is flaky."), *calls("f", 150)], function=fid)
    p = params()
    view = RenderParams(view=ViewOptions(viewer=fid), spec=p.spec)
    out = cascade(engine, sid, view)
    check_wire(out.rendered)
    (summary,) = records(engine, sid, "summary")
    assert summary.thread == fid
    assert first_text(out.rendered.request) == "Find why test_x is flaky."
    assert out.rendered.total <= out.rendered.budget.limit
    main = engine.render(sid, p)
    assert main.projection.summary is None
    assert first_text(main.request) == "Investigate the flaky test."


def test_what_cannot_fit_even_from_inside_writes_nothing(engine: Engine) -> None:
    """One huge step and nothing else: there is no cut (the latest assistant message always
    stays), so "cannot fit", naming why — and the log is untouched."""
    sid = open_session(engine, CONFIG)
    engine.append(
        sid,
        messages=[
            user(REQUEST),
            assistant("reading", tool_use("toolu_one", TOOL)),
            results(tool_result("toolu_one", filler("one", 40_000))),
        ],
    )
    log = log_bytes(engine, sid)
    with pytest.raises(CannotFit) as caught:
        cascade(engine, sid, params())
    assert "short history" in caught.value.message
    assert log_bytes(engine, sid) == log


def test_compact_on_one_long_turn_checkpoints_inside_it(engine: Engine) -> None:
    """`/compact` on a session that is one long agentic turn after a short one (~62K tokens at
    a 200K window: the cascade leaves it alone, and no whole turn lies before the retained
    two) replaces the turn's older steps with a checkpoint — the spec's rule, as the cascade
    applies it inside a turn: the request verbatim first, the latest step after the marker,
    every replaced result in the summary's input — and says what it kept."""
    sid = open_session(engine, CONFIG)
    engine.append(sid, messages=[user("what is in the repository?"), assistant("a storage layer")])
    engine.append(sid, messages=[user(REQUEST), *calls("c", 110, words=135)])
    before = engine.render(sid, params(200_000)).total
    assert 55_000 < before < 70_000, before
    automatic = cascade(engine, sid, params(200_000)).events
    assert not [e for e in automatic if e.applied]  # nothing for the cascade to do
    recorder = Recorder()
    out = cascade(engine, sid, params(200_000), answer=recorder, manual=True)
    [event] = [e for e in out.events if e.tier == "summary"]
    assert event.applied, event.reason
    assert event.details["kept"] == (
        "the request of the turn in progress and its newest 1 step(s); the range's 1 user "
        "request(s) verbatim in the marker"
    )
    assert event.reason.endswith("; kept " + event.details["kept"])
    assert event.reason.startswith("/compact: summarized 1 turn(s) and the first 109 step(s)")
    check_wire(out.rendered)
    request = out.rendered.request
    assert texts(request)[0] == REQUEST
    assert texts(request)[1].startswith("[compactd: summary of the work so far")
    assert "what is in the repository?" in texts(request)[1]  # quoted in the marker
    assert use_ids(request) == ["toolu_c109"]  # the latest step, with its result
    assert out.rendered.total < before / 4
    # what the summary model read: the request it forks (read from the cache), or the prompt
    prompt = "\n".join(
        json.dumps(n.request.fork.request) if n.request.fork else n.request.prompt
        for n in recorder.needs
    )
    assert "what is in the repository?" in prompt
    for k in range(109):
        assert f"[c{k}] c{k}w0" in prompt, k
