"""A fleet: daemons with data dirs of their own on one PostgreSQL database (`--store`).

Concurrent appends from two daemons to one session lose and duplicate nothing, and each daemon
hears of the other's through `session/changed` (NOTIFY); a daemon killed with SIGKILL in the
middle of its appends loses none it acknowledged; a lost connection is survived and said on
`window/logMessage`; the store URL is checked before the daemon serves.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import psycopg
import pytest
from compactd.clients.client import CompactdClient
from compactd.context.stores import open_store

from .conftest import ON_POSTGRES, spawn
from .convo import tool_turns, user

pytestmark = pytest.mark.skipif(
    ON_POSTGRES, reason="starts its own databases; it runs once, in the files run"
)
PER_DAEMON = 300
WAIT = 60.0  # a hang detector: a busy machine answers well inside it


class Listener:
    """Every `session/changed` and `window/logMessage` a daemon sent."""

    def __init__(self, client: CompactdClient) -> None:
        self.client = client
        self.changed: list[dict[str, Any]] = []
        self.logs: list[dict[str, Any]] = []
        client.on_notification("session/changed", self.changed.append)
        client.on_notification("window/logMessage", self.logs.append)

    def events_seen(self, sid: str) -> int:
        return sum(c["events"] for c in self.changed if c["sessionId"] == sid)

    async def until(self, check: Any) -> None:
        async def wait() -> None:
            while not check():
                await asyncio.sleep(0.05)

        await asyncio.wait_for(wait(), WAIT)


def stored_texts(url: str, sid: str) -> tuple[list[int], list[str]]:
    """The session's seqs and its user texts, read straight from the database."""
    store = open_store(url, None)
    try:
        events, report = store.read_from(sid, 0)
    finally:
        store.close()
    assert report.clean
    texts = [
        e["n"]["content"][0]["text"]
        for e in events
        if e["t"] == "node" and e["n"]["kind"] == "user"
    ]
    return [e["seq"] for e in events], texts


async def test_two_daemons_append_300_each_to_one_session(pg_url: str, tmp_path: Path) -> None:
    a, b = await asyncio.gather(
        spawn(tmp_path / "a", "--store", pg_url), spawn(tmp_path / "b", "--store", pg_url)
    )
    la, lb = Listener(a), Listener(b)
    try:
        sid = "fleet"
        await a.open_session(sid)
        await b.open_session(sid)

        async def burst(client: CompactdClient, tag: str) -> list[Any]:
            return await asyncio.gather(
                *(client.append(sid, [user(f"{tag}-{i}")]) for i in range(PER_DAEMON))
            )

        acked_a, acked_b = await asyncio.gather(burst(a, "a"), burst(b, "b"))
        seqs, texts = stored_texts(pg_url, sid)
        expected = {f"{tag}-{i}" for tag in "ab" for i in range(PER_DAEMON)}
        duplicated = [t for t, n in collections.Counter(texts).items() if n > 1]
        lost = expected - set(texts)
        print(f"\nfleet: {len(texts)} stored, {len(lost)} lost, {len(duplicated)} duplicated")
        assert (len(lost), len(duplicated)) == (0, 0)
        assert seqs == list(range(1, 2 * PER_DAEMON + 2))  # the open event, then one per append
        view = await a.get(sid)
        node_ids = {n["id"] for n in view["nodes"]}
        assert {i for r in [*acked_a, *acked_b] for i in r.node_ids} == node_ids

        # each daemon applied each of the other's appends once, and said so
        await la.until(lambda: la.events_seen(sid) >= PER_DAEMON)
        await lb.until(lambda: lb.events_seen(sid) >= PER_DAEMON)
        await asyncio.sleep(0.3)  # a late duplicate would show up here
        assert la.events_seen(sid) == lb.events_seen(sid) == PER_DAEMON
        for listener in (la, lb):
            seen = [c["seq"] for c in listener.changed if c["sessionId"] == sid]
            assert seen == sorted(set(seen))
        ra, rb = await asyncio.gather(a.render(sid), b.render(sid))
        assert ra.request == rb.request
    finally:
        codes = await asyncio.gather(a.close(), b.close())
    assert codes == [0, 0]


async def test_an_idle_daemon_hears_of_appends_through_notify(pg_url: str, tmp_path: Path) -> None:
    """B only listens: what A appends reaches B's client without B being asked anything."""
    a, b = await asyncio.gather(
        spawn(tmp_path / "a", "--store", pg_url), spawn(tmp_path / "b", "--store", pg_url)
    )
    lb = Listener(b)
    try:
        sid = "fleet-notify"
        await a.open_session(sid)
        await b.open_session(sid)
        appended = await a.append(sid, [user("from A")])
        await lb.until(lambda: lb.events_seen(sid) == 1)
        (changed,) = [c for c in lb.changed if c["sessionId"] == sid]
        assert changed["heads"]["main"] == appended.head
    finally:
        codes = await asyncio.gather(a.close(), b.close())
    assert codes == [0, 0]


