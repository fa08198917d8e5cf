"""What only the PostgreSQL store has: a commit whose answer is lost with the connection.

The store then asks, on a new connection, whether the append's batch id landed: if it did the
append is acknowledged once (never written again); if not, it fails typed with nothing written.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from compactd.context.engine import Engine
from compactd.context.errors import StoreUnavailable
from compactd.context.stores import open_store

from tests.engine.helpers import new_session, user


@pytest.fixture
def pg(pg_url: str) -> Iterator[Any]:
    store = open_store(pg_url, None, log=lambda level, message: said.append((level, message)))
    said.clear()
    yield store
    store.close()


said: list[tuple[str, str]] = []


def _lose_the_commit_answer(monkeypatch: pytest.MonkeyPatch, *, commit: bool) -> None:
    """The next COMMIT is sent as COMMIT (or ROLLBACK), then the connection 'drops'."""
    real = psycopg.Connection.execute

    def execute(self: Any, query: Any, *args: Any, **kw: Any) -> Any:
        if query == "COMMIT":
            monkeypatch.setattr(psycopg.Connection, "execute", real)
            real(self, "COMMIT" if commit else "ROLLBACK")
            raise psycopg.OperationalError("server closed the connection unexpectedly")
        return real(self, query, *args, **kw)

    monkeypatch.setattr(psycopg.Connection, "execute", execute)


def _texts(store: Any, sid: str) -> list[str]:
    events, _ = store.read_from(sid, 0)
    return [e["n"]["content"][0]["text"] for e in events if e["t"] == "node"]


def test_a_commit_that_landed_is_acknowledged_once(
    pg: Any, pg_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    eng = Engine(pg)
    sid = new_session(eng, "landed")
    _lose_the_commit_answer(monkeypatch, commit=True)
    res = eng.append(sid, messages=[user("once")])
    assert res.node_ids
    assert _texts(pg, sid) == ["once"]
    assert any("checking whether the append landed" in m for _, m in said)
    eng.append(sid, messages=[user("twice")])
    assert _texts(open_store(pg_url, None), sid) == ["once", "twice"]


def test_a_commit_that_did_not_land_fails_typed(pg: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    eng = Engine(pg)
    sid = new_session(eng, "not-landed")
    _lose_the_commit_answer(monkeypatch, commit=False)
    with pytest.raises(StoreUnavailable) as caught:
        eng.append(sid, messages=[user("lost")])
    assert caught.value.data["written"] is False
    assert caught.value.kind == "store_failure"  # 4060 on the wire
    assert _texts(pg, sid) == []
    assert eng.session(sid).graph.seq == 1  # nothing applied in memory either
    eng.append(sid, messages=[user("retried")])
    assert _texts(pg, sid) == ["retried"]


def test_an_unreachable_database_is_a_clear_error(tmp_path: Any) -> None:
    with pytest.raises(StoreUnavailable) as caught:
        open_store(f"postgresql:///nope?host={tmp_path}&user=postgres&password=secret", None)
    assert "cannot connect to the session store" in str(caught.value)
    assert "secret" not in str(caught.value)


def test_a_database_of_the_first_schema_is_brought_up_to_date(pg_url: str) -> None:
    """A database an older compactd set up (schema 1, a session in it) gains the table of
    listing counts and the request log; its sessions are untouched and listed."""
    from compactd.context.stores import postgres

    with psycopg.connect(pg_url, autocommit=True) as conn, conn.transaction():
        conn.execute("CREATE SCHEMA compactd")
        conn.execute(
            "CREATE TABLE compactd.schema_version (version integer PRIMARY KEY, "
            "installed timestamptz NOT NULL DEFAULT now())"
        )
        for statement in postgres.SCHEMA_V1:
            conn.execute(statement)  # type: ignore[call-overload]
        conn.execute("INSERT INTO compactd.schema_version (version) VALUES (1)")
        conn.execute("INSERT INTO compactd.sessions (sid, head_seq, bytes) VALUES ('old', 1, 9)")
        conn.execute(
            "INSERT INTO compactd.events (sid, seq, batch, body) VALUES ('old', 1, "
            "gen_random_uuid(), %s::json)",
            ('{"t":"open","seq":1,"ts":1.0,"sid":"old","config":{},"meta":{}}',),
        )
    store = open_store(pg_url, None)
    try:
        [(sid, stat, counts)] = store.listing()
        assert (sid, stat.cursor, counts) == ("old", 1, None)
        kept = Engine(store).keep_counts("old")
        assert store.listing()[0][2] == kept
        store.log_requests([{"at": 1.0, "sessionId": "old", "kind": "request"}])
        assert store.read_requests(session_id="old") == [
            {"at": 1.0, "sessionId": "old", "kind": "request"}
        ]
    finally:
        store.close()
    with psycopg.connect(pg_url) as conn:
        versions = [r[0] for r in conn.execute("SELECT version FROM compactd.schema_version")]
    assert sorted(versions) == [1, 2, 3]
