"""Writes held back for a request that may yet be refused (`Session.holding`): applied in
memory, written by `flush`, forgotten by `drop` — on both stores, with another writer on the
same session, and for a session whose log does not exist yet."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from compactd.context.decompose import from_anthropic
from compactd.context.engine import Engine
from compactd.context.errors import TooLarge
from compactd.context.policy import policy_from_config
from compactd.context.stores import open_store
from compactd.context.stores.interface import SessionStore

from tests.engine.helpers import assistant, call, result, results, user


@pytest.fixture(params=["files", "postgres"])
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str | None]:
    yield None if request.param == "files" else request.getfixturevalue("pg_url")


def _store(url: str | None, tmp_path: Path) -> SessionStore:
    return open_store(url, tmp_path / "data")


def _logged(store: SessionStore, sid: str) -> list[str]:
    """The text of every user/assistant node the log holds."""
    events, _ = store.read_from(sid, 0)
    return [
        b.get("text", "")
        for e in events
        if e.get("t") == "node"
        for b in e["n"].get("content") or []
        if b.get("type") == "text"
    ]


def test_held_writes_reach_the_log_only_when_flushed(store_url: str | None, tmp_path: Path) -> None:
    store = _store(store_url, tmp_path)
    engine = Engine(store)
    session, _ = engine.open("held")
    session.append(from_anthropic([user("kept")]))
    request = object()
    with session.holding(request):
        session.append(from_anthropic([assistant("answer"), user("asked next")]))
        session.add_records([{"kind": "note", "covers": [], "data": {"note": "x"}}])
    assert _logged(store, "held") == ["kept"]  # in memory only
    assert session.graph.branch_path().length == 3
    session.flush(object())  # another owner's flush writes nothing of this one's
    assert _logged(store, "held") == ["kept"]
    session.flush(request)
    assert _logged(store, "held") == ["kept", "answer", "asked next"]
    assert not engine.drop_held("held", request)  # written: nothing left to drop
    store.close()


def test_dropped_writes_leave_the_graph_as_its_log(store_url: str | None, tmp_path: Path) -> None:
    store = _store(store_url, tmp_path)
    engine = Engine(store)
    session, _ = engine.open("dropped")
    session.append(from_anthropic([user("go"), assistant(call("c1")), results(result("c1"))]))
    seq = session.graph.seq
    request = object()
    with session.holding(request):
        session.append(from_anthropic([assistant(call("c2")), results(result("c2"))]))
    assert engine.drop_held("dropped", request)
    again = engine.session("dropped")
    assert again.graph.seq == seq and again.graph.tool_by_use_id("c2") is None
    # the id is free again, and a later write goes to the log as usual
    again.append(from_anthropic([assistant(call("c2")), results(result("c2"))]))
    engine.evict("dropped")
    assert engine.session("dropped").graph.tool_by_use_id("c2") is not None
    store.close()


def test_another_owner_or_another_write_writes_what_is_held(
    store_url: str | None, tmp_path: Path
) -> None:
    """Only the latest owner's writes can be dropped: a new hold, or any write, writes the
    earlier ones first (the session moved on from them)."""
    store = _store(store_url, tmp_path)
    engine = Engine(store)
    session, _ = engine.open("owners")
    first, second = object(), object()
    with session.holding(first):
        session.append(from_anthropic([user("first")]))
    with session.holding(second):
        session.append(from_anthropic([assistant("second")]))
    assert _logged(store, "owners") == ["first"]
    assert not engine.drop_held("owners", first)
    session.add_records([{"kind": "note", "covers": [], "data": {}}])  # not held
    assert _logged(store, "owners") == ["first", "second"]
    assert not engine.drop_held("owners", second)
    store.close()


def test_another_writer_meanwhile_means_the_held_writes_are_read_again(
    store_url: str | None, tmp_path: Path
) -> None:
    """A second process appended while writes were held: theirs stand, ours are dropped (a
    client's copy, placed again with its next request) and the log stays consistent."""
    store, other = _store(store_url, tmp_path), _store(store_url, tmp_path)
    engine, elsewhere = Engine(store), Engine(other)
    session, _ = engine.open("two")
    session.append(from_anthropic([user("shared")]))
    request = object()
    with session.holding(request):
        session.append(from_anthropic([assistant("mine")]))
    elsewhere.append("two", messages=[assistant("theirs")])
    session.flush(request)
    assert _logged(store, "two") == ["shared", "theirs"]
    assert [n.content[0]["text"] for n in session.graph.nodes.values()] == ["shared", "theirs"]
    session.append(from_anthropic([user("next")]))
    fresh = Engine(_store(store_url, tmp_path)).session("two")
    assert not fresh.report.bad_lines
    assert _logged(store, "two") == ["shared", "theirs", "next"]
    store.close()
    other.close()


def test_a_session_made_while_holding_has_no_log_until_written(
    store_url: str | None, tmp_path: Path
) -> None:
    store = _store(store_url, tmp_path)
    engine = Engine(store)
    refused, taken = object(), object()
    session, new = engine.open("unborn", meta={"source": "proxy"}, unborn=True)
    assert new
    with session.holding(refused):
        session.append(from_anthropic([user("never written")]))
    assert engine.drop_held("unborn", refused)
    assert not store.exists("unborn") and "unborn" not in engine.sessions
    session, _ = engine.open("unborn", unborn=True)
    with session.holding(taken):
        session.append(from_anthropic([user("written")]))
    assert not store.exists("unborn")
    session.flush(taken)
    assert store.exists("unborn") and _logged(store, "unborn") == ["written"]
    store.close()


def test_what_the_store_would_refuse_is_refused_before_it_is_held(tmp_path: Path) -> None:
    limit = policy_from_config({}).max_message_bytes
    engine = Engine(open_store(None, tmp_path / "data"), defaults={"max_message_bytes": 4096})
    assert engine.limits.max_message_bytes == 4096 < limit
    session, _ = engine.open("big")
    request = object()
    with session.holding(request), pytest.raises(TooLarge):
        session.append(from_anthropic([user("x" * 10_000)]))
    assert session.graph.branch_path().length == 0  # nothing applied either
