"""What every session store is: the vocabulary both stores share and the interface they implement.

A cursor (`LoadReport.end_offset`) is opaque to the session: a byte offset in a file, the last
`seq` read in the database.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import AsyncIterator, Callable
from typing import Any, Protocol, runtime_checkable

import attrs
import orjson

from ..errors import InvalidContent, InvalidSessionId, TooLarge

LOCK_TIMEOUT_SECONDS = 10.0
"""How long a writer waits for a session's lock before the append fails (4060)."""

SESSION_ID_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,127}")
"""Always used with `fullmatch`: `$` would also match before a trailing newline (`"a\\n"`)."""


def check_session_id(session_id: Any) -> str:
    """A session id that can only ever name a file inside the data dir."""
    well_formed = isinstance(session_id, str) and SESSION_ID_RE.fullmatch(session_id)
    if not well_formed or ".." in session_id:
        raise InvalidSessionId(
            f"invalid session id {session_id!r}: use 1-128 letters, digits, '_', '-' or '.', "
            "starting with a letter or digit",
            sessionId=session_id if isinstance(session_id, str) else repr(session_id),
        )
    return session_id


def log_line(event: dict[str, Any], max_event_bytes: int) -> bytes:
    """One event as both stores hold it (the JSON of a log line, without its newline), or a
    typed error: content JSON cannot hold, or an event (a message, a tool result, …) over
    `maxMessageBytes`. Checked before anything is opened or sent."""
    try:
        line = orjson.dumps(event)
    except orjson.JSONEncodeError as exc:  # e.g. nested deeper than JSON can be written
        raise InvalidContent(f"this content cannot be stored: {exc}") from None
    if len(line) > max_event_bytes:
        raise TooLarge("one message", "maxMessageBytes", max_event_bytes, len(line))
    return line


def log_lines(events: list[dict[str, Any]], max_event_bytes: int) -> list[bytes]:
    return [log_line(event, max_event_bytes) for event in events]


def log_size(events: list[dict[str, Any]], max_event_bytes: int, stop_over: int) -> int:
    """The bytes `events` take in a log (lines and newlines; the database counts the same),
    one event at a time so nothing big is held; counting stops once past `stop_over`."""
    total = 0
    for event in events:
        total += len(log_line(event, max_event_bytes)) + 1
        if total > stop_over:
            break
    return total


@attrs.frozen
class SessionStat:
    """What `session/list` shows of a stored session, and where its log ends now (`cursor`:
    its size in bytes on the files, its last seq in the database)."""

    size: int
    mtime: float
    cursor: int


@attrs.frozen
class SessionCounts:
    """What a listing shows of a session as of one point of its log (`cursor`): kept beside
    the log, so a listing reads these instead of loading and tokenizing every session. When
    the log has grown past `cursor` they are stale and counted again."""

    cursor: int
    source: str | None
    title: str | None
    turns: int
    tokens: int

    def to_json(self) -> dict[str, Any]:
        return attrs.asdict(self)

    @classmethod
    def from_json(cls, data: Any) -> SessionCounts | None:
        """The counts kept as JSON, or None for anything else (a cache never fails a read)."""
        if not isinstance(data, dict):
            return None
        try:
            made = cls(**{field.name: data[field.name] for field in attrs.fields(cls)})
        except (KeyError, TypeError):
            return None
        numbers = (made.cursor, made.turns, made.tokens)
        texts = (made.source, made.title)
        if not all(isinstance(n, int) and not isinstance(n, bool) for n in numbers):
            return None
        if not all(t is None or isinstance(t, str) for t in texts):
            return None
        return made


Listed = tuple[str, SessionStat, SessionCounts | None]
"""A stored session in a listing: its id, its stat, and the counts kept for it (if any)."""


@attrs.define
class LoadReport:
    """What loading a log found besides good events."""

    events: int = 0
    torn_tail: bool = False
    bad_lines: list[int] = attrs.field(factory=list)  # 1-based line numbers skipped
    end_offset: int = 0

    @property
    def clean(self) -> bool:
        return not self.torn_tail and not self.bad_lines


Logger = Callable[[str, str], None]
"""`(level, message)`: how a store says what it is doing about its connection (the daemon sends
it on `window/logMessage`); level is `info`, `warning` or `error`."""


@runtime_checkable
class SessionStore(Protocol):
    """One append-only event log per session. An append returns only once it is durable
    (fsync'ed, or committed); one that raises wrote nothing."""

    location: str
    """Where the sessions are, for people (a folder, or a URL without its password)."""

    def exists(self, session_id: str) -> bool: ...

    def list_sessions(self) -> list[str]: ...

    def stat(self, session_id: str) -> SessionStat: ...

    def listing(self) -> list[Listed]:
        """Every session with its stat and the counts kept for it, read together and without
        loading any session."""
        ...

    def keep_counts(self, session_id: str, counts: SessionCounts) -> None:
        """Keep a session's counts for later listings. A cache: one that cannot be written
        is logged and skipped, never an error."""
        ...

    def locked(self, session_id: str) -> contextlib.AbstractContextManager[None]:
        """The session's writer lock: between reading what others wrote and appending, no
        other writer (in any process on this store) appends."""
        ...

    def read_from(
        self, session_id: str, offset: int = 0, first_line: int = 1
    ) -> tuple[list[dict[str, Any]], LoadReport]: ...

    def create(self, session_id: str, events: list[dict[str, Any]]) -> int:
        """A new log holding `events`, whole or not at all (a create that fails leaves no
        session, nothing listed); fails if the session exists. Returns the cursor."""
        ...

    def sweep(self) -> list[str]:
        """At start-up: move aside what failed creates left (a process killed mid-create),
        so it is never listed; says what was moved."""
        ...

    def append(self, session_id: str, events: list[dict[str, Any]], *, durable: bool = True) -> int:
        """Append under `locked`; returns the cursor after the append, once it is durable —
        or, with `durable=False`, once it is written and only a crash of the machine itself
        could lose it (for copies of what a client holds and sends again anyway: the proxy's
        appends of a history the client resends with every request)."""
        ...

    def claim(self, session_id: str) -> contextlib.AbstractContextManager[bool]:
        """Try to take the session's background-work claim (idle work, preparation): True
        when this process holds it for the block, False when another one does."""
        ...

    def watch(self) -> AsyncIterator[str]:
        """Ids of sessions other processes appended to (repeats allowed)."""
        ...

    def unchanged(self, session_id: str, offset: int) -> bool:
        """True when nothing was written after cursor `offset` and it can be told cheaply
        (a `stat`); False when unsure, and the caller reads."""
        ...

    def forget(self, session_id: str) -> None:
        """Drop whatever the store keeps per session (an evicted session holds nothing)."""
        ...

    def log_requests(self, rows: list[dict[str, Any]]) -> None:
        """Append rows to the request log: what the proxy records of each request it relayed
        and each call compactd made (`service/stats.py`), each a JSON object with its `at`
        (Unix time) and `sessionId`. Written, not fsync'ed: a figure, never a client's
        data. A write that fails raises `StoreFailure` and leaves no partial row."""
        ...

    def read_requests(
        self, since: float | None = None, session_id: str | None = None
    ) -> list[dict[str, Any]]:
        """The request log's rows from `since` on (of one session), in the order written; a
        row that cannot be read (a torn line) is skipped."""
        ...

    def close(self) -> None: ...
