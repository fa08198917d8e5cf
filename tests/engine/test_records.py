"""Records → what a render hides or replaces, and what no record may hide."""

from __future__ import annotations

from typing import Any

from compactd.context.engine import Engine
from compactd.context.policy import CLEARED_PLACEHOLDER, RUNNING_FUNCTION_PLACEHOLDER
from compactd.context.projection import protected_starts
from compactd.context.turns import turn_node_ids, turns_of

from tests.engine.helpers import (
    FORMATS,
    assistant,
    call,
    new_session,
    render,
    result,
    results,
    texts,
    tool_messages,
    tool_results,
    user,
)
from tests.support.invariants import strip_cache_control


def _session(engine: Engine, sid: str, n: int = 6) -> None:
    new_session(engine, sid)
    for k in range(n):
        engine.append(
            sid,
            messages=[
                user(f"t{k} ask"),
                assistant(f"t{k} working", call(f"c{k}")),
                results(result(f"c{k}", f"t{k} result")),
                assistant(f"t{k} done"),
            ],
        )


def _record(engine: Engine, sid: str, kind: str, turns: list[int], **data: Any) -> str:
    g = engine.session(sid).graph
    path = g.branch_path()
    chosen = [turns_of(path)[i] for i in turns]
    covers = [i for t in chosen for i in turn_node_ids(g, path, t)]
    if kind in ("snip", "summary", "collapse"):
        data["turns"] = [t.start_id for t in chosen]
    return engine.session(sid).add_records([{"kind": kind, "covers": covers, "data": data}])[0]


def _asks(req: dict[str, Any]) -> list[str]:
    return [t for t in texts(req) if t.endswith("ask")]


def test_snip_hides_whole_turns_behind_one_marker_per_run(engine: Engine) -> None:
    _session(engine, "s")
    _record(engine, "s", "snip", [0, 1])
    _record(engine, "s", "snip", [3])
    for fmt in FORMATS:
        req = render(engine, "s", fmt).request
        assert _asks(req) == ["t2 ask", "t4 ask", "t5 ask"]
        markers = [t for t in texts(req) if t.startswith("[compactd")]
        assert [m.split(" earlier")[0] for m in markers] == ["[compactd: 2", "[compactd: 1"]
        assert "c0" not in str(req) and "c2" in str(req)


def test_summary_replaces_a_prefix_and_the_newest_is_in_force(engine: Engine) -> None:
    _session(engine, "sum")
    _record(engine, "sum", "summary", [0, 1], text="first summary")
    _record(engine, "sum", "summary", [0, 1, 2], text="second summary, folding the first")
    for fmt in FORMATS:
        req = render(engine, "sum", fmt).request
        got = texts(req)
        assert got[0].startswith("[compactd: summary of the earlier conversation (3 turns")
        assert got[0].endswith("second summary, folding the first")
        assert "first summary" not in str(req)
        assert _asks(req) == ["t3 ask", "t4 ask", "t5 ask"]


def test_collapse_and_uncollapse(engine: Engine) -> None:
    _session(engine, "col")
    rid = _record(engine, "col", "collapse", [1, 2], text="segment gist")
    req = render(engine, "col").request
    assert _asks(req) == ["t0 ask", "t3 ask", "t4 ask", "t5 ask"]
    assert any(t.startswith("[compactd: 2 turns collapsed") for t in texts(req))
    # an uncollapse names the collapse and covers what it covers (so it applies where it does)
    collapse = next(r for r in engine.session("col").graph.records if r.id == rid)
    engine.session("col").add_records(
        [{"kind": "uncollapse", "covers": collapse.covers, "data": {"collapse": rid}}]
    )
    req = render(engine, "col").request
    assert _asks(req) == [f"t{k} ask" for k in range(6)]


def test_clear_and_evidence_replace_single_results(engine: Engine) -> None:
    _session(engine, "clr")
    g = engine.session("clr").graph
    c1, c2, c3 = (g.tool_by_use_id(f"c{k}") for k in (1, 2, 3))
    assert c1 and c2 and c3
    engine.session("clr").add_records(
        [
            {"kind": "clear", "covers": [c1.id], "data": {"mode": "time"}},
            {"kind": "clear", "covers": [c2.id], "data": {"mode": "cache"}},
            {"kind": "evidence", "covers": [c3.id], "data": {"text": "c3 said: result"}},
        ]
    )
    req = render(engine, "clr").request
    res = tool_results(req)
    assert res["c1"]["content"] == CLEARED_PLACEHOLDER
    assert res["c2"]["content"] == "t2 result"  # the provider applies cache-aware clears
    assert res["c3"]["content"] == "c3 said: result"
    assert tool_messages(render(engine, "clr", "openai").request)["c1"] == CLEARED_PLACEHOLDER


def test_protected_turns(engine: Engine) -> None:
    _session(engine, "p", 4)
    g = engine.session("p").graph
    path = g.branch_path()
    starts = [t.start_id for t in turns_of(path)]
    assert protected_starts(g, path) == {starts[3]}  # complete and active at once
    engine.append("p", messages=[user("t4 ask")])
    path = g.branch_path()
    starts = [t.start_id for t in turns_of(path)]
    assert protected_starts(g, path) == {starts[3], starts[4]}
    # a running function protects its turn, wherever it hangs
    old_assistant = path.ids[1]
    fid = engine.session("p").function_start("bg", {"x": 1}, parent=old_assistant)
    assert protected_starts(g, g.branch_path()) == {starts[0], starts[3], starts[4]}
    engine.session("p").function_complete(fid, "done")
    assert protected_starts(g, g.branch_path()) == {starts[3], starts[4]}


def test_no_record_hides_a_running_function(engine: Engine) -> None:
    _session(engine, "run", 5)
    g = engine.session("run").graph
    path = g.branch_path()
    fid = engine.session("run").function_start("bg", {"x": 1}, parent=path.ids[1])
    _record(engine, "run", "snip", [0, 1])
    req = render(engine, "run").request
    assert _asks(req) == ["t0 ask", "t2 ask", "t3 ask", "t4 ask"]
    assert tool_results(req)[f"fn_{fid}"]["content"] == RUNNING_FUNCTION_PLACEHOLDER
    _record(engine, "run", "summary", [0, 1, 2], text="would hide the function")
    assert "would hide" not in str(render(engine, "run").request)
    engine.session("run").function_complete(fid, "finished")
    req = render(engine, "run").request
    assert "would hide" in str(req) and _asks(req) == ["t3 ask", "t4 ask"]


def test_protection_only_moves_forward(engine: Engine) -> None:
    """A snip of the turn before a finished one stays in force when the agent carries on in
    that finished turn (a hook's meta message, another tool loop): the render only grows."""
    _session(engine, "fwd", 4)
    _record(engine, "fwd", "snip", [2])
    before = strip_cache_control(render(engine, "fwd").request)["messages"]
    assert _asks({"messages": before}) == ["t0 ask", "t1 ask", "t3 ask"]
    engine.append("fwd", messages=[user("stop hook: keep going", meta=True)])
    engine.append("fwd", messages=[assistant("more", call("again"))])
    engine.append("fwd", messages=[results(result("again"))])
    after = strip_cache_control(render(engine, "fwd").request)["messages"]
    assert _asks({"messages": after}) == ["t0 ask", "t1 ask", "t3 ask"]
    assert after[: len(before)] == before
