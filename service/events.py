"""The engine's typed results in the shapes the wire has: the one place a `TierEvent` becomes
JSON (render's `events`, `context/compacted`, the events in a "cannot fit" error) — for every
front, the daemon's and the proxy's."""

from __future__ import annotations

from typing import Any

from ..context.tiers.base import TierEvent
from ..protocol.convert import unstructure
from ..protocol.types import CompactedNotification, CompactionEvent, ModelBudget, RenderTokens


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
