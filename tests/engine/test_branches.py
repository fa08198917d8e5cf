"""Branches: forks share their prefix, and records apply only where they belong."""

from __future__ import annotations

import orjson
import pytest
from compactd.context.decompose import from_anthropic
from compactd.context.engine import Engine
from compactd.context.errors import InvalidPairing, PendingToolResults
from compactd.context.turns import plan_cuts, turn_node_ids, turns_of

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
    user,
)


def _turns(engine: Engine, sid: str, n: int, tag: str, branch: str | None = None) -> None:
    for k in range(n):
        engine.append(
            sid,
            branch=branch,
            messages=[
                user(f"{tag}{k} ask"),
                assistant(f"{tag}{k} working", call(f"{tag}{k}c")),
                results(result(f"{tag}{k}c", f"{tag}{k} result")),
                assistant(f"{tag}{k} done"),
            ],
        )


def _snip(engine: Engine, sid: str, start_ids: list[str], branch: str | None = None) -> None:
    g = engine.session(sid).graph
    path = g.branch_path(branch)
    turns = [t for t in turns_of(path) if t.start_id in start_ids]
    covers = [i for t in turns for i in turn_node_ids(g, path, t)]
    engine.session(sid).add_records(
        [{"kind": "snip", "covers": covers, "data": {"turns": [t.start_id for t in turns]}}]
    )


def test_fork_checkout_and_isolation(engine: Engine) -> None:
    sid = new_session(engine, "br")
    _turns(engine, sid, 3, "m")
    s = engine.session(sid)
    g = s.graph
    path = g.branch_path()
    fork_at = path.ids[turns_of(path)[0].end - 1]  # the last node of turn m0 ("m0 done")
    assert s.create_branch("alt", from_node=fork_at) == fork_at
    assert g.branches["alt"] == fork_at and g.current_branch == "main"
    _turns(engine, sid, 2, "a", branch="alt")
    main_texts = texts(render(engine, sid).request)
    alt_texts = texts(render(engine, sid, branch="alt").request)
    assert [t for t in main_texts if t.endswith("ask")] == ["m0 ask", "m1 ask", "m2 ask"]
    assert [t for t in alt_texts if t.endswith("ask")] == ["m0 ask", "a0 ask", "a1 ask"]
    # checkout moves the default branch; appends without a branch follow it
    assert s.checkout("alt") == g.branches["alt"]
    engine.append(sid, messages=[user("on alt by default")])
    assert texts(render(engine, sid).request)[-1] == "on alt by default"
    assert "on alt by default" not in texts(render(engine, sid, branch="main").request)
    # everything survives a reload
    again = Engine(engine.store)
    assert again.session(sid).graph.current_branch == "alt"
    for fmt in FORMATS:
        for branch in ("main", "alt"):
            assert (
                again.render(sid, params(fmt, branch=branch)).request
                == engine.render(sid, params(fmt, branch=branch)).request
            )


def test_branch_from_the_head_and_from_an_empty_thread(engine: Engine) -> None:
    sid = new_session(engine, "br2")
    s = engine.session(sid)
    assert s.create_branch("empty") is None
    engine.append(sid, branch="empty", messages=[user("first on empty")])
    assert engine.session(sid).graph.head("main") is None
    _turns(engine, sid, 1, "m")
    head = s.graph.head()
    assert s.create_branch("same") == head
    engine.append(sid, branch="same", messages=[user("same next")])
    engine.append(sid, messages=[user("main next")])
    assert texts(render(engine, sid, branch="same").request)[-1] == "same next"
    assert texts(render(engine, sid).request)[-1] == "main next"
    assert "main next" not in texts(render(engine, sid, branch="same").request)


def test_fork_with_pending_calls_still_needs_the_results(engine: Engine) -> None:
    sid = new_session(engine, "br3")
    engine.append(sid, messages=[user("u"), assistant(call("p"))])
    s = engine.session(sid)
    s.create_branch("alt")
    with pytest.raises(PendingToolResults):
        engine.append(sid, branch="alt", messages=[user("x")])
    s.tool_result("p", "r")  # the call is shared: one result serves both branches
    engine.append(sid, branch="alt", messages=[user("x")])
    engine.append(sid, messages=[assistant("main goes on")])


