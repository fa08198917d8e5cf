"""`compactd serve`: the daemon on stdio."""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import sys
from collections.abc import Mapping
from pathlib import Path

from ..context.errors import CompactdError, InvalidConfig
from ..context.policy import policy_from_config
from ..context.stores import default_data_dir
from ..service import background
from ..service.app import App, Settings
from ..service.providers import PROVIDERS
from .front import Front
from .handlers import register
from .stdio import serve_stdio


def build(settings: Settings) -> tuple[Front, App]:
    """The daemon: its services over a front that loads pygls when first needed."""
    server = Front()
    app = App(server, settings)
    server.app = app
    register(server, app)
    return server, app


def settings_from(args: argparse.Namespace) -> Settings:
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
    return Settings(
        limits=limits_from(env),
        data_dir=Path(args.data_dir) if args.data_dir else default_data_dir(),
        store_url=args.store or env.get("COMPACTD_STORE") or None,
        idle_seconds=idle,
        idle_check_seconds=args.idle_check_seconds,
        watch=not args.no_watch,
        summary_provider=provider,
        summary_model=args.summary_model or env.get("COMPACTD_SUMMARY_MODEL") or None,
        summarize_timeout_seconds=args.summarize_timeout,
        config=config,
    )


LIMIT_VARIABLES = {
    "COMPACTD_MAX_REQUEST_BYTES": "max_request_bytes",
    "COMPACTD_MAX_MESSAGE_BYTES": "max_message_bytes",
    "COMPACTD_MAX_IMPORT_BYTES": "max_import_bytes",
    "COMPACTD_MAX_IMPORT_AMPLIFICATION": "max_import_amplification",
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


def serve(args: argparse.Namespace) -> int:
    level = (args.log_level or os.environ.get("COMPACTD_LOG_LEVEL") or "WARNING").upper()
    logging.basicConfig(
        stream=sys.stderr,
        level=level,
        format="compactd %(levelname)s %(name)s: %(message)s",
    )
    for name in ("pygls", "watchfiles"):
        logging.getLogger(name).setLevel(max(logging.WARNING, logging.getLogger().level))
    # pygls logs every error answer with a traceback; the client already got a clear error
    logging.getLogger("pygls.protocol.json_rpc").setLevel(
        logging.DEBUG if level == "DEBUG" else logging.CRITICAL
    )
    try:
        server, app = build(settings_from(args))
    except CompactdError as exc:  # e.g. an unsupported --store URL, an unreachable database
        print(f"compactd: {exc}", file=sys.stderr)
        return 2
    try:
        code = asyncio.run(
            serve_stdio(
                server,
                background=background.start(app),
                max_request_bytes=app.engine.limits.max_request_bytes,
            )
        )
        app.close()  # the counts of what this daemon wrote, for the next one's listing
        return code
    except KeyboardInterrupt:  # Ctrl-C on a daemon started by hand: a quiet 130
        return 130
    finally:
        app.engine.store.close()
