"""A session log's bytes, to prove an operation wrote nothing (or exactly something)."""

from __future__ import annotations

from pathlib import Path

import orjson
from compactd.context.engine import Engine
from compactd.context.stores import open_store
from compactd.context.stores.files import FileStore

from tests.support.postgres import daemon_store_url


def log_bytes(where: Engine | Path, session_id: str) -> bytes:
    """The log of `session_id` in an engine's store or a data dir (in the data dir's database
    when the daemon tests run on PostgreSQL: then its events, serialized)."""
    if isinstance(where, Path) and (url := daemon_store_url(where)):
        store = open_store(url, None)
        try:
            return orjson.dumps(store.read_from(session_id, 0)[0])
        finally:
            store.close()
    store = where.store if isinstance(where, Engine) else FileStore(where)
    return store.log_path(session_id).read_bytes()