def test_a_tool_use_id_is_unique_on_a_branch_not_in_the_session(engine: Engine) -> None:
    """A compacted history keeps its last exchanges with their ids: on a branch of its own
    (forked before them, or with no node) the same ids are new calls, their results answer
    the calls of that branch, recall by id reaches the branch's own; on one thread an id
    still may not repeat, and a log holding both loads back the same."""
    sid = new_session(engine, "ids")
    engine.append(sid, messages=[user("go"), assistant(call("k1")), results(result("k1", "one"))])
    engine.append(sid, messages=[assistant(call("k2")), results(result("k2", "two"))])
    s = engine.session(sid)
    s.create_branch("compacted", empty=True)
    engine.append(
        sid,
        branch="compacted",
        messages=[
            user("summary of the work so far"),
            assistant(call("k2")),
            results(result("k2", "two, kept")),
        ],
    )
    g = s.graph
    on_main = g.tool_by_use_id("k2", g.branch_path("main"))
    on_fork = g.tool_by_use_id("k2", g.branch_path("compacted"))
    assert on_main is not None and on_fork is not None and on_main.id != on_fork.id
    assert (on_main.result, on_fork.result) == ("two", "two, kept")
    assert b"two, kept" in orjson.dumps(render(engine, sid, branch="compacted").request)
    assert b"two, kept" not in orjson.dumps(render(engine, sid).request)
    assert "two, kept" in engine.recall(sid, "k2", branch="compacted").text
    assert "two, kept" not in engine.recall(sid, "k2").text
    with pytest.raises(InvalidPairing, match="duplicate tool_use_id 'k1'"):
        engine.append(sid, messages=[assistant(call("k1"))])
    with pytest.raises(InvalidPairing, match="duplicate tool_use_id 'k2'"):
        engine.append(sid, branch="compacted", messages=[assistant(call("k2"))])
    engine.evict(sid)
    again = engine.session(sid)
    assert not again.report.bad_lines
    fork = again.graph.tool_by_use_id("k2", again.graph.branch_path("compacted"))
    assert fork is not None and fork.result == "two, kept"


def test_a_fork_and_its_thread_are_one_write(engine: Engine) -> None:
    """`append(fork_at=…)` makes the branch with its first nodes: a history that cannot be
    appended leaves no branch behind, one that can is there whole."""
    sid = new_session(engine, "forkat")
    engine.append(sid, messages=[user("a"), assistant(call("x1")), results(result("x1"))])
    s = engine.session(sid)
    bad = from_anthropic([user("b"), results(result("nowhere"))])
    with pytest.raises(InvalidPairing):
        s.append(bad, branch="fork-1", fork_at=None)
    assert "fork-1" not in s.graph.branches
    head = s.graph.head()
    s.append(from_anthropic([user("c")]), branch="fork-1", fork_at=head, durable=False)
    assert texts(render(engine, sid, branch="fork-1").request)[-1] == "c"
    engine.evict(sid)
    assert engine.session(sid).graph.branches["fork-1"] is not None


def test_a_record_applies_only_where_its_nodes_are(engine: Engine) -> None:
    sid = new_session(engine, "rec")
    _turns(engine, sid, 2, "s")  # shared prefix
    s = engine.session(sid)
    s.create_branch("alt")
    _turns(engine, sid, 4, "m")
    _turns(engine, sid, 4, "a", branch="alt")
    main_starts = [t.start_id for t in turns_of(s.graph.branch_path())]
    alt_starts = [t.start_id for t in turns_of(s.graph.branch_path("alt"))]
    # a snip of main-only turns leaves alt alone
    _snip(engine, sid, main_starts[2:4])
    main = texts(render(engine, sid).request)
    assert "m0 ask" not in main and "m1 ask" not in main and "m2 ask" in main
    assert any("2 earlier turns removed" in t for t in main)
    alt = texts(render(engine, sid, branch="alt").request)
    assert all(not t.startswith("[compactd") for t in alt)
    # a snip of alt's turns, made on alt, leaves main's render byte-identical
    before_main = render(engine, sid).request
    _snip(engine, sid, alt_starts[2:3], branch="alt")
    assert render(engine, sid).request == before_main
    assert "a0 ask" not in texts(render(engine, sid, branch="alt").request)
    # a snip of the shared prefix applies to both
    _snip(engine, sid, main_starts[:1])
    for branch in ("main", "alt"):
        assert "s0 ask" not in texts(render(engine, sid, branch=branch).request)


def test_records_never_hide_the_protected_turns_of_another_branch(engine: Engine) -> None:
    """Main snipped turns that were old there; a branch forked at the end of one of them has
    it as its latest complete turn, which no record may hide (DESIGN §3 invariants)."""
    sid = new_session(engine, "prot")
    _turns(engine, sid, 5, "m")
    s = engine.session(sid)
    g = s.graph
    path = g.branch_path()
    turns = turns_of(path)
    removable = plan_cuts(g, path, keep_first_turn=False).removable()
    assert [t.index for t in removable] == [0, 1, 2, 3]
    fork_at = path.ids[turns[1].end - 1]  # the end of m1
    s.create_branch("retry", from_node=fork_at)
    _snip(engine, sid, [t.start_id for t in removable[:2]])
    assert "m1 ask" not in texts(render(engine, sid).request)
    alt = texts(render(engine, sid, branch="retry").request)
    assert "m1 ask" in alt and "m1 done" in alt, alt
    # once the branch has moved on, m1 is old there too and the shared snip applies
    _turns(engine, sid, 2, "r", branch="retry")
    alt = texts(render(engine, sid, branch="retry").request)
    assert "m1 ask" not in alt and "r1 ask" in alt
