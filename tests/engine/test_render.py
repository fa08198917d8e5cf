"""Rendering rules: Budget Reduction, pending calls and orphans, cache breakpoints."""

from __future__ import annotations

from typing import Any

import pytest
from compactd.context.budget_reduction import middle_truncate
from compactd.context.engine import Engine
from compactd.context.errors import PendingToolResults
from compactd.context.policy import NO_RESULT_PLACEHOLDER

from tests.engine.helpers import (
    FORMATS,
    assistant,
    call,
    log_bytes,
    new_session,
    render,
    result,
    results,
    tool_messages,
    tool_results,
    user,
)


def _pattern(n: int, seed: str = "") -> str:
    """Text whose every position is recognizable, so a wrong cut cannot pass."""
    return "".join(f"{seed}{i:06d}|" for i in range(n // 7 + 1))[:n]


# ---- Budget Reduction ------------------------------------------------------------------------


def test_middle_truncate_exact_shape() -> None:
    text = _pattern(5000)
    out = middle_truncate(text)
    marker = "\n\n[… 1,000 characters truncated by compactd …]\n\n"
    assert out == text[:2400] + marker + text[-1600:]
    assert middle_truncate(text[:4000]) == text[:4000]
    # a cut that would not make the result shorter is not made: its note takes the room
    assert middle_truncate(text[:4001]) == text[:4001]
    assert middle_truncate(text[:4200]) == text[:4200]  # up to the room a note may take
    cut = middle_truncate(text[:4201])
    assert cut.startswith(text[:2400]) and cut.endswith(text[4201 - 1600 : 4201])
    assert "201 characters truncated" in cut and len(cut) < 4201


@pytest.mark.parametrize("fmt", FORMATS)
def test_big_result_is_truncated_ids_and_error_kept(engine: Engine, fmt: str) -> None:
    sid = new_session(engine, "big")
    big, big_err = _pattern(5000, "a"), _pattern(5000, "e")
    long_user, long_assistant = _pattern(10_000, "u"), _pattern(10_000, "s")
    engine.append(
        sid,
        messages=[
            user(long_user),
            assistant(long_assistant, call("b1"), call("b2"), call("small")),
            results(result("b1", big), result("b2", big_err, is_error=True), result("small", "x")),
            assistant("ok"),
        ],
    )
    req = render(engine, sid, fmt).request
    expected = big[:2400] + "\n\n[… 1,000 characters truncated by compactd …]\n\n" + big[-1600:]
    expected_err = middle_truncate(big_err)
    if fmt == "anthropic":
        res = tool_results(req)
        assert res["b1"] == {"type": "tool_result", "tool_use_id": "b1", "content": expected}
        assert res["b2"] == {
            "type": "tool_result",
            "tool_use_id": "b2",
            "content": expected_err,
            "is_error": True,
        }
        assert res["small"]["content"] == "x"
        assert req["messages"][0]["content"][0]["text"] == long_user
        assert req["messages"][1]["content"][0]["text"] == long_assistant
    else:
        assert tool_messages(req) == {"b1": expected, "b2": expected_err, "small": "x"}
        assert req["messages"][0]["content"] == long_user
        assert req["messages"][1]["content"] == long_assistant
    # the graph keeps the original
    tool = engine.session(sid).graph.tool_by_use_id("b1")
    assert tool is not None and tool.result == big


@pytest.mark.parametrize("fmt", FORMATS)
def test_a_block_list_result_is_cut_as_a_whole(engine: Engine, fmt: str) -> None:
    """The limit applies to the result's text end to end: the last 1,600 characters are the
    short tail block and the end of the big one."""
    sid = new_session(engine, "blocks")
    big = _pattern(6000, "b")
    img = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "AA"}}
    content = [{"type": "text", "text": big}, img, {"type": "text", "text": "short tail"}]
    engine.append(
        sid,
        messages=[user("x"), assistant(call("k")), results(result("k", content)), assistant("y")],
    )
    req = render(engine, sid, fmt).request
    cut = big[:2400] + "\n\n[… 2,010 characters truncated by compactd …]\n\n" + big[-1590:]
    if fmt == "anthropic":
        assert tool_results(req)["k"]["content"] == [
            {"type": "text", "text": cut},
            img,
            {"type": "text", "text": "short tail"},
        ]
    else:
        assert tool_messages(req)["k"] == f"{cut}\n[image omitted]\nshort tail"


def test_budget_reduction_is_configurable_per_session(engine: Engine) -> None:
    sid = new_session(
        engine,
        "cfg",
        config={"maxToolResultChars": 100, "truncateHeadChars": 10, "truncateTailChars": 5},
    )
    text = _pattern(500)
    engine.append(sid, messages=[user("x"), assistant(call("k")), results(result("k", text))])
    got = tool_results(render(engine, sid).request)["k"]["content"]
    assert got == text[:10] + "\n\n[… 485 characters truncated by compactd …]\n\n" + text[-5:]


# ---- pending calls and orphans -------------------------------------------------------------


def test_render_with_pending_calls_names_them(engine: Engine) -> None:
    sid = new_session(engine, "pend")
    engine.append(sid, messages=[user("x"), assistant(call("p1"), call("p2"), call("p3"))])
    engine.session(sid).tool_result("p2", "done")
    for fmt in FORMATS:
        with pytest.raises(PendingToolResults) as err:
            render(engine, sid, fmt)
        assert err.value.data["pendingToolUseIds"] == ["p1", "p3"]
        assert "p1" in str(err.value) and "p3" in str(err.value)
        assert "p2" not in str(err.value)
    engine.append(sid, messages=[results(result("p1"), result("p3"))])
    for fmt in FORMATS:
        render(engine, sid, fmt)


