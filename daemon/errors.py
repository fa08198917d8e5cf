"""Engine errors → JSON-RPC errors with compactd's codes, a message a person can act on, and
structured `data` — never a traceback."""

from __future__ import annotations

from typing import Any

from pygls.exceptions import JsonRpcException, JsonRpcInternalError, JsonRpcInvalidParams

from ..context.errors import CompactdError, TooLarge
from ..protocol.convert import ParamsError
from ..protocol.errors import code_for
from ..service.events import plain
from .wire import INTERNAL_MESSAGE


class CompactdRpcError(JsonRpcException):
    """A compactd error on the wire: code from `protocol.errors`, `data.kind` its name."""

    def __init__(self, kind: str, message: str, data: dict[str, Any] | None = None) -> None:
        # `kind` is the error's stable name (protocol/errors.py); an engine detail that happens
        # to be called `kind` (a node kind) must not replace it — the message names it anyway
        super().__init__(message=message, code=code_for(kind), data={**(data or {}), "kind": kind})


def too_large(limit: str, max_bytes: int, size: int | None = None) -> CompactdRpcError:
    """The error for an input over a size limit, as the engine's `TooLarge` words it."""
    exc = TooLarge("the request", limit, max_bytes, size)
    return CompactdRpcError(exc.kind, exc.message, _jsonable(exc.data))


def to_rpc_error(exc: BaseException) -> JsonRpcException:
    if isinstance(exc, JsonRpcException):
        return exc
    if isinstance(exc, ParamsError):
        return JsonRpcInvalidParams(
            message=str(exc), data={"kind": "invalid_params", "fields": exc.fields}
        )
    if isinstance(exc, CompactdError):
        return CompactdRpcError(exc.kind, exc.message, _jsonable(exc.data))
    return JsonRpcInternalError(
        message=INTERNAL_MESSAGE,
        data={"kind": "internal_error", "type": type(exc).__name__},
    )


def _jsonable(data: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in data.items():
        if isinstance(value, str | int | float | bool | type(None) | list | dict):
            out[key] = plain(value)
        else:
            out[key] = repr(value)
    return out
