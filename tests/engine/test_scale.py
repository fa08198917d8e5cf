"""What makes a step follow the context, not the history (issue "Scale"), kept honest.

The projection kept per line must equal a fresh one whatever happened since (appends, records,
a running function); hidden turns as runs must render as the per-turn walk did; the line's
tool-call count must equal a walk; eviction must leave nothing behind. No timings here: the
benchmarks report those (`bench/cases/scale.py`).
"""

from __future__ import annotations

from compactd.context.engine import Engine
from compactd.context.projection import _build, applicable, hidden_runs, project, visible_bounds
from compactd.context.tokens import SMALL_MEMO, Counter
from compactd.context.turns import has_running, plan_cuts, running_turns, turns_of
from compactd.service.registry import Registry

from .helpers import assistant, call, new_session, render, result, results, user


def _turns(engine: Engine, sid: str, first: int, count: int) -> None:
    for k in range(first, first + count):
        engine.append(
            sid,
            messages=[
                user(f"ask {k}"),
                assistant(f"looking {k}", call(f"u{k}", "Read", path=f"f{k}")),
                results(result(f"u{k}", f"content {k} " * 30)),
                assistant(f"done {k}"),
            ],
        )


def _fresh(engine: Engine, sid: str) -> object:
    g = engine.session(sid).graph
    path = g.branch_path()
    return _build(g, path, applicable(g, path))[0]


def _same(a: object, b: object) -> None:
    fields = ("summary", "summary_turns", "snipped", "collapsed", "cleared", "cache_cleared")
    for name in fields:
        assert getattr(a, name) == getattr(b, name), name
    assert [r.id for r in a.applied] == [r.id for r in b.applied]  # type: ignore[attr-defined]


def _snip(engine: Engine, sid: str, turns: list[int]) -> None:
    g = engine.session(sid).graph
    path = g.branch_path()
    all_turns = turns_of(path)
    chosen = [all_turns[i] for i in turns]
    covers = [n for t in chosen for n in path.ids[t.start : t.end]]
    engine.session(sid).add_records(
        [{"kind": "snip", "covers": covers, "data": {"turns": [t.start_id for t in chosen]}}]
    )


def test_kept_projection_equals_a_fresh_one(engine: Engine) -> None:
    sid = new_session(engine, "grow")
    _turns(engine, sid, 0, 12)
    _snip(engine, sid, [1, 2, 3, 5])
    g = engine.session(sid).graph
    for k in range(12, 16):  # reused while the path grows
        first = project(g, g.branch_path())
        _same(first, _fresh(engine, sid))
        _turns(engine, sid, k, 1)
        _same(project(g, g.branch_path()), _fresh(engine, sid))
    # a running function in a snipped turn: the snip no longer hides it
    old = g.branch_path().ids[5]
    fid = engine.session(sid).function_start("bg", {"x": 1}, parent=old)
    _same(project(g, g.branch_path()), _fresh(engine, sid))
    engine.session(sid).function_complete(fid, "done")
    _same(project(g, g.branch_path()), _fresh(engine, sid))
    render(engine, sid)


def test_drafts_apply_after_the_kept_projection_as_after_every_record(engine: Engine) -> None:
    """A tier's drafts are applied to the kept projection (no rebuild of every snip): the
    same projection, and the same hidden runs, as building from every record and the drafts."""
    sid = new_session(engine, "drafts")
    _turns(engine, sid, 0, 12)
    _snip(engine, sid, [1, 2])
    g = engine.session(sid).graph
    path = g.branch_path()
    tools = [n.id for n in g.nodes.values() if n.kind == "tool"][4:6]
    first = turns_of(path)[0]
    engine.session(sid).add_records(
        [
            {"kind": "clear", "covers": tools, "data": {"results": tools}},
            {
                "kind": "summary",
                "covers": path.ids[first.start : first.end],
                "data": {"turns": [first.start_id], "text": "s"},
            },
        ]
    )
    _snip(engine, sid, [3, 6])
    _snip(engine, sid, [2, 7])  # a turn snipped twice: the first record keeps it
    written = list(g.records)
    assert len(written) == 5
    splits = [(written[:k], written[k:]) for k in range(len(written) + 1)]
    assert written[1].kind == "clear"
    splits.append(([r for r in written if r.kind != "clear"], [written[1]]))  # a clear alone
    for kept, drafts in splits:
        g.records[:] = kept
        g.records_version += 1
        hidden_runs(project(g, path), path)  # the kept one's runs, worked out already
        assert all(g.record_applies(r, path) for r in drafts)
        got = project(g, path, drafts)
        fresh = _build(g, path, [*applicable(g, path), *drafts])[0]
        _same(got, fresh)
        assert got.summary_through == fresh.summary_through
        assert hidden_runs(got, path) == hidden_runs(fresh, path)
        _same(project(g, path), _build(g, path, applicable(g, path))[0])  # the kept one as was
    g.records[:] = written


