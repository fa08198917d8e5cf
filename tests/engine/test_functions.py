"""Functions (sub-agents) and who sees what (DESIGN §3 step 2, the spec's `render_context`)."""

from __future__ import annotations

import pytest
from compactd.context.budget_reduction import middle_truncate
from compactd.context.engine import Engine
from compactd.context.errors import InvalidContent, InvalidGraph, PendingToolResults
from compactd.context.policy import (
    HIDDEN_OUTPUT_PLACEHOLDER,
    RUNNING_FUNCTION_PLACEHOLDER,
)
from compactd.context.visibility import ViewOptions

from tests.engine.helpers import (
    FORMATS,
    assistant,
    call,
    new_session,
    params,
    render,
    result,
    results,
    texts,
    tool_messages,
    tool_results,
    user,
)

INTERNAL = "internal: reading the repo"


def _session(engine: Engine, sid: str, expose: str = "io") -> tuple[str, str]:
    """A top-level call `task` run as a function whose thread did some work."""
    new_session(engine, sid)
    engine.append(sid, messages=[user("top task"), assistant("delegating", call("task", "Task"))])
    s = engine.session(sid)
    fid = s.function_start("Task", {"prompt": "look"}, tool_use_id="task", expose=expose)
    engine.append(
        sid,
        messages=[
            user("look around"),
            assistant(INTERNAL, call("i1", "Read", path="a")),
            results(result("i1", "contents of a")),
            assistant("found it"),
        ],
        function=fid,
    )
    return sid, fid


def _result(engine: Engine, sid: str, fmt: str, use_id: str = "task", **kw: object) -> object:
    req = render(engine, sid, fmt, **kw).request
    if fmt == "anthropic":
        return tool_results(req)[use_id]
    return tool_messages(req)[use_id]


@pytest.mark.parametrize("fmt", FORMATS)
def test_running_function_called_as_a_tool(engine: Engine, fmt: str) -> None:
    sid, fid = _session(engine, "run")
    req = render(engine, sid, fmt).request
    if fmt == "anthropic":
        assert tool_results(req)["task"] == {
            "type": "tool_result",
            "tool_use_id": "task",
            "content": RUNNING_FUNCTION_PLACEHOLDER,
        }
    else:
        assert tool_messages(req)["task"] == RUNNING_FUNCTION_PLACEHOLDER
    assert INTERNAL not in str(req)
    # the function's own viewer sees its internals in full while it runs
    own = render(engine, sid, fmt, viewer=fid).request
    assert INTERNAL in texts(own)
    assert "top task" not in str(own)


@pytest.mark.parametrize("fmt", FORMATS)
def test_completed_function_shows_io_only(engine: Engine, fmt: str) -> None:
    sid, fid = _session(engine, "done")
    engine.session(sid).function_complete(fid, "the answer is 42")
    req = render(engine, sid, fmt).request
    if fmt == "anthropic":
        assert tool_results(req)["task"] == {
            "type": "tool_result",
            "tool_use_id": "task",
            "content": "the answer is 42",
        }
    else:
        assert tool_messages(req)["task"] == "the answer is 42"
    assert INTERNAL not in str(req)
    # internals stay inspectable in the graph
    g = engine.session(sid).graph
    inside = [g.nodes[i].content for i in g.function_path(fid).ids]
    assert INTERNAL in str(inside)
    # and the thread can move on
    engine.append(sid, messages=[assistant("thanks"), user("next")])
    render(engine, sid, fmt)


def test_function_error_and_big_output(engine: Engine) -> None:
    sid, fid = _session(engine, "err")
    big = "".join(f"{i:05d}" for i in range(2000))
    engine.session(sid).function_complete(fid, big, status="error")
    got = _result(engine, sid, "anthropic")
    assert got == {
        "type": "tool_result",
        "tool_use_id": "task",
        "content": middle_truncate(big),
        "is_error": True,
    }


@pytest.mark.parametrize("fmt", FORMATS)
def test_expose_none_hides_the_output(engine: Engine, fmt: str) -> None:
    sid, fid = _session(engine, "none", expose="none")
    engine.session(sid).function_complete(fid, "secret output")
    req = render(engine, sid, fmt).request
    assert "secret output" not in str(req) and INTERNAL not in str(req)
    got = _result(engine, sid, fmt)
    expected = HIDDEN_OUTPUT_PLACEHOLDER
    assert (got["content"] if fmt == "anthropic" else got) == expected  # type: ignore[index]


@pytest.mark.parametrize("fmt", FORMATS)
def test_expose_full_and_subcalls_show_the_transcript(engine: Engine, fmt: str) -> None:
    sid, fid = _session(engine, "full", expose="full")
    engine.session(sid).function_complete(fid, "summary out")
    got = _result(engine, sid, fmt)
    text = got["content"] if fmt == "anthropic" else got  # type: ignore[index]
    assert isinstance(text, str)
    assert text.startswith("summary out\n\n[internal transcript of Task]\n")
    assert f"assistant: {INTERNAL}" in text
    assert 'tool Read({"path":"a"}) -> contents of a' in text
    # an io function shows the same with subcalls=True or expose="full" for this render
    sid2, fid2 = _session(engine, "io")
    engine.session(sid2).function_complete(fid2, "summary out")
    plain = _result(engine, sid2, fmt)
    assert INTERNAL not in str(plain)
    assert _result(engine, sid2, fmt, subcalls=True) == got
    assert _result(engine, sid2, fmt, expose="full") == got
    # and expose="none" for the render overrides the function's own mode
    hidden = _result(engine, sid, fmt, expose="none")
    assert HIDDEN_OUTPUT_PLACEHOLDER in str(hidden) and "summary out" not in str(hidden)