async def test_sigkill_mid_append_loses_nothing_acknowledged(pg_url: str, tmp_path: Path) -> None:
    a, b = await asyncio.gather(
        spawn(tmp_path / "a", "--store", pg_url), spawn(tmp_path / "b", "--store", pg_url)
    )
    sid = "fleet-kill"
    acked: list[str] = []
    try:
        await a.open_session(sid)
        await b.open_session(sid)

        assert a.process is not None
        pid = a.process.pid
        killed = False
        in_flight = 0  # sent before the kill, never answered

        async def one(i: int) -> None:
            nonlocal killed, in_flight
            sent_before_kill = not killed
            try:
                await a.append(sid, [user(f"a-{i}")])
            except Exception:
                in_flight += sent_before_kill
                return
            acked.append(f"a-{i}")
            if len(acked) == 50 and not killed:  # with a window of appends still queued
                killed = True
                os.kill(pid, signal.SIGKILL)

        async def lane(start: int) -> None:  # 30 lanes: 30 appends always on their way
            for i in range(start, PER_DAEMON, 30):
                if killed:
                    return
                await one(i)

        survivor = asyncio.gather(*(b.append(sid, [user(f"b-{i}")]) for i in range(100)))
        await asyncio.gather(*(lane(k) for k in range(30)))
        await a.process.wait()
        await asyncio.wait_for(survivor, WAIT)  # B is not held up by A's dead transaction
        after = await b.append(sid, [user("after the kill")])
    finally:
        with contextlib.suppress(Exception):
            await a.close(timeout=2)
        code_b = await b.close()
    assert code_b == 0
    assert in_flight > 0, "the kill came after every append: it was not mid-append"

    _seqs, texts = stored_texts(pg_url, sid)
    lost = [t for t in acked if t not in texts]
    duplicated = [t for t, n in collections.Counter(texts).items() if n > 1]
    print(f"\nkill -9: {len(acked)} acknowledged by A, {in_flight} in flight, {len(lost)} lost")
    assert lost == [] and duplicated == []
    assert {f"b-{i}" for i in range(100)} <= set(texts)
    # a new daemon on a fresh data dir resumes the session: nothing lived on A's machine
    async with await CompactdClient.spawn(
        data_dir=str(tmp_path / "c"), args=["--store", pg_url]
    ) as c:
        view = await c.get(sid)
        assert view["head"] == after.head
        assert len(view["nodes"]) == len(texts)


async def test_a_lost_connection_is_survived_and_said(pg_url: str, tmp_path: Path) -> None:
    client = await spawn(tmp_path / "a", "--store", pg_url)
    listener = Listener(client)
    try:
        sid = "fleet-lost"
        await client.open_session(sid)
        await client.append(sid, [user("before")])
        with psycopg.connect(pg_url, autocommit=True) as admin:
            killed = admin.execute(
                "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
                "WHERE application_name LIKE 'compactd%%' AND pid <> pg_backend_pid()"
            ).fetchone()
        assert killed is not None and killed[0] >= 2  # the pool's and the listener's
        result = await client.append(sid, [user("after")])
        assert result.node_ids
        with contextlib.suppress(TimeoutError):
            await listener.until(lambda: any("again" in m["message"] for m in listener.logs))
        messages = [m["message"] for m in listener.logs]
        assert any("lost the connection" in m for m in messages), messages
        assert any("reconnected" in m for m in messages), messages
        assert any("listening to the session store" in m for m in messages), messages
        _seqs, texts = stored_texts(pg_url, sid)
        assert texts == ["before", "after"]
        status = await client.status()
        assert status.data_dir.startswith("postgresql://") and "password" not in status.data_dir
    finally:
        code = await client.close()
    assert code == 0


def _serve(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "compactd", "--data-dir", str(tmp_path), "serve", *args],
        input="",
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_an_unsupported_store_url_is_refused_by_name(tmp_path: Path) -> None:
    out = _serve(tmp_path, "--store", "mysql://user:secret@db/x")
    assert out.returncode == 2
    assert "unsupported store URL" in out.stderr and "postgresql" in out.stderr
    assert "secret" not in out.stderr


def test_a_newer_schema_is_refused(pg_url: str, tmp_path: Path) -> None:
    open_store(pg_url, None).close()  # creates the schema
    with psycopg.connect(pg_url, autocommit=True) as admin:
        admin.execute("INSERT INTO compactd.schema_version (version) VALUES (99)")
    out = _serve(tmp_path, "--store", pg_url)
    assert out.returncode == 2
    assert "schema version 99" in out.stderr and "upgrade compactd" in out.stderr


async def test_idle_work_runs_on_one_daemon_only(pg_url: str, tmp_path: Path) -> None:
    """Two daemons hold the session when it goes idle; the claim (an advisory lock) lets one
    clear, and the other reads that clear instead of writing its own. While someone else
    holds the claim, neither does anything."""
    short = ("--store", pg_url, "--idle-seconds", "1", "--idle-check-seconds", "0.1")
    a, b = await asyncio.gather(spawn(tmp_path / "a", *short), spawn(tmp_path / "b", *short))
    heard: list[dict[str, Any]] = []
    for client in (a, b):
        client.on_notification("session/idle", heard.append)
    try:
        sid = "fleet-idle"
        key = f"compactd:{sid}"
        with psycopg.connect(pg_url, autocommit=True) as third:
            # a third holder of the claim: while it has it, neither daemon does idle work
            third.execute("SELECT pg_advisory_lock(hashtextextended(%s, 0))", (key,))
            await a.open_session(sid)
            await a.append(sid, tool_turns("idle", 8))
            await b.open_session(sid)
            await asyncio.sleep(2.0)  # past the idle threshold, many idle checks
            assert heard == []
            third.execute("SELECT pg_advisory_unlock(hashtextextended(%s, 0))", (key,))

        async def cleared() -> None:
            while not heard:
                await asyncio.sleep(0.05)

        await asyncio.wait_for(cleared(), WAIT)
        await asyncio.sleep(1.0)  # both idle loops run several more times
        view = await b.get(sid)
    finally:
        codes = await asyncio.gather(a.close(), b.close())
    assert codes == [0, 0]
    assert len(heard) == 1, heard
    assert sorted(r["kind"] for r in view["records"]) == ["clear", "idle"]  # one of each
