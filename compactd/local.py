"""The read-only commands' client: `compactd sessions` and `compactd context` answered from the
store in this process (`compactd.service.reader`) instead of a daemon spawned for one look.

Here, in the composition root, because it joins the two sides the CLI keeps apart: the client
commands (which see only the client's surface) and the engine (which the client never imports).
It answers with the daemon's own wire types, and an engine error as the `RpcError` the daemon's
answer would have been, so a command cannot tell which it talked to.
"""

from __future__ import annotations

import argparse
import contextlib
import os
from collections.abc import Iterator
from typing import Any

from .clients.errors import RpcError
from .context.errors import CompactdError
from .protocol import types as t
from .protocol.errors import code_for
from .service.reader import StoreReader
from .service.settings import limits_from


@contextlib.contextmanager
def as_rpc_error() -> Iterator[None]:
    """An engine error raised here, as the error a daemon would have answered with."""
    try:
        yield
    except CompactdError as exc:
        raise RpcError(code_for(exc.kind), exc.message, {**exc.data, "kind": exc.kind}) from None


class LocalClient:
    """What the read-only commands ask of a client, answered in this process."""

    process = None  # no daemon was started
    cancel_wait: float | None = None

    def __init__(self, reader: StoreReader) -> None:
        self.reader = reader

    @classmethod
    def connect(cls, ns: argparse.Namespace) -> LocalClient:
        with as_rpc_error():
            reader = StoreReader(ns.data_dir, ns.store, ns.session_config, limits_from(os.environ))
        return cls(reader)

    async def list_sessions(self, prefix: str | None = None) -> t.ListResult:
        with as_rpc_error():
            return self.reader.list_sessions(prefix)

    async def measure(self, session_id: str, **params: Any) -> t.MeasureResult:
        with as_rpc_error():
            return self.reader.measure(t.RenderParams(session_id=session_id, **params))

    def on_notification(self, method: str, handler: Any) -> None:
        """No daemon, so no notifications (progress) to listen to."""

    async def close(self) -> None:
        self.reader.close()
