"""No request waits behind another session's work, and one session's requests keep their order,
through a real daemon on both stores.

A session's work is held up from outside, deterministically: the test takes the session's
writer lock itself (the files' lock file; the session's row in PostgreSQL), so an append to it
waits inside the daemon. Meanwhile another session's requests are answered, and the held
session's next request waits its turn behind the append. (How fast is a benchmark's business:
`bench/cases/responsive.py`.) Listing reads the counts kept beside each log: shown as kept even
when the log's content changed under them (the same size, the same seq), so nothing was read."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

import pytest
from filelock import FileLock

from tests.support.postgres import daemon_store_url

from .convo import assistant, tool_turns, user
from .wire import seeded_daemon

pytestmark = pytest.mark.asyncio(loop_scope="module")


@contextlib.contextmanager
def writer_lock_held(data_dir: Path, session_id: str) -> Iterator[None]:
    """Hold the session's writer lock as another daemon would, mid-append."""
    url = daemon_store_url(data_dir)
    if url is None:
        lock = FileLock(str(data_dir / "sessions" / f".{session_id}.lock"))
        with lock:
            yield
        return
    import psycopg

    with psycopg.connect(url) as conn, conn.transaction():
        conn.execute("SELECT 1 FROM compactd.sessions WHERE sid = %s FOR UPDATE", (session_id,))
        yield


async def test_a_held_session_holds_up_only_itself(tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    sessions = {"held": [user("one")], "free": [user("two")]}
    async with seeded_daemon(data_dir, sessions) as raw:
        with writer_lock_held(data_dir, "held"):
            start = len(raw.received)
            blocked = raw.send_request(
                "session/append", {"sessionId": "held", "messages": [assistant("later")]}
            )
            after = raw.send_request("session/get", {"sessionId": "held"})
            for method, params in [
                ("session/append", {"sessionId": "free", "messages": [assistant("now")]}),
                ("session/get", {"sessionId": "free"}),
                ("context/render", {"sessionId": "free"}),
                ("session/list", {"prefix": "free"}),
                ("daemon/status", {}),
            ]:
                reply = await raw.request(method, params)
                assert "result" in reply, reply
            answered = {m.get("id") for m in raw.replies_since(start)}
            assert blocked not in answered and after not in answered
        got = await raw.response(after, start=start)
        appended = await raw.response(blocked, start=start)
        assert "result" in appended, appended
        order = [m.get("id") for m in raw.replies_since(start)]
        assert order.index(blocked) < order.index(after), "one session's requests in order"
        assert got["result"]["head"] == appended["result"]["head"]  # it saw the append


async def test_a_listing_reads_the_counts_kept_beside_each_log(tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    async with seeded_daemon(data_dir, {"counted": tool_turns("c", 3, 900)}) as raw:
        [first] = (await raw.call("session/list"))["sessions"]
        assert first["turns"] == 3 and first["tokens"] > 600
    rewrite_content_keeping_its_size(data_dir, "counted")
    async with seeded_daemon(data_dir, {}) as raw:
        [again] = (await raw.call("session/list"))["sessions"]
        assert (again["turns"], again["tokens"]) == (first["turns"], first["tokens"])
        # written to: counted again, from what the log now holds
        await raw.call("session/append", {"sessionId": "counted", "messages": [user("more")]})
        [grown] = (await raw.call("session/list"))["sessions"]
        assert grown["turns"] == 4 and grown["tokens"] < first["tokens"]


def rewrite_content_keeping_its_size(data_dir: Path, session_id: str) -> None:
    """Every tool result's text replaced by as many spaces: the same size (the same seqs on
    PostgreSQL), far fewer tokens — a listing that counted would see it."""
    import orjson

    def blank(event: dict[str, object]) -> dict[str, object]:
        if event.get("t") == "result" and isinstance(event.get("content"), str):
            encoded = len(orjson.dumps(event["content"])) - 2  # the bytes it takes in a line
            return {**event, "content": " " * encoded}
        return event

    url = daemon_store_url(data_dir)
    if url is None:
        log = data_dir / "sessions" / f"{session_id}.jsonl"
        lines = log.read_bytes().splitlines()
        log.write_bytes(b"".join(orjson.dumps(blank(orjson.loads(x))) + b"\n" for x in lines))
        return
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT seq, body::text FROM compactd.events WHERE sid = %s", (session_id,)
        ).fetchall()
        for seq, body in rows:
            conn.execute(
                "UPDATE compactd.events SET body = %s::json WHERE sid = %s AND seq = %s",
                (orjson.dumps(blank(orjson.loads(body))).decode(), session_id, seq),
            )