def test_thread_cannot_move_on_while_calls_are_pending(engine: Engine) -> None:
    sid = new_session(engine, "stuck")
    engine.append(sid, messages=[user("x"), assistant(call("p1"), call("p2"))])
    before = log_bytes(engine, sid)
    for msgs in ([user("next")], [assistant("more")], [results(result("p1")), user("next")]):
        with pytest.raises(PendingToolResults) as err:
            engine.append(sid, messages=msgs)
        assert err.value.data["pendingToolUseIds"] in (["p1", "p2"], ["p2"])
        assert log_bytes(engine, sid) == before
    # pending calls of the same append are checked too
    with pytest.raises(PendingToolResults, match="q1"):
        engine.append(
            sid,
            messages=[
                results(result("p1"), result("p2")),
                assistant(call("q1")),
                user("too early"),
            ],
        )
    assert log_bytes(engine, sid) == before


@pytest.mark.parametrize("fmt", FORMATS)
def test_orphans_allowed_for_imports_render_no_result(engine: Engine, fmt: str) -> None:
    sid = new_session(engine, "orph")
    engine.append(sid, messages=[user("x"), assistant(call("o1"), call("o2"))])
    engine.session(sid).tool_result("o2", "got it")
    engine.append(sid, messages=[user("moving on")], allow_orphans=True)
    req = render(engine, sid, fmt).request
    if fmt == "anthropic":
        res = tool_results(req)
        assert res["o1"] == {
            "type": "tool_result",
            "tool_use_id": "o1",
            "content": NO_RESULT_PLACEHOLDER,
            "is_error": True,
        }
        assert res["o2"] == {"type": "tool_result", "tool_use_id": "o2", "content": "got it"}
    else:
        assert tool_messages(req) == {"o1": NO_RESULT_PLACEHOLDER, "o2": "got it"}
    # deterministic: the same bytes every time
    assert render(engine, sid, fmt).request == req


def test_pending_inside_a_function_thread(engine: Engine) -> None:
    sid = new_session(engine, "fpend")
    engine.append(sid, messages=[user("x"), assistant(call("task", "Task"))])
    s = engine.session(sid)
    fid = s.function_start("Task", {"prompt": "p"}, tool_use_id="task")
    engine.append(sid, messages=[user("sub"), assistant(call("in1"))], function=fid)
    render(engine, sid)  # the top level does not wait on the function's internals
    with pytest.raises(PendingToolResults, match="in1"):
        render(engine, sid, viewer=fid)
    with pytest.raises(PendingToolResults, match="task"):
        engine.append(sid, messages=[user("next")])


# ---- cache breakpoints -----------------------------------------------------------------------


def _marked(req: dict[str, Any]) -> list[int]:
    return [
        i
        for i, m in enumerate(req["messages"])
        if any("cache_control" in b for b in m["content"] if isinstance(b, dict))
    ]


def test_breakpoint_positions(engine: Engine) -> None:
    sid = new_session(engine, "bp")
    for k in range(5):
        engine.append(sid, messages=[user(f"u{k}"), assistant(f"a{k}")])
    n = 10
    req = render(engine, sid, system="sys", tools=[{"name": "t", "input_schema": {}}]).request
    assert req["system"][-1]["cache_control"] == {"type": "ephemeral"}
    assert "cache_control" not in req["tools"][-1]
    assert _marked(req) == [n - 5, n - 3, n - 1]
    # without a system prompt the tools carry the first breakpoint
    req = render(engine, sid, tools=[{"name": "t", "input_schema": {}}]).request
    assert req["tools"][-1]["cache_control"] == {"type": "ephemeral"}
    assert _marked(req) == [n - 5, n - 3, n - 1]
    # ttl, and no breakpoints at all when caching is off
    req = render(engine, sid, system="s", cache_ttl="1h").request
    assert req["system"][-1]["cache_control"] == {"type": "ephemeral", "ttl": "1h"}
    req = render(engine, sid, system="s", cache=False).request
    assert "cache_control" not in str(req)


def test_breakpoint_on_the_summary_marker(engine: Engine) -> None:
    sid = new_session(engine, "bps")
    for k in range(6):
        engine.append(sid, messages=[user(f"u{k}"), assistant(f"a{k}")])
    s = engine.session(sid)
    g = s.graph
    first_two = g.branch_path().ids[:4]
    s.add_records(
        [
            {
                "kind": "summary",
                "covers": first_two,
                "data": {"text": "they said hi", "turns": [first_two[0], first_two[2]]},
            }
        ]
    )
    req = render(engine, sid, system="sys").request
    assert (
        "summary of the earlier conversation (2 turns" in req["messages"][0]["content"][0]["text"]
    )
    n = len(req["messages"])
    assert _marked(req) == sorted({0, n - 3, n - 1})


def test_breakpoints_skip_thinking_blocks(engine: Engine) -> None:
    sid = new_session(engine, "bpt")
    think = {"type": "thinking", "thinking": "t", "signature": "s"}
    engine.append(sid, messages=[user("u"), assistant("text first", think)])
    req = render(engine, sid).request
    last = req["messages"][-1]["content"]
    assert last[1] == think
    assert last[0]["cache_control"] == {"type": "ephemeral"}
