"""`compactd migrate`: files → PostgreSQL → files, idempotent, verified, refusing divergence."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from compactd.context.engine import Engine
from compactd.context.stores import open_store
from compactd.context.stores.files import FileStore
from compactd.context.stores.migrate import digest, migrate

from tests.engine.helpers import assistant, new_session, user

TRANSCRIPT = (
    Path(__file__).resolve().parents[1]
    / "data/transcripts/claude-code/fe5e1c67-53e7-4862-81ae-d0e013e3270b.jsonl"
)


def _events(store: Any, sid: str) -> list[dict[str, Any]]:
    return list(store.read_from(sid, 0)[0])


@pytest.fixture
def files(tmp_path: Path) -> Engine:
    """A data dir with an imported transcript, a short session, and one with a torn tail."""
    eng = Engine(FileStore(tmp_path / "data"))
    eng.import_file(str(TRANSCRIPT))
    sid = new_session(eng, "short")
    eng.append(sid, messages=[user("hello"), assistant("hi")])
    torn = new_session(eng, "torn")
    eng.append(torn, messages=[user("kept")])
    with open(eng.store.log_path(torn), "ab") as fh:
        fh.write(b'{"t":"node","seq":3,')
    return eng


def test_files_to_postgres_and_back(files: Engine, pg_url: str, tmp_path: Path) -> None:
    pg = open_store(pg_url, None)
    rows = [{"at": 1.0 + i, "sessionId": "short", "kind": "request", "n": i} for i in range(3)]
    files.store.log_requests(rows)
    try:
        first = migrate(files.store, pg)
        assert first.ok
        assert first.requests == 3 and pg.read_requests() == rows  # what `stats` sums goes too
        assert {c.action for c in first.sessions} == {"copied"}
        assert sorted(pg.list_sessions()) == files.list()
        for sid in files.list():
            assert digest(_events(pg, sid)) == digest(_events(files.store, sid))
        (torn,) = [c for c in first.sessions if c.session_id == "torn"]
        assert torn.skipped_lines == 1 and torn.events == 2
        # the sessions load and render the same from the database
        on_pg = Engine(pg)
        for sid in files.list():
            assert on_pg.session(sid).graph.nodes.keys() == files.session(sid).graph.nodes.keys()

        # a second run writes nothing
        again = migrate(files.store, pg)
        assert {c.action for c in again.sessions} == {"present"}
        assert again.requests == 0 and len(pg.read_requests()) == 3

        # more appended to the files: a rerun appends the rest
        files.append("short", messages=[user("and more")])
        third = migrate(files.store, pg)
        assert {c.session_id: c.action for c in third.sessions}["short"] == "extended"
        assert digest(_events(pg, "short")) == digest(_events(files.store, "short"))

        # and back into an empty data dir
        back = FileStore(tmp_path / "back")
        files.store.log_requests([{"at": 9.0, "sessionId": "short", "kind": "request", "n": 9}])
        assert migrate(files.store, pg).requests == 1  # only the row written since
        home = migrate(pg, back)
        assert home.ok and {c.action for c in home.sessions} == {"copied"}
        assert back.read_requests() == files.store.read_requests()
        for sid in files.list():
            assert _events(back, sid) == _events(files.store, sid)
    finally:
        pg.close()


def test_a_diverged_session_is_refused_and_left_alone(files: Engine, pg_url: str) -> None:
    pg = open_store(pg_url, None)
    try:
        migrate(files.store, pg)
        Engine(pg).append("short", messages=[user("only in the database")])
        files.append("short", messages=[user("only in the files")])
        before = _events(pg, "short")
        report = migrate(files.store, pg)
        assert not report.ok
        assert {c.session_id: c.action for c in report.sessions}["short"] == "conflict"
        assert _events(pg, "short") == before
    finally:
        pg.close()


def test_the_cli(files: Engine, pg_url: str) -> None:
    def run(*args: str) -> subprocess.CompletedProcess[str]:
        cmd = [sys.executable, "-m", "compactd", "--data-dir", str(files.store.root), "migrate"]
        return subprocess.run(
            [*cmd, *args], capture_output=True, text=True, timeout=120, check=False
        )

    out = run("--to", pg_url)
    assert out.returncode == 0, out.stderr
    assert f"{len(files.list())} copied" in out.stdout
    out = run("--to", pg_url)
    assert out.returncode == 0 and f"0 copied, 0 extended, {len(files.list())} present" in (
        out.stdout
    )
    out = run("--to", "sqlite:///x.db")
    assert out.returncode == 2 and "postgresql" in out.stderr
