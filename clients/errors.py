"""The client's error: an error answer from the daemon (or from what stands in for one).

Apart from the client itself so that a command which talks to no daemon — the read-only ones
read the store in their own process — need not load asyncio to name it.
"""

from __future__ import annotations

from typing import Any

from ..protocol.errors import KIND_BY_CODE


class RpcError(Exception):
    """An error answer: `code` (see `compactd.protocol.errors`), `kind`, `data`."""

    def __init__(self, code: int, message: str, data: Any = None) -> None:
        super().__init__(f"{message} (code {code})")
        self.code = code
        self.message = message
        self.data = data

    @property
    def kind(self) -> str | None:
        if isinstance(self.data, dict) and isinstance(self.data.get("kind"), str):
            return self.data["kind"]
        return KIND_BY_CODE.get(self.code)
