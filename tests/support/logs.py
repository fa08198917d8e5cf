"""A session log's bytes, to prove an operation wrote nothing (or exactly something)."""

from __future__ import annotations

from pathlib import Path

from compactd.context.engine import Engine
from compactd.context.store import Store


def log_bytes(where: Engine | Path, session_id: str) -> bytes:
    """The log of `session_id` in an engine's store or a data dir."""
    store = where.store if isinstance(where, Engine) else Store(where)
    return store.log_path(session_id).read_bytes()
