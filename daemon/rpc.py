"""The `rpc` decorator that keeps every handler a few lines over the engine — free of pygls, so
the daemon answers its first request before pygls' type machinery (lsprotocol's ~1,000 LSP
types, a third of a second) is imported (`daemon.front`). Errors become pygls' JSON-RPC
exceptions only when one is raised."""

from __future__ import annotations

import asyncio
import inspect
import logging
from collections.abc import Awaitable, Callable
from typing import Any

import attrs

from ..context.errors import CompactdError
from ..protocol.convert import ParamsError, structure, unstructure
from ..protocol.types import METHODS

log = logging.getLogger("compactd.daemon")


def encode_fallback(value: Any) -> Any:
    """orjson's `default`: attrs objects as camelCase JSON, enums by value."""
    if attrs.has(type(value)):
        return unstructure(value)
    if hasattr(value, "value"):  # enums
        return value.value
    raise TypeError(f"cannot encode {type(value).__name__}")


def rpc(
    server: Any, method: str, params_type: type | None = None
) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Register `fn(ls, params)` (or `fn(ls, params, raw)` when it needs to know which keys
    were sent) as `method`, its params type read from the one method table
    (`protocol.types.METHODS`, as pygls reads lsprotocol's): params structured from camelCase
    JSON (bad ones → -32602 naming the field), engine errors → compactd codes, anything else →
    an internal error without a traceback. `fn` may be sync or async; it returns attrs or JSON.
    (`params_type` only for a method outside the table, as a test registers.) `server`: the
    pygls server, or the front that stands in for it until pygls is needed."""
    params_type = params_type or METHODS[method][0]

    def register(fn: Callable[..., Any]) -> Callable[..., Any]:
        wants_raw = len(inspect.signature(fn).parameters) == 3

        async def handler(ls: Any, raw: Any) -> Any:  # the pygls server, or the front
            try:
                plain = _plain(raw)
                params = structure(plain, params_type, method)
                result = fn(ls, params, plain or {}) if wants_raw else fn(ls, params)
                if isinstance(result, Awaitable):
                    result = await result
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                from pygls.exceptions import JsonRpcException  # only once something failed

                from .errors import to_rpc_error

                if not isinstance(exc, CompactdError | ParamsError | JsonRpcException):
                    log.exception("unexpected error in %s", method)
                raise to_rpc_error(exc) from None
            return unstructure(result) if attrs.has(type(result)) else result

        handler.__name__ = f"rpc_{method.replace('/', '_')}"
        server.feature(method)(handler)
        return fn

    return register


def _plain(raw: Any) -> Any:
    """pygls hands over params as parsed JSON (or an attrs object for LSP-typed methods)."""
    if raw is None or isinstance(raw, dict):
        return raw
    if attrs.has(type(raw)):
        return unstructure(raw)
    if hasattr(raw, "_asdict"):
        return raw._asdict()
    return raw
