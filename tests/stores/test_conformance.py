"""The store conformance suite: the same behaviour from the JSONL files and from PostgreSQL.

Each test runs against both stores (`backend`), through the engine, and reloads through a new
store object, the way another daemon (or this one after a restart) would see the session.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import attrs
import orjson
import pytest
from compactd.context.engine import Engine
from compactd.context.errors import (
    HeadConflict,
    InvalidContent,
    StoreFailure,
    UnknownSession,
)
from compactd.context.session import Library
from compactd.context.stores import SessionStore, open_store

from tests.engine.helpers import assistant, call, new_session, result, results, user

TRANSCRIPT = (
    Path(__file__).resolve().parents[1]
    / "data/transcripts/claude-code/fe5e1c67-53e7-4862-81ae-d0e013e3270b.jsonl"
)


@attrs.define
class Backend:
    """Opens stores on one location; `break_next_write` makes the next append fail inside
    the store, after the lock is taken (a disk error; a dropped database connection), and
    `break_next_create` the next create, part-way (a full disk; a failed statement after the
    session's row)."""

    name: str
    open: Callable[[], Any]
    break_next_write: Callable[[Any, pytest.MonkeyPatch], None]
    break_next_create: Callable[[Any, pytest.MonkeyPatch], None]
    opened: list[Any] = attrs.field(factory=list)

    def store(self) -> Any:
        store = self.open()
        self.opened.append(store)
        return store

    def engine(self) -> Engine:
        return Engine(self.store())


def _break_files(store: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    import os

    real = os.fsync

    def fsync(fd: int) -> None:
        monkeypatch.setattr(os, "fsync", real)
        raise OSError(5, "Input/output error")

    monkeypatch.setattr(os, "fsync", fsync)


def _fill_the_disk(store: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """The next write gets part of its bytes out, then the disk is full."""
    import errno
    import os

    real = os.write

    def write(fd: int, data: Any) -> int:
        monkeypatch.setattr(os, "write", real)
        real(fd, bytes(data[: max(1, len(data) // 2)]))
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "write", write)


def _fail_inside_the_create(store: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """The create's insert of its events fails, after the session's row went in."""
    from compactd.context.stores import postgres

    monkeypatch.setattr(postgres, "INSERT_EVENTS", "SELECT compactd_no_such_function()")


def _break_postgres(store: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """Kill the server process of the write transaction just before its insert."""
    import psycopg

    real = type(store).append

    def append(self: Any, session_id: str, events: list[dict[str, Any]], **how: Any) -> int:
        monkeypatch.setattr(type(store), "append", real)
        conn = self._tx()[session_id]
        with psycopg.connect(self.url, autocommit=True) as killer:
            killer.execute("SELECT pg_terminate_backend(%s)", (conn.info.backend_pid,))
        return real(self, session_id, events, **how)

    monkeypatch.setattr(type(store), "append", append)


@pytest.fixture(params=["files", "postgres"])
def backend(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Backend]:
    if request.param == "files":
        root = tmp_path / "data"
        made = Backend("files", lambda: open_store(None, root), _break_files, _fill_the_disk)
    else:
        url = request.getfixturevalue("pg_url")
        made = Backend(
            "postgres", lambda: open_store(url, None), _break_postgres, _fail_inside_the_create
        )
    yield made
    for store in made.opened:
        store.close()


def _texts(engine: Engine, sid: str) -> list[str]:
    g = engine.session(sid).graph
    return [
        block["text"]
        for node in g.nodes.values()
        if node.kind in ("user", "assistant")
        for block in node.content
        if block.get("type") == "text"
    ]


def _log(store: Any, sid: str) -> list[dict[str, Any]]:
    events, report = store.read_from(sid, 0)
    assert report.clean
    return events


def test_both_are_session_stores(backend: Backend) -> None:
    assert isinstance(backend.store(), SessionStore)


def test_append_and_reload(backend: Backend) -> None:
    eng = backend.engine()
    sid = new_session(eng, "s1", config={"idleSeconds": 60})
    first = eng.append(sid, messages=[user("hello"), assistant("hi", call("t1", command="ls"))])
    eng.append(sid, messages=[results(result("t1", "a.txt"))])
    last = eng.append(sid, messages=[assistant("done")])

    again = backend.engine()
    loaded = again.session(sid)
    assert loaded.report.clean
    assert loaded.graph.seq == last.seq
    assert loaded.graph.head() == last.head
    assert set(loaded.graph.nodes) == set(eng.session(sid).graph.nodes)
    assert loaded.graph.nodes[first.node_ids[2]].answered
    assert loaded.graph.config.get("idleSeconds") == 60
    assert _log(backend.store(), sid) == _log(eng.store, sid)
    assert [e["seq"] for e in _log(eng.store, sid)] == list(range(1, last.seq + 1))
    assert again.list() == ["s1"]
    stat = eng.store.stat(sid)
    assert stat.size > 0 and stat.mtime > 0


def test_unknown_and_duplicate_sessions(backend: Backend) -> None:
    eng = backend.engine()
    with pytest.raises(UnknownSession):
        eng.session("nobody")
    assert not eng.library.exists("nobody")
    new_session(eng, "once")
    with pytest.raises(StoreFailure):
        eng.library.create("once")
    with pytest.raises(UnknownSession):
        eng.store.stat("nobody")


def test_a_reader_catches_up_with_a_writer(backend: Backend) -> None:
    writer, reader = backend.engine(), backend.engine()
    sid = new_session(writer, "shared")
    writer.append(sid, messages=[user("one")])
    assert _texts(reader, sid) == ["one"]
    writer.append(sid, messages=[assistant("two")])
    writer.append(sid, messages=[user("three")])
    assert _texts(reader, sid) == ["one", "two", "three"]
    res = reader.append(sid, messages=[assistant("four")])
    assert writer.session(sid).graph.head() == res.head
    assert [e["seq"] for e in _log(backend.store(), sid)] == [1, 2, 3, 4, 5]


def test_a_failed_write_writes_nothing(backend: Backend, monkeypatch: pytest.MonkeyPatch) -> None:
    eng = backend.engine()
    sid = new_session(eng, "fails")
    kept = eng.append(sid, messages=[user("kept")])
    before = _log(backend.store(), sid)
    backend.break_next_write(eng.store, monkeypatch)
    with pytest.raises(StoreFailure):
        eng.append(sid, messages=[assistant("lost")])
    assert _log(backend.store(), sid) == before
    assert eng.session(sid).graph.head() == kept.head, "a refused write applied nothing"
    after = eng.append(sid, messages=[assistant("retried")])
    assert after.seq == kept.seq + 1
    assert _texts(backend.engine(), sid) == ["kept", "retried"]


def test_content_that_cannot_be_stored_writes_nothing(backend: Backend) -> None:
    eng = backend.engine()
    sid = new_session(eng, "deep")
    before = _log(backend.store(), sid)
    deep: Any = "x"
    for _ in range(300):  # deeper than JSON can be written
        deep = [deep]
    with pytest.raises(InvalidContent):
        eng.append(sid, messages=[{"role": "user", "content": [{"type": "text", "text": deep}]}])
    assert _log(backend.store(), sid) == before


def test_expected_head_conflict_writes_nothing(backend: Backend) -> None:
    a, b = backend.engine(), backend.engine()
    sid = new_session(a, "conflict")
    first = a.append(sid, messages=[user("one")])
    b.append(sid, messages=[assistant("two from b")], expected_head=first.head)
    before = _log(backend.store(), sid)
    with pytest.raises(HeadConflict):
        a.append(sid, messages=[assistant("two from a")], expected_head=first.head)
    assert _log(backend.store(), sid) == before
    assert _texts(backend.engine(), sid) == ["one", "two from b"]


def test_concurrent_writers_lose_and_duplicate_nothing(backend: Backend) -> None:
    sid = new_session(backend.engine(), "race")
    engines = [backend.engine() for _ in range(4)]
    errors: list[BaseException] = []

    def write(k: int, eng: Engine) -> None:
        try:
            for i in range(25):
                eng.append(sid, messages=[user(f"w{k}-{i}")], allow_orphans=True)
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=write, args=(k, e)) for k, e in enumerate(engines)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    events = _log(backend.store(), sid)
    assert [e["seq"] for e in events] == list(range(1, 102))
    texts = _texts(backend.engine(), sid)
    assert sorted(texts) == sorted(f"w{k}-{i}" for k in range(4) for i in range(25))


def test_branches_and_checkout_survive_a_reload(backend: Backend) -> None:
    eng = backend.engine()
    sid = new_session(eng, "forks")
    a = eng.append(sid, messages=[user("root")])
    eng.append(sid, messages=[assistant("on main")])
    session = eng.session(sid)
    session.create_branch("alt", a.head)
    session.checkout("alt")
    alt = eng.append(sid, messages=[assistant("on alt")])
    g = backend.engine().session(sid).graph
    assert g.current_branch == "alt"
    assert g.head("alt") == alt.head
    assert g.head("main") != alt.head
    assert g.nodes[alt.head or ""].parent == a.head


def test_records_survive_a_reload(backend: Backend) -> None:
    eng = backend.engine()
    sid = new_session(eng, "recs")
    res = eng.append(sid, messages=[user("a"), assistant("b")])
    ids = eng.session(sid).add_records(
        [{"kind": "summary", "covers": res.node_ids, "data": {"text": "a and b"}}]
    )
    g = backend.engine().session(sid).graph
    assert [r.id for r in g.records] == ids
    assert g.records[0].covers == res.node_ids
    assert g.records[0].data == {"text": "a and b"}


def test_an_import_lands_whole_and_reloads_the_same(backend: Backend) -> None:
    eng = backend.engine()
    ids = eng.import_file(str(TRANSCRIPT)).session_ids
    assert ids
    for sid in ids:
        mine = eng.session(sid).graph
        loaded = backend.engine().session(sid)
        assert loaded.report.clean
        assert loaded.graph.seq == mine.seq > 10
        assert set(loaded.graph.nodes) == set(mine.nodes)
        assert orjson.dumps(_log(backend.store(), sid)) == orjson.dumps(_log(eng.store, sid))


def test_an_import_that_fails_leaves_no_session(
    backend: Backend, monkeypatch: pytest.MonkeyPatch
) -> None:
    eng = backend.engine()
    lib: Library = eng.library

    class Boom(Exception):
        pass

    session = lib.create("half", unborn=True)
    with pytest.raises(Boom), session.buffered():
        session.append([], allow_orphans=True)
        raise Boom
    assert not backend.engine().library.exists("half")
    assert "half" not in backend.store().list_sessions()


def test_counts_are_kept_beside_the_log_and_listed_with_it(backend: Backend) -> None:
    """A listing reads every session's stat and kept counts without loading one; counts
    taken before the log grew say so by their cursor (the caller counts again)."""
    eng = backend.engine()
    sid = new_session(eng, "counted")
    eng.append(sid, messages=[user("hello"), assistant("hi")])
    [(listed, stat, never)] = backend.store().listing()
    assert (listed, never) == (sid, None)
    kept = eng.keep_counts(sid)
    assert (kept.cursor, kept.turns) == (stat.cursor, 1) and kept.tokens > 0
    [(_, same, read)] = backend.store().listing()
    assert read == kept and same.cursor == kept.cursor
    eng.append(sid, messages=[user("again")])
    [(_, grown, stale)] = backend.store().listing()
    assert stale == kept and grown.cursor != kept.cursor
    assert backend.engine().keep_counts(sid).turns == 2


def test_the_request_log_reads_back_in_order_by_time_and_session(backend: Backend) -> None:
    """What the proxy records of each request: read back by another store object in the
    order written, from a time on (rows of earlier days too), of one session or all."""
    day = 86_400.0
    rows = [
        {"at": 10 * day + 5, "sessionId": "a", "kind": "request", "n": 1},
        {"at": 10 * day + 6, "sessionId": "b", "kind": "call", "n": 2},
        {"at": 12 * day + 1, "sessionId": "a", "kind": "passed", "n": 3},
    ]
    writer = backend.store()
    assert writer.read_requests() == []
    writer.log_requests(rows[:2])
    writer.log_requests(rows[2:])
    reader = backend.store()
    assert reader.read_requests() == rows
    assert [r["n"] for r in reader.read_requests(since=10 * day + 6)] == [2, 3]
    assert [r["n"] for r in reader.read_requests(session_id="a")] == [1, 3]
    assert reader.read_requests(since=11 * day, session_id="b") == []


@pytest.mark.parametrize("what", ["open", "import"])
def test_a_create_that_fails_part_way_leaves_nothing(
    backend: Backend, monkeypatch: pytest.MonkeyPatch, what: str
) -> None:
    """A full disk (or a failed statement) part-way through a create: a typed error, no
    session listed or loadable, and the same create succeeds once the cause is gone."""
    eng = backend.engine()
    backend.break_next_create(eng.store, monkeypatch)
    with pytest.raises(StoreFailure):
        if what == "open":
            eng.open("born")
        else:
            eng.import_file(str(TRANSCRIPT))
    monkeypatch.undo()
    other = backend.engine()
    assert other.list() == []
    assert not other.library.exists("born")
    assert backend.store().sweep() == []  # nothing torn was left behind either
    if what == "open":
        _, created = other.open("born")
        assert created and other.session("born").graph.seq == 1
    else:
        outcome = other.import_file(str(TRANSCRIPT))
        assert outcome.existing == []  # not a half import standing in for the file
        [sid] = outcome.session_ids
        other.append(sid, messages=[user("after the import")])
        assert backend.engine().session(sid).report.clean


def test_the_background_claim_is_held_by_one_at_a_time(backend: Backend) -> None:
    """Two processes' stores (here two store objects): while one holds a session's claim the
    other is refused without waiting; another session's claim is free; released, it is free."""
    a, b = backend.store(), backend.store()
    new_session(Engine(a), "claimed")
    new_session(Engine(a), "other")
    with a.claim("claimed") as mine:
        assert mine
        with b.claim("claimed") as theirs:
            assert not theirs
        with b.claim("other") as free:
            assert free
    with b.claim("claimed") as now_theirs:
        assert now_theirs


def test_a_held_lock_refuses_the_other_writer(
    backend: Backend, monkeypatch: pytest.MonkeyPatch
) -> None:
    """While one writer holds the session's lock another waits, then gets a typed refusal
    (the files' lock timeout; the database's lock_timeout), and nothing is written."""
    from compactd.context.stores import files, postgres

    monkeypatch.setattr(files, "LOCK_TIMEOUT_SECONDS", 0.3)
    monkeypatch.setattr(postgres, "LOCK_TIMEOUT_SECONDS", 0.3)
    holder, other = backend.store(), backend.engine()
    sid = new_session(other, "held")
    before = _log(backend.store(), sid)
    held, release = threading.Event(), threading.Event()

    def hold() -> None:
        with holder.locked(sid):
            held.set()
            release.wait(10)

    t = threading.Thread(target=hold)
    t.start()
    try:
        assert held.wait(10)
        with pytest.raises(StoreFailure) as caught:
            other.append(sid, messages=[user("blocked")])
        assert "locked" in str(caught.value)
        assert _log(backend.store(), sid) == before
    finally:
        release.set()
        t.join()
    other.append(sid, messages=[user("free again")])
    assert _texts(backend.engine(), sid) == ["free again"]
