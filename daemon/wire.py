"""The JSON-RPC error shapes every answer of the daemon carries (pygls-free, so the front
answers errors exactly as the server does). The engine's results in wire shapes are
`compactd.service.events`."""

from __future__ import annotations

import logging
from typing import Any

from ..context.secrets import scrub, scrub_data
from ..protocol import errors

log = logging.getLogger("compactd.daemon")


INTERNAL_MESSAGE = "internal error in compactd (details are in the daemon's log)"

_KIND_BY_CODE = {
    errors.PARSE_ERROR: "parse_error",
    errors.INVALID_REQUEST: "invalid_request",
    errors.METHOD_NOT_FOUND: "method_not_found",
    errors.INVALID_PARAMS: "invalid_params",
    errors.INTERNAL_ERROR: "internal_error",
    errors.REQUEST_CANCELLED: "request_cancelled",
    **errors.KIND_BY_CODE,
}


def clean_error(error: dict[str, Any]) -> dict[str, Any]:
    """Every error a client gets carries `data.kind` and nothing of the daemon's insides:
    pygls puts a traceback in `data` of errors it raises itself, and an unexpected
    exception's text may name local paths — so internal errors get a fixed message and the
    original goes to the log; and no secret compactd holds is in any (`context.secrets`).
    (Here, free of pygls, so the front answers the same way.)"""
    code = error.get("code")
    data = error.get("data")
    data = dict(data) if isinstance(data, dict) else {}
    data.pop("traceback", None)
    data.setdefault("kind", _KIND_BY_CODE.get(code, "internal_error"))  # type: ignore[arg-type]
    message = error.get("message")
    if code == errors.INTERNAL_ERROR and message != INTERNAL_MESSAGE:
        log.warning("internal error answered to a client: %s", message)
        message = INTERNAL_MESSAGE
        data = {"kind": "internal_error", **({"type": data["type"]} if "type" in data else {})}
    # no secret compactd holds, whoever's words carried it (a driver, a provider, a gateway)
    message = scrub(message) if isinstance(message, str) else message
    return {"code": code, "message": message, "data": scrub_data(data)}
