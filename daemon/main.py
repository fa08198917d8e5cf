"""`compactd serve`: the daemon on stdio."""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import sys

from ..context.errors import CompactdError
from ..context.secrets import scrub, scrub_logs
from ..service import background
from ..service.app import App, Settings
from ..service.settings import settings_from
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


def serve(args: argparse.Namespace) -> int:
    level = (args.log_level or os.environ.get("COMPACTD_LOG_LEVEL") or "WARNING").upper()
    logging.basicConfig(
        stream=sys.stderr,
        level=level,
        format="compactd %(levelname)s %(name)s: %(message)s",
    )
    scrub_logs()  # no secret compactd holds in any line it logs
    for name in ("pygls", "watchfiles"):
        logging.getLogger(name).setLevel(max(logging.WARNING, logging.getLogger().level))
    # pygls logs every error answer with a traceback; the client already got a clear error
    logging.getLogger("pygls.protocol.json_rpc").setLevel(
        logging.DEBUG if level == "DEBUG" else logging.CRITICAL
    )
    try:
        server, app = build(settings_from(args))
    except CompactdError as exc:  # e.g. an unsupported --store URL, an unreachable database
        print(f"compactd: {scrub(str(exc))}", file=sys.stderr)
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
