"""The session store on PostgreSQL, for a fleet of daemons that keep no state of their own.

The same log as the files, one row per event: `compactd.events (sid, seq)` is the primary key,
`body` the event's JSON exactly as the files hold it. A write is one transaction: it locks the
session's row (`SELECT … FOR UPDATE`, the files' lock), reads what others appended (so an
`expectedHead` check sees them), inserts, and commits; it is acknowledged only after the commit.
Every append carries a batch id, so when the connection drops during the commit the store can
ask afterwards whether it landed and never writes it twice. Appends `NOTIFY compactd_changed`
with the session id; `watch()` is the other side. Background work takes a session-level
advisory lock (`claim`), so two daemons never run one session's idle work at once.

The schema lives in the `compactd` schema and is created and versioned here
(`compactd.schema_version`); a daemon refuses a database whose schema is newer than it knows.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any, TypeVar

import orjson
import psycopg
import psycopg.errors
from psycopg import pq
from psycopg_pool import ConnectionPool, PoolTimeout

from ..errors import StoreFailure, StoreUnavailable, UnknownSession
from ..policy import MAX_MESSAGE_BYTES
from .interface import (
    LOCK_TIMEOUT_SECONDS,
    Listed,
    LoadReport,
    Logger,
    SessionCounts,
    SessionStat,
    check_session_id,
    log_lines,
)

T = TypeVar("T")

SCHEMA_VERSION = 3
CHANNEL = "compactd_changed"
SCHEMA_LOCK = 0x636F6D70  # an advisory lock key ("comp") serializing schema creation
RECONNECT_SECONDS = 10.0
"""How long an operation that is safe to repeat (a read, taking the lock) keeps retrying a lost
connection, with backoff, before it fails with `StoreUnavailable`."""
BACKOFF_FIRST, BACKOFF_MAX = 0.05, 2.0

SCHEMA_V1 = (
    """CREATE TABLE compactd.sessions (
        sid text PRIMARY KEY,
        created timestamptz NOT NULL DEFAULT now(),
        updated timestamptz NOT NULL DEFAULT now(),
        head_seq bigint NOT NULL,
        bytes bigint NOT NULL
    )""",
    """CREATE TABLE compactd.events (
        sid text NOT NULL REFERENCES compactd.sessions (sid),
        seq bigint NOT NULL,
        batch uuid NOT NULL,
        body json NOT NULL,
        PRIMARY KEY (sid, seq)
    )""",
    "CREATE INDEX events_batch ON compactd.events (batch)",
)
SCHEMA_V2 = (
    # what a listing shows of each session, as of one seq (`keep_counts`): a cache
    """CREATE TABLE compactd.counts (
        sid text PRIMARY KEY REFERENCES compactd.sessions (sid),
        cursor bigint NOT NULL,
        body json NOT NULL
    )""",
)
SCHEMA_V3 = (
    # the request log: what the proxy records of each request and each call of compactd's
    """CREATE TABLE compactd.requests (
        id bigserial PRIMARY KEY,
        sid text,
        at double precision NOT NULL,
        body json NOT NULL
    )""",
    "CREATE INDEX requests_at ON compactd.requests (at)",
    "CREATE INDEX requests_sid ON compactd.requests (sid, id)",
)
MIGRATIONS = {1: SCHEMA_V1, 2: SCHEMA_V2, 3: SCHEMA_V3}
"""The statements that take the schema from the version before to each version."""

INSERT_EVENTS = """
    INSERT INTO compactd.events (sid, seq, batch, body)
    SELECT %(sid)s, s, %(batch)s, b::json
    FROM unnest(%(seqs)s::bigint[], %(bodies)s::text[]) AS t(s, b)
