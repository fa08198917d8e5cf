"""The store interface: what a session needs from wherever its event log lives.

Two implementations: the JSONL files (`context/store.py`, the default) and PostgreSQL
(`context/pgstore.py`, for a fleet of daemons on one database). Both keep one append-only event
log per session, in `seq` order; a cursor (`LoadReport.end_offset`) is opaque to the session — a
byte offset in a file, the last `seq` read in the database.

`open_store(url, data_dir)` picks one: no URL means the files in `data_dir`.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from .errors import StoreFailure
from .store import LoadReport, SessionStat, Store

SCHEMES = ("postgresql", "postgres")
"""URL schemes `--store` accepts; without `--store` the sessions are files in the data dir."""

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

    def locked(self, session_id: str) -> contextlib.AbstractContextManager[None]:
        """The session's writer lock: between reading what others wrote and appending, no
        other writer (in any process on this store) appends."""
        ...

    def read_from(
        self, session_id: str, offset: int = 0, first_line: int = 1
    ) -> tuple[list[dict[str, Any]], LoadReport]: ...

    def create(self, session_id: str, events: list[dict[str, Any]]) -> int:
        """A new log holding `events`; fails if the session exists. Returns the cursor."""
        ...

    def append(self, session_id: str, events: list[dict[str, Any]]) -> int:
        """Append under `locked`; returns the cursor after the append, once it is durable."""
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

    def close(self) -> None: ...


def open_store(url: str | None, data_dir: Path | str | None, log: Logger | None = None) -> Any:
    """The store a URL names (`postgresql://…`), or the files in `data_dir` without one."""
    if not url:
        return Store(data_dir)
    scheme = url.split(":", 1)[0].lower() if ":" in url else ""
    if scheme not in SCHEMES:
        raise StoreFailure(
            f"unsupported store URL {redact(url)!r}: use postgresql://… (schemes: "
            f"{', '.join(SCHEMES)}), or no --store for the files in the data dir",
            url=redact(url),
        )
    try:
        from .pgstore import PgStore
    except ImportError as exc:  # the optional extra is not installed
        raise StoreFailure(
            f"the PostgreSQL store needs the optional extra: pip install 'compactd[postgres]' "
            f"({exc})"
        ) from None
    return PgStore(url, location=redact(url), log=log)


def redact(url: str) -> str:
    """The URL without its password (in its user part or a `password=` parameter)."""
    url = re.sub(r"(?i)([?&]password=)[^&]*", r"\1***", url)
    head, sep, rest = url.partition("://")
    if not sep or "@" not in rest.split("/", 1)[0]:
        return url
    auth, _, host = rest.partition("@")
    user = auth.split(":", 1)[0]
    return f"{head}://{user}{':***' if ':' in auth else ''}@{host}"