def test_subcalls_do_not_expose_a_running_function(engine: Engine) -> None:
    sid, _fid = _session(engine, "subrun")
    got = _result(engine, sid, "anthropic", subcalls=True)
    assert got["content"] == RUNNING_FUNCTION_PLACEHOLDER  # type: ignore[index]


@pytest.mark.parametrize("fmt", FORMATS)
def test_function_not_called_as_a_tool(engine: Engine, fmt: str) -> None:
    sid = new_session(engine, "bare")
    engine.append(sid, messages=[user("go"), assistant("thinking about it")])
    s = engine.session(sid)
    fid = s.function_start("research", "plain input")
    fid2 = s.function_start("lookup", {"q": "x"})
    req = render(engine, sid, fmt).request
    use, use2 = f"fn_{fid}", f"fn_{fid2}"
    if fmt == "anthropic":
        blocks = req["messages"][1]["content"]
        assert blocks[1:] == [
            {"type": "tool_use", "id": use, "name": "research", "input": {"input": "plain input"}},
            {"type": "tool_use", "id": use2, "name": "lookup", "input": {"q": "x"}},
        ]
        assert tool_results(req)[use]["content"] == RUNNING_FUNCTION_PLACEHOLDER
    else:
        assert [c["id"] for c in req["messages"][1]["tool_calls"]] == [use, use2]
    with pytest.raises(PendingToolResults) as err:
        engine.append(sid, messages=[user("next")])
    assert err.value.data["pendingToolUseIds"] == [use, use2]  # the ids the request carries
    s.function_complete(fid, "found")
    s.function_complete(fid2, "none", status="error")
    req = render(engine, sid, fmt).request
    if fmt == "anthropic":
        assert tool_results(req)[use] == {
            "type": "tool_result",
            "tool_use_id": use,
            "content": "found",
        }
        assert tool_results(req)[use2]["is_error"] is True
    else:
        assert tool_messages(req) == {use: "found", use2: "none"}
    engine.append(sid, messages=[user("next")])
    # determinism: the synthetic id is the same after a reload
    again = Engine(engine.store)
    assert again.render(sid, params(fmt)).request == render(engine, sid, fmt).request


@pytest.mark.parametrize("fmt", FORMATS)
def test_viewer_with_callers(engine: Engine, fmt: str) -> None:
    sid, fid = _session(engine, "callers")
    plain = render(engine, sid, fmt, viewer=fid).request
    with_callers = render(engine, sid, fmt, viewer=fid, callers=True).request
    got = texts(with_callers)
    # the caller's thread up to the call, then the function's own thread
    assert got[0] == "top task"
    assert "delegating" not in got  # the calling message itself waits for this function
    assert got[1:] == texts(plain)
    assert INTERNAL in got


def test_viewer_must_be_a_function(engine: Engine) -> None:
    sid, _fid = _session(engine, "badview")
    head = engine.session(sid).graph.head()
    with pytest.raises(InvalidGraph, match="not a function"):
        render(engine, sid, viewer=head)
    with pytest.raises(InvalidContent, match="expose"):
        ViewOptions(expose="partial")


def test_nested_function_viewers(engine: Engine) -> None:
    sid, fid = _session(engine, "nest")
    engine.append(sid, messages=[user("deeper"), assistant(call("sub", "Task"))], function=fid)
    s = engine.session(sid)
    inner = s.function_start("Task", {"p": 1}, tool_use_id="sub", function=fid)
    engine.append(sid, messages=[user("inner work"), assistant("inner done")], function=inner)
    own = render(engine, sid, viewer=fid).request
    assert tool_results(own)["sub"]["content"] == RUNNING_FUNCTION_PLACEHOLDER
    assert "inner work" not in str(own)
    deep = render(engine, sid, viewer=inner, callers=True).request
    assert texts(deep)[:2] == ["look around", INTERNAL]
    assert "inner work" in texts(deep)
    s.function_complete(inner, "inner result")
    assert tool_results(render(engine, sid, viewer=fid).request)["sub"]["content"] == (
        "inner result"
    )
    # the top level sees only its own call
    top = render(engine, sid).request
    assert "inner" not in str(top)


def test_records_in_a_function_thread_apply_only_to_its_viewer(engine: Engine) -> None:
    sid, fid = _session(engine, "frec")
    engine.append(sid, messages=[user("second sub turn"), assistant("ok")], function=fid)
    g = engine.session(sid).graph
    tool = g.tool_by_use_id("i1")
    assert tool is not None
    engine.session(sid).add_records(
        [{"kind": "clear", "covers": [tool.id], "data": {"mode": "time"}, "thread": fid}]
    )
    own = render(engine, sid, viewer=fid).request
    assert "contents of a" not in str(own)
    assert "cleared by compactd" in tool_results(own)["i1"]["content"]
    engine.session(sid).function_complete(fid, "x")
    full = render(engine, sid, expose="full").request
    assert "contents of a" in str(full)  # the transcript of a completed function is unaffected