"""


class SchemaTooNew(StoreFailure):
    """The database was set up by a newer compactd; this one must not write to it."""


class PostgresStore:
    """Sessions in one PostgreSQL database (see the module docstring)."""

    def __init__(
        self, url: str, *, location: str, log: Logger | None = None, max_connections: int = 8
    ) -> None:
        self.url = url
        self.location = location  # the URL without its password
        self.max_event_bytes = MAX_MESSAGE_BYTES  # the policy's maxMessageBytes (engine sets it)
        self.log = log
        self._local = threading.local()
        try:  # a bad URL or password fails now, with the server's own words
            psycopg.connect(url, connect_timeout=int(RECONNECT_SECONDS)).close()
        except psycopg.Error as exc:
            raise StoreUnavailable(
                f"cannot connect to the session store {self.location}: {_first_line(exc)}",
                url=self.location,
                written=False,
            ) from None
        self._pool = ConnectionPool(
            url,
            min_size=1,
            max_size=max_connections,
            kwargs={"autocommit": True, "application_name": "compactd"},
            configure=_configure,
            timeout=RECONNECT_SECONDS,
            open=False,
            name="compactd",
        )
        try:
            self._pool.open(wait=True, timeout=RECONNECT_SECONDS)
        except PoolTimeout:
            self._pool.close()
            raise StoreUnavailable(
                f"cannot connect to the session store {self.location} within "
                f"{RECONNECT_SECONDS:g} s",
                url=self.location,
                written=False,
            ) from None
        try:
            self._ensure_schema()
        except BaseException:
            self._pool.close()
            raise

    # ---- lifecycle -----------------------------------------------------------------------

    def unchanged(self, session_id: str, offset: int) -> bool:
        return False  # a query costs what reading nothing does: the caller reads

    def forget(self, session_id: str) -> None:
        return None  # nothing is kept per session

    def close(self) -> None:
        self._pool.close()

    def sweep(self) -> list[str]:
        """Nothing to sweep: a create is one transaction, whole or absent."""
        return []

    def _say(self, level: str, message: str) -> None:
        """Tell the owner; a listener that fails must not fail the store's own work."""
        if self.log is not None:
            with contextlib.suppress(Exception):
                self.log(level, message)

    def _ensure_schema(self) -> None:
        """Create the schema on first use; refuse one newer than this code."""

        def setup(conn: psycopg.Connection[Any]) -> None:
            with conn.transaction():
                conn.execute("SELECT pg_advisory_xact_lock(%s)", (SCHEMA_LOCK,))
                conn.execute("CREATE SCHEMA IF NOT EXISTS compactd")
                conn.execute(
                    "CREATE TABLE IF NOT EXISTS compactd.schema_version ("
                    "version integer PRIMARY KEY, installed timestamptz NOT NULL DEFAULT now())"
                )
                row = conn.execute("SELECT max(version) FROM compactd.schema_version").fetchone()
                found = row[0] if row else None
                if found is not None and found > SCHEMA_VERSION:
                    raise SchemaTooNew(
                        f"the session store {self.location} has compactd schema version "
                        f"{found}, newer than this compactd knows ({SCHEMA_VERSION}); upgrade "
                        "compactd on this machine, or point it at another database",
                        found=found,
                        supported=SCHEMA_VERSION,
                    )
                for version in range((found or 0) + 1, SCHEMA_VERSION + 1):
                    for statement in MIGRATIONS[version]:
                        conn.execute(statement)
                    conn.execute(
                        "INSERT INTO compactd.schema_version (version) VALUES (%s)", (version,)
                    )

        self._retrying(setup, "set up the schema")

    # ---- connections -----------------------------------------------------------------------

    def _retrying(
        self, fn: Callable[[psycopg.Connection[Any]], T], what: str, *, hold: bool = False
    ) -> T:
        """`fn` on a pooled connection, repeated over lost connections with backoff for up to
        `RECONNECT_SECONDS`. Only for work that is safe to repeat (reads, taking a lock).
        `hold`: `fn` returns the connection, which the caller gives back (`putconn`)."""
        deadline = time.monotonic() + RECONNECT_SECONDS
        delay, attempts = BACKOFF_FIRST, 0
        while True:
            try:
                conn = self._pool.getconn(timeout=max(0.1, deadline - time.monotonic()))
                try:
                    out = fn(conn)
                except BaseException:
                    self._pool.putconn(conn)
                    raise
                if not hold:
                    self._pool.putconn(conn)
                if attempts:
                    self._say("info", f"reconnected to the session store {self.location}")
                return out
            except (psycopg.OperationalError, PoolTimeout) as exc:
                if isinstance(exc, psycopg.errors.LockNotAvailable):
                    raise
                attempts += 1
                if attempts == 1:
                    self._say(
                        "warning",
                        f"lost the connection to the session store {self.location} "
                        f"({_first_line(exc)}); reconnecting",
                    )
                if time.monotonic() + delay > deadline:
                    self._say("error", f"the session store {self.location} is unreachable")
                    raise StoreUnavailable(
                        f"cannot {what}: the session store {self.location} is unreachable "
                        f"({_first_line(exc)}); nothing was written",
                        written=False,
                    ) from None
                time.sleep(delay)
                delay = min(delay * 2, BACKOFF_MAX)

    def _tx(self) -> dict[str, psycopg.Connection[Any]]:
        """The connections of this thread's open write transactions, by session."""
        tx: dict[str, psycopg.Connection[Any]] | None = getattr(self._local, "tx", None)
        if tx is None:
            tx = self._local.tx = {}
        return tx

    # ---- reading -------------------------------------------------------------------------

    def exists(self, session_id: str) -> bool:
        sid = check_session_id(session_id)
        return self._retrying(
            lambda c: (
                c.execute("SELECT 1 FROM compactd.sessions WHERE sid = %s", (sid,)).fetchone()
                is not None
            ),
            f"look up session {sid}",
        )

    def list_sessions(self) -> list[str]:
        rows = self._retrying(
            lambda c: c.execute("SELECT sid FROM compactd.sessions ORDER BY sid").fetchall(),
            "list sessions",
        )
        return [r[0] for r in rows]

    def stat(self, session_id: str) -> SessionStat:
        sid = check_session_id(session_id)
        row = self._retrying(
            lambda c: c.execute(
                "SELECT bytes, extract(epoch FROM updated)::float8, head_seq "
                "FROM compactd.sessions WHERE sid = %s",
                (sid,),
            ).fetchone(),
            f"look up session {sid}",
        )
        if row is None:
            raise UnknownSession(f"no session {sid!r}", sessionId=sid)
        return SessionStat(int(row[0]), float(row[1]), int(row[2]))

    def listing(self) -> list[Listed]:
        """Every session's row and its kept counts, in one query."""
        rows = self._retrying(
            lambda c: c.execute(
                "SELECT s.sid, s.bytes, extract(epoch FROM s.updated)::float8, s.head_seq, "
                "c.body::text FROM compactd.sessions s "
                "LEFT JOIN compactd.counts c ON c.sid = s.sid ORDER BY s.sid"
            ).fetchall(),
            "list sessions",
        )
        out: list[Listed] = []
        for sid, size, mtime, head, body in rows:
            counts = None
            if body is not None:
                with contextlib.suppress(orjson.JSONDecodeError):
                    counts = SessionCounts.from_json(orjson.loads(body))
            out.append((sid, SessionStat(int(size), float(mtime), int(head)), counts))
        return out

    def keep_counts(self, session_id: str, counts: SessionCounts) -> None:
        sid = check_session_id(session_id)
        body = orjson.dumps(counts.to_json()).decode()
        try:
            self._retrying(
                lambda c: c.execute(
                    "INSERT INTO compactd.counts (sid, cursor, body) VALUES (%s, %s, %s) "
                    "ON CONFLICT (sid) DO UPDATE SET cursor = excluded.cursor, "
                    "body = excluded.body WHERE compactd.counts.cursor <= excluded.cursor",
                    (sid, counts.cursor, body),
                ),
                f"keep the counts of session {sid}",
            )
        except (psycopg.Error, StoreFailure) as exc:  # a cache: counted again next time
            self._say("info", f"cannot keep the counts of session {sid}: {_first_line(exc)}")

    def log_requests(self, rows: list[dict[str, Any]]) -> None:
        """One statement, committed without waiting for the WAL flush; never repeated (a
        repeat after a lost acknowledgement could count a request twice)."""
        if not rows:
            return
        bodies = [orjson.dumps(row).decode() for row in rows]
        try:
            with self._pool.connection(timeout=RECONNECT_SECONDS) as conn, conn.transaction():
                conn.execute("SET LOCAL synchronous_commit TO OFF")
                conn.execute(
                    "INSERT INTO compactd.requests (sid, at, body) "
                    "SELECT b::json ->> 'sessionId', (b::json ->> 'at')::double precision, "
                    "b::json FROM unnest(%s::text[]) AS t(b)",
                    (bodies,),
                )
        except (psycopg.Error, PoolTimeout) as exc:
            raise StoreFailure(f"cannot write the request log: {_first_line(exc)}") from None

    def read_requests(
        self, since: float | None = None, session_id: str | None = None
    ) -> list[dict[str, Any]]:
        def read(c: psycopg.Connection[Any]) -> list[tuple[str]]:
            return c.execute(
                "SELECT body::text FROM compactd.requests WHERE at >= %s "
                "AND (%s::text IS NULL OR sid = %s) ORDER BY id",
                (since if since is not None else float("-inf"), session_id, session_id),
            ).fetchall()

        return [orjson.loads(body) for (body,) in self._retrying(read, "read the request log")]

    def read_from(
        self, session_id: str, offset: int = 0, first_line: int = 1
    ) -> tuple[list[dict[str, Any]], LoadReport]:
        """Events after seq `offset` (the cursor is the last seq read)."""
        sid = check_session_id(session_id)

        def read(c: psycopg.Connection[Any]) -> tuple[list[tuple[int, str]], bool]:
            rows = c.execute(
                "SELECT seq, body::text FROM compactd.events WHERE sid = %s AND seq > %s "
                "ORDER BY seq",
                (sid, offset),
            ).fetchall()
            known = bool(rows) or offset > 0
            if not known:
                found = c.execute("SELECT 1 FROM compactd.sessions WHERE sid = %s", (sid,))
                known = found.fetchone() is not None
            return rows, known

        conn = self._tx().get(sid)
        if conn is not None:
            try:
                rows, known = read(conn)
            except psycopg.Error as exc:
                raise self._lost(exc, f"read session {sid}") from None
        else:
            rows, known = self._retrying(read, f"read session {sid}")
        if not known:
            raise UnknownSession(f"no session {sid!r} in {self.location}", sessionId=sid)
        report = LoadReport(end_offset=offset)
        events: list[dict[str, Any]] = []
        for seq, body in rows:
            try:
                event = orjson.loads(body)
                if not isinstance(event, dict) or "t" not in event or event.get("seq") != seq:
                    raise ValueError("not an event")
                events.append(event)
            except (orjson.JSONDecodeError, ValueError):
                report.bad_lines.append(-seq)  # a row edited by hand: skipped, like a bad line
            report.end_offset = seq
        report.events = len(events)
        return events, report

    # ---- writing -------------------------------------------------------------------------

    @contextlib.contextmanager
    def locked(self, session_id: str) -> Iterator[None]:
        """A write transaction holding the session's row lock; `append` commits it."""
        sid = check_session_id(session_id)
        tx = self._tx()
        if sid in tx:
            yield  # re-entered (an append outside `locked` takes the lock itself)
            return

        def begin(c: psycopg.Connection[Any]) -> psycopg.Connection[Any]:
            try:
                with c.pipeline():  # one round trip for both
                    c.execute("BEGIN")
                    cur = c.execute(
                        "SELECT head_seq FROM compactd.sessions WHERE sid = %s FOR UPDATE", (sid,)
                    )
                row = cur.fetchone()
            except BaseException:
                _rollback(c)
                raise
            if row is None:
                _rollback(c)
                raise UnknownSession(f"no session {sid!r}", sessionId=sid)
            return c

        try:
            conn = self._retrying(begin, f"lock session {sid}", hold=True)
        except psycopg.errors.LockNotAvailable:
            raise StoreFailure(
                f"session {sid} is locked by another writer", sessionId=sid
            ) from None
        try:
            tx[sid] = conn
            try:
                yield
            finally:
                tx.pop(sid, None)
                if conn.info.transaction_status != pq.TransactionStatus.IDLE:
                    _rollback(conn)  # nothing appended, or an append that failed
        finally:
            self._pool.putconn(conn)

    def _getconn(self) -> psycopg.Connection[Any]:
        try:
            return self._pool.getconn(timeout=RECONNECT_SECONDS)
        except PoolTimeout:
            raise StoreUnavailable(
                f"the session store {self.location} is unreachable; nothing was written",
                written=False,
            ) from None

    def append(self, session_id: str, events: list[dict[str, Any]], *, durable: bool = True) -> int:
        """Insert and commit under `locked`; returns the last seq, once committed
        (`durable=False`: committed without waiting for the WAL flush)."""
        sid = check_session_id(session_id)
        conn = self._tx().get(sid)
        if conn is None:
            with self.locked(sid):
                return self.append(sid, events, durable=durable)
        if not events:
            return self._head(conn, sid)
        bodies, size = _encode(events, self.max_event_bytes)
        seqs = [int(e["seq"]) for e in events]
        batch = uuid.uuid4()
        try:
            if not durable:
                conn.execute("SET LOCAL synchronous_commit TO OFF")
            conn.execute(  # one statement, one round trip: events, the session row, NOTIFY
                f"""WITH ins AS ({INSERT_EVENTS} RETURNING 1),
                upd AS (
                    UPDATE compactd.sessions SET head_seq = %(head)s, bytes = bytes + %(size)s,
                        updated = now()
                    WHERE sid = %(sid)s RETURNING sid
                )
                SELECT pg_notify(%(channel)s, sid), (SELECT count(*) FROM ins) FROM upd""",
                {
                    "channel": CHANNEL,
                    "sid": sid,
                    "batch": batch,
                    "seqs": seqs,
                    "bodies": bodies,
                    "head": seqs[-1],
                    "size": size,
                },
            )
        except psycopg.errors.UniqueViolation:
            _rollback(conn)
            raise StoreFailure(
                f"session {sid} already has an event at seq {seqs[0]}; nothing was written",
                sessionId=sid,
            ) from None
        except psycopg.Error as exc:
            _rollback(conn)
            raise self._lost(exc, f"append to session {sid}") from None
        self._commit(conn, sid, batch, len(events))
        return seqs[-1]

    def create(self, session_id: str, events: list[dict[str, Any]]) -> int:
        """A new session holding `events`, in one transaction."""
        sid = check_session_id(session_id)
        bodies, size = _encode(events, self.max_event_bytes)
        seqs = [int(e["seq"]) for e in events]
        batch = uuid.uuid4()
        conn = self._getconn()
        try:
            try:
                conn.execute("BEGIN")
                made = conn.execute(
                    "INSERT INTO compactd.sessions (sid, head_seq, bytes) VALUES (%s, %s, %s) "
                    "ON CONFLICT (sid) DO NOTHING RETURNING 1",
                    (sid, seqs[-1] if seqs else 0, size),
                ).fetchone()
                if made is None:
                    _rollback(conn)
                    raise StoreFailure(f"session {sid} already exists", sessionId=sid)
                conn.execute(
                    INSERT_EVENTS,
                    {"sid": sid, "batch": batch, "seqs": seqs, "bodies": bodies},
                )
                conn.execute("SELECT pg_notify(%s, %s)", (CHANNEL, sid))
            except psycopg.Error as exc:
                _rollback(conn)
                raise self._lost(exc, f"create session {sid}") from None
            self._commit(conn, sid, batch, len(events))
        finally:
            self._pool.putconn(conn)
        return seqs[-1] if seqs else 0

    def _commit(self, conn: psycopg.Connection[Any], sid: str, batch: uuid.UUID, n: int) -> None:
        """COMMIT; when the connection drops during it, find out on a new one whether the
        batch landed: acknowledged if it did, a typed error (nothing written) if not."""
        try:
            conn.execute("COMMIT")
            return
        except psycopg.Error as exc:
            cause = _first_line(exc)
        self._say(
            "warning",
            f"lost the connection to the session store {self.location} while committing to "
            f"session {sid} ({cause}); checking whether the append landed",
        )
        try:
            landed = self._retrying(
                lambda c: c.execute(
                    "SELECT count(*) FROM compactd.events WHERE sid = %s AND batch = %s",
                    (sid, batch),
                ).fetchone(),
                f"check an append to session {sid}",
            )
        except StoreUnavailable:
            raise StoreUnavailable(
                f"the connection to the session store was lost while committing to session "
                f"{sid} ({cause}), and it cannot be reached to check whether the append landed; "
                "reload the session before retrying",
                sessionId=sid,
                written="unknown",
            ) from None
        if landed is not None and landed[0] == n:
            return  # it committed; the caller acknowledges it now, once
        raise StoreUnavailable(
            f"the connection to the session store was lost while committing to session {sid} "
            f"({cause}); nothing was written",
            sessionId=sid,
            written=False,
        )

    def _head(self, conn: psycopg.Connection[Any], sid: str) -> int:
        row = conn.execute("SELECT head_seq FROM compactd.sessions WHERE sid = %s", (sid,))
        found = row.fetchone()
        return int(found[0]) if found else 0

    def _lost(self, exc: psycopg.Error, what: str) -> StoreFailure:
        """The typed error for a failed statement (the transaction is rolled back)."""
        if isinstance(exc, psycopg.errors.LockNotAvailable):
            return StoreFailure(f"cannot {what}: the session is locked by another writer")
        if isinstance(exc, psycopg.OperationalError):
            self._say(
                "warning",
                f"lost the connection to the session store {self.location} ({_first_line(exc)})",
            )
            return StoreUnavailable(
                f"cannot {what}: the connection to the session store was lost "
                f"({_first_line(exc)}); nothing was written",
                written=False,
            )
        return StoreFailure(f"cannot {what}: {_first_line(exc)}; nothing was written")

    # ---- the fleet -----------------------------------------------------------------------

    @contextlib.contextmanager
    def claim(self, session_id: str) -> Iterator[bool]:
        """The session's background-work claim: a session-level advisory lock, taken without
        waiting, released at the end (or by the server if this daemon dies)."""
        sid = check_session_id(session_id)
        key = f"compactd:{sid}"
        try:
            conn = self._getconn()
        except StoreUnavailable:
            yield False  # no database, no background work
            return
        try:
            try:
                row = conn.execute(
                    "SELECT pg_try_advisory_lock(hashtextextended(%s, 0))", (key,)
                ).fetchone()
            except psycopg.Error:
                yield False
                return
            held = bool(row and row[0])
            try:
                yield held
            finally:
                if held:
                    with contextlib.suppress(psycopg.Error):
                        conn.execute("SELECT pg_advisory_unlock(hashtextextended(%s, 0))", (key,))
        finally:
            self._pool.putconn(conn)

    async def watch(self) -> AsyncIterator[str]:
        """Session ids from `NOTIFY compactd_changed`, over a connection of its own that is
        re-established with backoff; after a gap it yields `""` (anything may have changed)."""
        delay, lost = BACKOFF_FIRST, False
        while True:
            try:
                aconn = await psycopg.AsyncConnection.connect(
                    self.url, autocommit=True, application_name="compactd-listen"
                )
            except psycopg.OperationalError as exc:
                lost = self._notifications_lost(exc, lost)
                await asyncio.sleep(delay)
                delay = min(delay * 2, BACKOFF_MAX)
                continue
            try:
                async with aconn:
                    await aconn.execute(f"LISTEN {CHANNEL}")
                    if lost:
                        self._say("info", f"listening to the session store {self.location} again")
                        lost, delay = False, BACKOFF_FIRST
                        yield ""  # what was notified while we were away is lost: recheck all
                    async for note in aconn.notifies():
                        yield note.payload
            except psycopg.OperationalError as exc:
                lost = self._notifications_lost(exc, lost)
                await asyncio.sleep(delay)

    def _notifications_lost(self, exc: BaseException, lost: bool) -> bool:
        """Say once that the LISTEN connection is gone (until it is back)."""
        if not lost:
            self._say(
                "warning",
                f"lost the notifications of the session store {self.location} "
                f"({_first_line(exc)}); reconnecting",
            )
        return True


def _configure(conn: psycopg.Connection[Any]) -> None:
    """Every pooled connection waits at most as long as the files' lock for a session row."""
    conn.execute(f"SET lock_timeout = '{int(LOCK_TIMEOUT_SECONDS * 1000)}ms'")


def _rollback(conn: psycopg.Connection[Any]) -> None:
    if conn.closed:
        return
    with contextlib.suppress(psycopg.Error):
        conn.execute("ROLLBACK")


def _encode(events: list[dict[str, Any]], max_event_bytes: int) -> tuple[list[str], int]:
    """The events as the files would hold them (the bodies, their size with newlines), or a
    typed error before anything is sent."""
    bodies = [line.decode() for line in log_lines(events, max_event_bytes)]
    return bodies, sum(len(b) + 1 for b in bodies)


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__
