"""`compactd stats`: what the proxy did and saved, per session and per day, read from the store's
request log in this process (a read needs no daemon).

Here, in the composition root, because it opens the store directly; the sums are
`compactd.service.stats`, the tables `compactd.clients.stats`.
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import sys

import orjson

from .clients.stats import print_stats
from .context.errors import CompactdError
from .context.stores import open_store
from .service.stats import summarize

CONTEXT_SECONDS = 86_400.0
"""Rows read before `--since` too: a request's saving depends on the one before it."""


def since_time(text: str | None) -> float | None:
    """`--since`: a date (local midnight), a date and time, or `Nd` (N days ago)."""
    if not text:
        return None
    if text.endswith("d") and text[:-1].isdigit():
        return (dt.datetime.now() - dt.timedelta(days=int(text[:-1]))).timestamp()
    try:
        return dt.datetime.fromisoformat(text).timestamp()
    except ValueError:
        raise ValueError(
            f"--since {text!r}: use a date (2026-12-01), a date and time "
            "(2026-12-01T09:30), or a number of days (7d)"
        ) from None


def run(ns: argparse.Namespace) -> int:
    try:
        since = since_time(ns.since)
    except ValueError as exc:
        print(f"compactd: {exc}", file=sys.stderr)
        return 2
    url = ns.store or os.environ.get("COMPACTD_STORE") or None
    data_dir = ns.data_dir or os.environ.get("COMPACTD_DATA_DIR") or None
    try:
        store = open_store(url, data_dir)
        try:
            rows = store.read_requests(since - CONTEXT_SECONDS if since is not None else None)
        finally:
            store.close()
    except CompactdError as exc:
        print(f"compactd: {exc}", file=sys.stderr)
        return 2
    report = summarize(rows, since, ns.session)
    if ns.session and not report["sessions"]:
        print(f"compactd: no proxied session {ns.session!r} in the request log", file=sys.stderr)
        return 2
    if ns.json:
        sys.stdout.write(orjson.dumps(report, option=orjson.OPT_INDENT_2).decode() + "\n")
        return 0
    print_stats(report, color=ns.color)
    return 0
