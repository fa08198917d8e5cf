"""The durable store: fsync before acknowledging, torn tails, locking, modes and session ids."""

from __future__ import annotations

import os
import stat
import threading
from pathlib import Path
from typing import Any

import orjson
import pytest
from compactd.context.engine import Engine
from compactd.context.errors import CompactdError, InvalidSessionId, StoreFailure, UnknownSession
from compactd.context.session import Library
from compactd.context.stores import files as store_mod
from compactd.context.stores.files import FileStore, default_data_dir

from tests.engine.helpers import assistant, log_bytes, new_session, user


def _events(lib: Library, sid: str) -> list[dict[str, Any]]:
    events, report = lib.store.read_from(sid)
    assert report.clean
    return events


def test_append_is_fsynced_before_it_returns(
    engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The last write of an append is followed by an fsync of the log before append returns,
    and a fresh reader (a new store object) sees the data."""
    sid = new_session(engine, "s1")
    trace: list[tuple[str, str]] = []
    real_write, real_fsync = os.write, os.fsync

    def target(fd: int) -> str:
        return os.readlink(f"/proc/self/fd/{fd}")

    def write(fd: int, data: Any) -> int:
        trace.append(("write", target(fd)))
        return real_write(fd, data)

    def fsync(fd: int) -> None:
        real_fsync(fd)
        trace.append(("fsync", target(fd)))

    monkeypatch.setattr(os, "write", write)
    monkeypatch.setattr(os, "fsync", fsync)
    res = engine.append(sid, messages=[user("durable hello")])
    done = list(trace)
    monkeypatch.undo()

    log = str(engine.store.log_path(sid))
    writes = [i for i, (op, path) in enumerate(done) if op == "write" and path == log]
    assert writes, "the append wrote nothing to the log"
    assert ("fsync", log) in done[writes[-1] + 1 :], f"no fsync after the last write: {done}"

    fresh = Library(FileStore(engine.store.root)).load(sid)
    node = fresh.graph.nodes[res.node_ids[0]]
    assert node.content == [{"type": "text", "text": "durable hello"}]
    assert fresh.report.clean


def test_create_fsyncs_the_new_log(engine: Engine, monkeypatch: pytest.MonkeyPatch) -> None:
    """The log's bytes are durable before it has its name (written under a temporary one),
    and its directory entry after."""
    synced: list[tuple[str, tuple[int, int]]] = []
    real_fsync = os.fsync

    def fsync(fd: int) -> None:
        real_fsync(fd)
        info = os.fstat(fd)
        synced.append((os.readlink(f"/proc/self/fd/{fd}"), (info.st_dev, info.st_ino)))

    monkeypatch.setattr(os, "fsync", fsync)
    sid = new_session(engine, "fresh")
    monkeypatch.undo()
    log = engine.store.log_path(sid).stat()
    names = [name for name, _ in synced]
    first = next(i for i, (_, ino) in enumerate(synced) if ino == (log.st_dev, log.st_ino))
    assert Path(names[first]).name.startswith(".fresh.")  # synced before it was linked
    assert str(engine.store.sessions_dir) in names[first:]  # the new entry is durable too
    assert sorted(p.name for p in engine.store.sessions_dir.iterdir()) == [
        ".fresh.lock",
        "fresh.jsonl",
    ]


@pytest.mark.parametrize(
    "torn",
    [
        b'{"t":"node","seq":3,"ts":1.0,"n":{"id":"x","kind":"us',  # cut mid-event
        b"\x00\x00\x00",  # garbage
    ],
)
def test_torn_tail_is_reported_ignored_and_sealed(engine: Engine, torn: bytes) -> None:
    sid = new_session(engine, "torn")
    first = engine.append(sid, messages=[user("before the crash")])
    path = engine.store.log_path(sid)
    torn_line = path.read_bytes().count(b"\n") + 1
    with open(path, "ab") as fh:
        fh.write(torn)

    lib = Library(FileStore(engine.store.root))
    loaded = lib.load(sid)  # never fatal
    assert loaded.report.torn_tail
    assert loaded.report.bad_lines == []
    assert loaded.graph.seq == first.seq
    assert list(loaded.graph.nodes) == first.node_ids

    # a later append works and seals the torn bytes into one bad line of their own
    eng2 = Engine(FileStore(engine.store.root))
    after = eng2.append(sid, messages=[assistant("after the crash")])
    assert after.seq == first.seq + 1

    again = Library(FileStore(engine.store.root)).load(sid)
    assert not again.report.torn_tail
    assert again.report.bad_lines == [torn_line]
    assert set(again.graph.nodes) == {*first.node_ids, *after.node_ids}
    assert again.graph.nodes[after.node_ids[0]].content[0]["text"] == "after the crash"

    # and it stays exactly one bad line however much is appended later
    eng2.append(sid, messages=[user("and later")])
    final = Library(FileStore(engine.store.root)).load(sid)
    assert final.report.bad_lines == [torn_line]
    assert not final.report.torn_tail


def test_torn_tail_that_is_a_whole_event_without_its_newline(engine: Engine) -> None:
    """A crash between the last byte of an event and its newline leaves valid JSON with no
    newline. It was never acknowledged, so it must not come back once a later append seals
    it: the acknowledged event with the same seq wins."""
    sid = new_session(engine, "almost")
    first = engine.append(sid, messages=[user("one")])
    path = engine.store.log_path(sid)
    ghost = {
        "t": "node",
        "seq": first.seq + 1,
        "ts": 1.0,
        "n": {"id": "ghost", "kind": "assistant", "parent": first.node_ids[0], "content": []},
    }
    with open(path, "ab") as fh:
        fh.write(orjson.dumps(ghost))  # no newline: the append never completed

    eng2 = Engine(FileStore(engine.store.root))
    assert eng2.session(sid).report.torn_tail
    assert "ghost" not in eng2.session(sid).graph.nodes
    acked = eng2.append(sid, messages=[assistant("acknowledged")])

    reloaded = Library(FileStore(engine.store.root)).load(sid)
    assert "ghost" not in reloaded.graph.nodes
    assert acked.node_ids[0] in reloaded.graph.nodes
    assert reloaded.graph.head() == acked.node_ids[0]
    assert len(reloaded.report.bad_lines) == 1


def test_bad_line_in_the_middle_is_skipped(engine: Engine) -> None:
    sid = new_session(engine, "mid")
    engine.append(sid, messages=[user("a")])
    path = engine.store.log_path(sid)
    with open(path, "ab") as fh:
        fh.write(b"not json at all\n")
    engine.append(sid, messages=[assistant("b")])
    loaded = Library(FileStore(engine.store.root)).load(sid)
    assert loaded.report.bad_lines == [3]
    assert [n.kind for n in loaded.graph.nodes.values()] == ["user", "assistant"]


def test_a_log_without_a_header_is_not_a_session(store: FileStore) -> None:
    store.ensure_dirs()
    store.log_path("nohead").write_bytes(b"garbage\n")
    with pytest.raises(StoreFailure, match="no valid header"):
        Library(store).load("nohead")
    # a header of the right JSON shape but the wrong types is no better (and never a crash)
    store.log_path("badseq").write_bytes(b'{"t":"open","seq":"one","ts":1.0,"sid":"badseq"}\n')
    with pytest.raises(StoreFailure, match="no valid header"):
        Library(store).load("badseq")
    with pytest.raises(UnknownSession):
        Library(store).load("missing")


def test_files_0600_folders_0700_and_the_lock_file(engine: Engine, data_dir: Path) -> None:
    sid = new_session(engine, "modes")
    engine.append(sid, messages=[user("x")])
    log = engine.store.log_path(sid)
    lock = engine.store.lock_path(sid)
    assert lock.exists(), "writers take a file lock"
    for f in (log, lock):
        assert stat.S_IMODE(f.stat().st_mode) == 0o600, f
    for d in (data_dir, engine.store.sessions_dir):
        assert stat.S_IMODE(d.stat().st_mode) == 0o700, d


def test_folders_0700_even_under_a_permissive_umask(tmp_path: Path) -> None:
    old = os.umask(0)
    try:
        eng = Engine(FileStore(tmp_path / "deep" / "data"))
        eng.append(new_session(eng, "u"), messages=[user("x")])
    finally:
        os.umask(old)
    for d in (tmp_path / "deep" / "data", tmp_path / "deep" / "data" / "sessions"):
        assert stat.S_IMODE(d.stat().st_mode) == 0o700
    log = tmp_path / "deep" / "data" / "sessions" / "u.jsonl"
    assert stat.S_IMODE(log.stat().st_mode) == 0o600


def test_the_lock_excludes_other_writers(engine: Engine, monkeypatch: pytest.MonkeyPatch) -> None:
    """While one writer holds the session lock, another gets `StoreFailure`, and nothing is
    written."""
    sid = new_session(engine, "locked")
    monkeypatch.setattr(store_mod, "LOCK_TIMEOUT_SECONDS", 0.2)
    before = log_bytes(engine, sid)
    held, release = threading.Event(), threading.Event()

    def holder() -> None:
        with FileStore(engine.store.root).locked(sid):
            held.set()
            release.wait(5)

    t = threading.Thread(target=holder)
    t.start()
    try:
        assert held.wait(5)
        other = Engine(FileStore(engine.store.root))
        with pytest.raises(StoreFailure) as err:
            other.append(sid, messages=[user("blocked")])
        assert "locked" in str(err.value)
        assert log_bytes(engine, sid) == before
    finally:
        release.set()
        t.join()
    engine.append(sid, messages=[user("free again")])


def test_two_writers_see_each_other(store: FileStore) -> None:
    """A writer reads what the other appended before it writes (no lost update)."""
    a, b = Engine(store), Engine(FileStore(store.root))
    sid = new_session(a, "shared")
    a.append(sid, messages=[user("from a")])
    res_b = b.append(sid, messages=[assistant("from b")])
    res_a = a.append(sid, messages=[user("a again")])
    g = a.session(sid).graph
    assert g.nodes[res_a.node_ids[0]].parent == res_b.node_ids[0]
    assert [e["seq"] for e in _events(a.library, sid)] == [1, 2, 3, 4]


@pytest.mark.parametrize(
    "bad", ["../../etc/passwd", "a/b", "", ".hidden", "..", "a\\b", "x" * 200, "a\x00b", 7]
)
def test_bad_session_ids_are_rejected_and_create_nothing(tmp_path: Path, bad: Any) -> None:
    root = tmp_path / "inner" / "data"
    eng = Engine(FileStore(root))
    new_session(eng, "ok")  # the data dir exists
    before = sorted(str(p) for p in tmp_path.rglob("*"))
    for attempt in (
        lambda: eng.open(bad),
        lambda: eng.session(bad),
        lambda: eng.library.create(bad),
        lambda: eng.library.load(bad),
        lambda: eng.store.log_path(bad),
        lambda: eng.store.locked(bad).__enter__(),
    ):
        with pytest.raises(InvalidSessionId) as err:
            attempt()
        assert "invalid session id" in str(err.value)
    assert sorted(str(p) for p in tmp_path.rglob("*")) == before
    assert eng.list() == ["ok"]


def test_compactd_data_dir_is_respected(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    target = tmp_path / "from-env"
    monkeypatch.setenv("COMPACTD_DATA_DIR", str(target))
    assert default_data_dir() == target
    eng = Engine(FileStore())
    sid = new_session(eng, "envy")
    assert (target / "sessions" / f"{sid}.jsonl").is_file()
    assert Engine(FileStore()).list() == ["envy"]


def test_list_sessions_ignores_other_files(engine: Engine) -> None:
    new_session(engine, "b")
    new_session(engine, "a")
    (engine.store.sessions_dir / "notes.txt").write_text("x")
    assert engine.list() == ["a", "b"]
    with pytest.raises(StoreFailure):
        engine.library.create("a")


# ---- hardening --------------------------------------------------------------------------------


def test_an_existing_data_dir_keeps_its_mode_and_new_parents_are_private(tmp_path: Path) -> None:
    shared = tmp_path / "shared"
    shared.mkdir()
    os.chmod(shared, 0o755)  # shared on purpose
    old = os.umask(0)
    try:
        eng = Engine(FileStore(shared / "a" / "b" / "data"))
        eng.append(new_session(eng, "p"), messages=[user("x")])
    finally:
        os.umask(old)
    assert stat.S_IMODE(shared.stat().st_mode) == 0o755
    for d in (shared / "a", shared / "a" / "b", shared / "a" / "b" / "data"):
        assert stat.S_IMODE(d.stat().st_mode) == 0o700, d


@pytest.mark.parametrize("bad", ["a\n", "a\nb", "\na", "a\x00"])
def test_session_ids_match_their_pattern_in_full(engine: Engine, bad: str) -> None:
    with pytest.raises(InvalidSessionId):
        engine.open(bad)
    assert not engine.store.sessions_dir.exists() or not list(engine.store.sessions_dir.iterdir())


def test_a_symlinked_log_or_lock_is_never_followed(engine: Engine, tmp_path: Path) -> None:
    sid = new_session(engine, "linked")
    engine.append(sid, messages=[user("x")])
    outside = tmp_path / "outside.txt"
    outside.write_bytes(b"precious\n")
    log = engine.store.log_path(sid)
    log.unlink()
    log.symlink_to(outside)
    fresh = Engine(FileStore(engine.store.root))
    with pytest.raises(StoreFailure):
        fresh.session(sid)
    with pytest.raises(StoreFailure):
        engine.append(sid, messages=[assistant("y")])
    assert outside.read_bytes() == b"precious\n"
    # a lock file swapped for a symlink (dangling, so creating it would make the target)
    other = new_session(fresh, "locked")
    lock = fresh.store.lock_path(other)
    target = tmp_path / "made-through-a-link"
    lock.unlink()  # born with the log: replaced by a link
    lock.symlink_to(target)
    with pytest.raises(StoreFailure):
        fresh.append(other, messages=[user("x")])
    assert not target.exists()


def test_checkout_of_an_empty_or_bad_branch_name_writes_nothing(engine: Engine) -> None:
    sid = new_session(engine, "co")
    engine.append(sid, messages=[user("x")])
    before = log_bytes(engine, sid)
    for name in ["", "main\n", "../x"]:
        with pytest.raises(CompactdError) as info:
            engine.session(sid).checkout(name)
        assert info.value.kind == "unknown_branch"
    assert log_bytes(engine, sid) == before


# ---- creates that failed ----------------------------------------------------------------------


def test_the_sweep_moves_aside_what_failed_creates_left(store: FileStore) -> None:
    """A create killed before its log was linked (its temporary file, unheld), an older
    compactd's empty log: moved to `torn/`, never listed. A create in progress (its file
    held), and a temporary name that is only a second link of a finished log, are not."""
    import fcntl

    engine = Engine(store)
    new_session(engine, "whole")
    folder = store.sessions_dir
    (folder / ".killed.0123456789ab.creating").write_bytes(b'{"t":"open","seq":1')
    (folder / "empty.jsonl").write_bytes(b"")
    os.link(store.log_path("whole"), folder / ".whole.ba9876543210.creating")
    live = folder / ".live.aaaaaaaaaaaa.creating"
    live.write_bytes(b"")
    held = os.open(live, os.O_RDONLY)
    fcntl.flock(held, fcntl.LOCK_EX)
    try:
        assert store.list_sessions() == ["whole"]  # the empty log was never a session
        moved = store.sweep()
    finally:
        os.close(held)
    assert len(moved) == 2 and any("empty.jsonl" in m for m in moved), moved
    assert sorted(p.name.split(".")[0] for p in (store.root / "torn").iterdir()) == [
        "empty",
        "killed",
    ]
    assert stat.S_IMODE((store.root / "torn").stat().st_mode) == 0o700
    assert sorted(p.name for p in folder.iterdir()) == [
        ".live.aaaaaaaaaaaa.creating",
        ".whole.lock",
        "whole.jsonl",
    ]
    assert Library(FileStore(store.root)).load("whole").report.clean
    engine.open("empty")  # the id is free again
    [released] = store.sweep()  # its creator is gone now
    assert released.startswith(f"{live.name} (a create that never finished): moved to torn/")


def test_a_torn_request_row_is_skipped_and_never_swallows_the_next(store: FileStore) -> None:
    """The request log is a figure, not fsync'ed: a row a failed write left half-written is
    skipped on read, sealed before the next write, and the day's file is 0600."""
    store.log_requests([{"at": 100.0, "sessionId": "s", "n": 1}])
    [path] = list(store.requests_dir.iterdir())
    with path.open("ab") as f:
        f.write(b'{"at": 100.5, "sessionId": "s", "n"')  # a row cut by a full disk
    store.log_requests([{"at": 101.0, "sessionId": "s", "n": 2}])
    assert [r["n"] for r in FileStore(store.root).read_requests()] == [1, 2]
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE(store.requests_dir.stat().st_mode) == 0o700
