"""The engine's typed results in the shapes the wire has: the one place a `TierEvent` becomes
JSON (render's `events`, `context/compacted`, the events in a "cannot fit" error)."""

from __future__ import annotations

import logging
from typing import Any

from ..context.tiers.base import TierEvent
from ..protocol import errors
from ..protocol.convert import unstructure
from ..protocol.types import CompactedNotification, CompactionEvent, ModelBudget, RenderTokens

log = logging.getLogger("compactd.daemon")


def _event_fields(event: TierEvent) -> dict[str, Any]:
    return {
        "tier": event.tier,
        "applied": event.applied,
        "tokens_before": event.tokens_before,
        "tokens_after": event.tokens_after,
        "reason": event.reason,
        "record_ids": list(event.record_ids),
        "details": event.details,
    }


def compacted(session_id: str, event: TierEvent) -> CompactedNotification:
    return CompactedNotification(session_id=session_id, **_event_fields(event))


def event_json(event: TierEvent) -> dict[str, Any]:
    """A tier's event as render's `events` list it: `context/compacted` without the session."""
    out = unstructure(compacted("", event))
    del out["sessionId"]
    return out


def compaction_event(event: TierEvent) -> CompactionEvent:
    """A tier's event as render's typed `events` hold it."""
    return CompactionEvent(**_event_fields(event))


def render_tokens(tokens: dict[str, Any]) -> RenderTokens:
    """The engine's `Rendered.tokens()` as the typed wire object."""
    return RenderTokens(
        total=tokens["total"],
        window=tokens["window"],
        limit=tokens["limit"],
        output_reserve=tokens["outputReserve"],
        free=tokens["free"],
        estimate=tokens["estimate"],
        calibration=float(tokens["calibration"]),
        categories=dict(tokens["categories"]),
        turns=tokens["turns"],
        turns_shown=tokens["turnsShown"],
        cleared_by_provider=tokens.get("clearedByProvider", 0),
        models=[
            ModelBudget(
                model=b["model"],
                window=b["window"],
                limit=b["limit"],
                output_reserve=b["outputReserve"],
                total=b["total"],
                binding=b["binding"],
            )
            for b in tokens["models"]
        ]
        if "models" in tokens
        else None,
    )


def plain(value: Any) -> Any:
    """Engine data made JSON: events converted, containers walked, anything else as is."""
    if isinstance(value, TierEvent):
        return event_json(value)
    if isinstance(value, list | tuple):
        return [plain(v) for v in value]
    if isinstance(value, dict):
        return {k: plain(v) for k, v in value.items()}
    return value


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
    original goes to the log. (Here, free of pygls, so the front answers the same way.)"""
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
    return {"code": code, "message": message, "data": data}