def test_hidden_runs_and_visible_turns(engine: Engine) -> None:
    sid = new_session(engine, "runs")
    _turns(engine, sid, 0, 10)
    _snip(engine, sid, [1, 2, 4])
    g = engine.session(sid).graph
    path = g.branch_path()
    proj = project(g, path)
    assert hidden_runs(proj, path) == [(1, 3, "snip"), (4, 5, "snip")]
    assert [i for i, _s, _e in visible_bounds(proj, path)] == [0, 3, *range(5, 10)]
    texts = str(render(engine, sid).request)
    assert "2 earlier turns removed" in texts and "1 earlier turn removed" in texts
    assert "ask 3" in texts and "ask 1" not in texts


def test_tool_count_and_running_turns(engine: Engine) -> None:
    sid = new_session(engine, "count")
    _turns(engine, sid, 0, 6)
    g = engine.session(sid).graph
    path = g.branch_path()
    walk = sum(1 for i in path.ids for c in g.nodes[i].calls if g.nodes[c].kind == "tool")
    assert path.tool_count(g.nodes) == walk == 6
    engine.append(sid, messages=[user("more"), assistant("x", call("w1"), call("w2"))])
    path = g.branch_path()
    assert path.tool_count(g.nodes) == 8
    turns = turns_of(path)
    fid = engine.session(sid).function_start("bg", {}, parent=path.ids[1])
    expected = [t.index for t in turns if has_running(g, g.branch_path(), t)]
    assert running_turns(g, g.branch_path(), turns) == expected == [0, len(turns) - 1]
    plan = plan_cuts(g, g.branch_path(), keep_first_turn=False)
    assert plan.reasons[0] == "running function"
    engine.session(sid).function_complete(fid, "ok")


def test_eviction_frees_what_a_session_held(engine: Engine) -> None:
    sid = new_session(engine, "gone")
    _turns(engine, sid, 0, 2)
    render(engine, sid)
    engine.evict(sid)
    assert sid not in engine.sessions
    assert sid not in engine._last_estimate and sid not in engine._calibration
    assert sid not in engine.store._locks
    render(engine, sid)  # loads again from its log


def test_imported_sessions_are_evictable(engine: Engine) -> None:
    now = [0.0]
    registry = Registry(engine, evict_after=10.0, clock=lambda: now[0])
    sid = new_session(engine, "imported")  # loaded by the engine itself, as an import is
    evicted: list[str] = []
    registry.on_evict.append(evicted.append)
    assert registry.evict_idle() == []  # first seen now
    now[0] = 11.0
    assert registry.evict_idle() == [sid] == evicted
    assert sid not in engine.sessions


def test_the_short_text_memo_is_bounded() -> None:
    counter = Counter()
    for k in range(SMALL_MEMO * 3):
        counter.text(f"id {k}")
    assert len(counter._small) <= SMALL_MEMO


def test_the_seen_render_measures_what_a_full_render_would(engine: Engine) -> None:
    """The server path measures the seen request from the sent walk, without building it:
    the same tally and (when asked) the same request as a render of its own."""
    from compactd.context.render.anthropic import anthropic_tally, to_anthropic
    from compactd.context.render.request import render_request
    from compactd.context.tiers import microcompact

    from .helpers import params

    sid = new_session(engine, "seen")
    _turns(engine, sid, 0, 10)
    g = engine.session(sid).graph
    calls = [c for i in g.branch_path().ids for c in g.nodes[i].calls][:6]
    engine.session(sid).add_records(
        [{"kind": "clear", "covers": calls, "data": {"mode": "cache", "results": calls}}]
    )
    p = params(system="be brief")
    session = engine.session(sid)
    rendered = engine.render_session(session, p)
    assert rendered.server is not None  # the server path is in force
    g = session.graph
    policy = engine.policy(session)
    plan = microcompact.server_plan(render_request(g, p.view, p.spec, policy), policy, p.spec)
    assert plan is not None
    alone = render_request(g, p.view, p.spec, policy, as_seen=(plan.results, plan.inputs))
    assert rendered.tally.by_category == alone.tally.by_category
    assert rendered.seen_request == alone.request
    common = {"system": "be brief", "tools": None, "response_schema": None}
    full = to_anthropic(alone.conversation, engine.counter, model=None, max_tokens=1, **common)
    tally = anthropic_tally(alone.conversation, engine.counter, **common)
    assert tally.by_category == full[1].by_category
