"""The services' settings from a front's command line and the environment (`serve`, `proxy`).

A bad value stops start-up with a message naming it, before anything starts: the user mistyped a
knob, and a front that ran on a guess would only surprise them later.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..context.errors import InvalidConfig
from ..context.policy import policy_from_config
from ..context.stores import default_data_dir

if TYPE_CHECKING:
    from .app import Settings


def settings_from(args: argparse.Namespace, **overrides: Any) -> Settings:
    """`Settings` from the common options of `serve` and `proxy`; `overrides` win. (The
    services are imported here, not above: a read-only command reads its limits from this
    module without loading them.)"""
    from .app import Settings
    from .providers import PROVIDERS

    env = os.environ
    provider = args.summary_provider or env.get("COMPACTD_SUMMARY_PROVIDER") or None
    if provider is not None and provider not in PROVIDERS:
        raise SystemExit(
            f"compactd: unknown summary provider {provider!r} (use one of {', '.join(PROVIDERS)})"
        )
    config = dict(getattr(args, "session_config", None) or {})
    try:
        policy_from_config(config)
    except InvalidConfig as exc:  # before anything starts: the user mistyped a knob
        print(f"compactd: {exc}", file=sys.stderr)
        raise SystemExit(2) from None
    idle = args.idle_seconds
    if idle is None and env.get("COMPACTD_IDLE_SECONDS"):
        idle = float(env["COMPACTD_IDLE_SECONDS"])
    fields: dict[str, Any] = dict(
        limits=limits_from(env),
        data_dir=Path(args.data_dir) if args.data_dir else default_data_dir(),
        store_url=args.store or env.get("COMPACTD_STORE") or None,
        idle_seconds=idle,
        idle_check_seconds=args.idle_check_seconds,
        evict_after_seconds=getattr(args, "evict_after_seconds", 600.0),
        idle_work=not getattr(args, "no_idle_work", False),
        watch=not args.no_watch,
        summary_provider=provider,
        summary_model=args.summary_model or env.get("COMPACTD_SUMMARY_MODEL") or None,
        summarize_timeout_seconds=args.summarize_timeout,
        config=config,
    )
    return Settings(**{**fields, **overrides})


LIMIT_VARIABLES = {
    "COMPACTD_MAX_REQUEST_BYTES": "max_request_bytes",
    "COMPACTD_MAX_MESSAGE_BYTES": "max_message_bytes",
    "COMPACTD_MAX_IMPORT_BYTES": "max_import_bytes",
    "COMPACTD_MAX_IMPORT_AMPLIFICATION": "max_import_amplification",
    "COMPACTD_IMPORT_FLOOR_BYTES": "import_floor_bytes",
    "COMPACTD_MAX_IMPORT_LOG_BYTES": "max_import_log_bytes",
}


def limits_from(env: Mapping[str, str]) -> dict[str, int]:
    """The input limits the environment sets (docs/security.md); a bad value stops start-up
    with a message rather than being ignored."""
    limits = {}
    for variable, field in LIMIT_VARIABLES.items():
        text = env.get(variable)
        if not text:
            continue
        try:
            value = int(text)
        except ValueError:
            value = -1
        if value <= 0:
            what = "number" if field == "max_import_amplification" else "number of bytes"
            raise SystemExit(f"compactd: {variable} must be a positive {what}")
        limits[field] = value
    return limits
