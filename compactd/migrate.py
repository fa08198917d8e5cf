"""`compactd migrate`: copy the data dir's sessions into a store URL (`--to`) or back (`--from`).

Here, in the composition root, because it opens stores directly (the client CLI only talks
to a daemon); the copying and verifying is `compactd.context.stores.migrate`.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from .context.errors import CompactdError
from .context.stores import default_data_dir, open_store, redact
from .context.stores.migrate import Copied, migrate


def run(ns: argparse.Namespace) -> int:
    """0 when every session is in the target and verified; 1 on a conflict; 2 on an error."""
    data_dir = Path(ns.data_dir) if ns.data_dir else default_data_dir()
    url = ns.to or ns.from_
    files = open_store(None, data_dir)
    try:
        other = open_store(url, None)
    except CompactdError as exc:
        print(f"compactd: {exc}", file=sys.stderr)
        return 2
    source, target = (files, other) if ns.to else (other, files)
    where = f"{data_dir} → {redact(url)}" if ns.to else f"{redact(url)} → {data_dir}"
    print(f"migrating {where}")

    def say(done: Copied) -> None:
        extra = f", {done.skipped_lines} bad line(s) not copied" if done.skipped_lines else ""
        print(f"{done.action:9} {done.session_id}  {done.events} events  {done.digest[:16]}{extra}")

    try:
        report = migrate(source, target, progress=say)
    except CompactdError as exc:
        print(f"compactd: {exc}", file=sys.stderr)
        return 2
    finally:
        other.close()
    counts = {a: sum(c.action == a for c in report.sessions) for a in ("copied", "extended")}
    counts |= {a: sum(c.action == a for c in report.sessions) for a in ("present", "conflict")}
    print(", ".join(f"{n} {a}" for a, n in counts.items()) + f"; {report.requests} request row(s)")
    if not report.ok:
        print(
            "compactd: some sessions differ in the target; they were left as they are",
            file=sys.stderr,
        )
        return 1
    return 0
