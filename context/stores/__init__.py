"""Session stores: where a session's append-only event log lives.

Two stores implement one interface (`interface.SessionStore`): the JSONL files in the data dir
(`files.FileStore`, the default) and PostgreSQL (`postgres.PostgresStore`, for a fleet of
daemons on one database); `migrate` copies sessions between them. What every store promises,
and what `tests/stores/test_conformance.py` holds both of them to:

- **Durability.** An append returns only once its events are durable (fsync'ed, or committed);
  one that raises wrote nothing, or says in `data.written` that it cannot tell. History is
  never rewritten.
- **Whole creates.** A session is created with its whole first content (a header, or a whole
  import) or not at all: a create that fails — a full disk, a crash — leaves no session, so
  its id stays free and nothing is listed. What a killed process left mid-create is moved
  aside by `sweep` at start-up, never listed.
- **Ordering.** One log per session, read back in the order it was written; between reading
  what other writers appended and appending, a writer holds the session's lock (`locked`), so
  two writers in any processes never interleave or lose an append.
- **The claim.** Background work (idle work, preparation) on a session runs in one process at
  a time: `claim` is taken without waiting, and says whether this process holds it.
- **Counts beside the log.** What a listing shows of a session (source, title, turns,
  tokens) is kept with the log position it was counted at (`keep_counts`); `listing` reads
  every session's stat and counts without loading one. Counts are a cache: stale ones (the
  log has grown since) are counted again by the caller, lost ones cost only that.
- **Watching.** `watch` yields the ids of sessions other processes appended to, so a daemon can
  tell its clients (`session/changed`); `unchanged` answers cheaply when nothing was written.

`open_store(url, data_dir)` picks one: no URL means the files in `data_dir`. The PostgreSQL
store is imported only for a `postgresql://` URL, so the files path loads nothing of it.
"""

from __future__ import annotations

from pathlib import Path

from ... import install_advice
from ..errors import StoreFailure
from ..secrets import connection_secrets, hold, redact
from .files import FileStore, default_data_dir
from .interface import (
    Listed,
    LoadReport,
    Logger,
    SessionCounts,
    SessionStat,
    SessionStore,
    check_session_id,
)

__all__ = [
    "FileStore",
    "Listed",
    "LoadReport",
    "SessionCounts",
    "SessionStat",
    "SessionStore",
    "check_session_id",
    "default_data_dir",
    "open_store",
    "redact",
]

SCHEMES = ("postgresql", "postgres")
"""URL schemes `--store` accepts; without `--store` the sessions are files in the data dir."""


def open_store(
    url: str | None, data_dir: Path | str | None, log: Logger | None = None
) -> SessionStore:
    """The store a URL names (`postgresql://…`), or the files in `data_dir` without one."""
    if not url:
        return FileStore(data_dir)
    hold(*connection_secrets(url))  # kept out of every message, whatever quotes it back
    scheme = url.split(":", 1)[0].lower() if ":" in url else ""
    if scheme not in SCHEMES:
        raise StoreFailure(
            f"unsupported store URL {redact(url)!r}: use postgresql://… (schemes: "
            f"{', '.join(SCHEMES)}), or no --store for the files in the data dir",
            url=redact(url),
        )
    try:
        from .postgres import PostgresStore
    except ImportError as exc:  # the optional extra is not installed
        raise StoreFailure(
            "the PostgreSQL store needs psycopg: "
            f"{install_advice('psycopg[binary]>=3.2', 'psycopg-pool>=3.2')} ({exc})"
        ) from None
    return PostgresStore(url, location=redact(url), log=log)
