"""Copy sessions between stores (`compactd migrate --to URL` / `--from URL`).

Idempotent: a session the target already holds identically is left alone, one whose log the
target holds a prefix of gets the rest appended, and one that differs is refused (nothing is
written to it). Every copied session is read back from the target and verified by event count
and a SHA-256 over its events, so a migration that reports success has lost nothing.
Only good events are copied: a torn tail or a bad line of a file log is reported, not carried.
The request log (what `compactd stats` sums) goes along: each row the target does not hold yet,
in the source's order, so a rerun copies only rows written since.
"""

from __future__ import annotations

import functools
import hashlib
from collections import Counter
from collections.abc import Callable, Iterable
from typing import Any

import attrs
import orjson

from ..errors import StoreFailure


class MigrationConflict(StoreFailure):
    """The target holds a different log under the same session id."""


@attrs.frozen
class Copied:
    session_id: str
    action: str  # "copied" | "extended" | "present" | "conflict"
    events: int
    digest: str
    skipped_lines: int = 0  # bad lines or a torn tail in the source, not copied


@attrs.define
class MigrationReport:
    sessions: list[Copied] = attrs.field(factory=list)
    requests: int = 0  # rows of the request log copied (not those the target held)

    @property
    def ok(self) -> bool:
        return all(c.action != "conflict" for c in self.sessions)


def digest(events: Iterable[dict[str, Any]]) -> str:
    """SHA-256 of the events in a canonical form (sorted keys), whatever store they came from."""
    h = hashlib.sha256()
    for event in events:
        h.update(orjson.dumps(event, option=orjson.OPT_SORT_KEYS))
        h.update(b"\n")
    return h.hexdigest()


def migrate(
    source: Any, target: Any, progress: Callable[[Copied], None] | None = None
) -> MigrationReport:
    """Copy every session of `source` into `target` (both `SessionStore`s)."""
    report = MigrationReport()
    for sid in source.list_sessions():
        done = _copy(source, target, sid)
        report.sessions.append(done)
        if progress is not None:
            progress(done)
    report.requests = _copy_requests(source, target)
    return report


def _copy_requests(source: Any, target: Any) -> int:
    """The source's request-log rows the target does not hold (compared whole), appended in
    the source's order; how many."""
    key = functools.partial(orjson.dumps, option=orjson.OPT_SORT_KEYS)
    held = Counter(key(row) for row in target.read_requests())
    rows = []
    for row in source.read_requests():
        k = key(row)
        if held[k]:
            held[k] -= 1
        else:
            rows.append(row)
    if rows:
        target.log_requests(rows)
    return len(rows)


def _copy(source: Any, target: Any, sid: str) -> Copied:
    events, loaded = source.read_from(sid, 0)
    skipped = len(loaded.bad_lines) + int(loaded.torn_tail)
    want = digest(events)
    if not target.exists(sid):
        if not events:
            raise StoreFailure(f"session {sid} has no readable events to copy", sessionId=sid)
        target.create(sid, events)
        action = "copied"
    else:
        theirs, _ = target.read_from(sid, 0)
        if len(theirs) == len(events) and digest(theirs) == want:
            return Copied(sid, "present", len(events), want, skipped)
        if len(theirs) > len(events) or digest(theirs) != digest(events[: len(theirs)]):
            return Copied(sid, "conflict", len(theirs), digest(theirs), skipped)
        with target.locked(sid):
            now, _ = target.read_from(sid, 0)
            if len(now) != len(theirs):  # someone wrote meanwhile: leave it to a rerun
                return Copied(sid, "conflict", len(now), digest(now), skipped)
            target.append(sid, events[len(theirs) :])
        action = "extended"
    back, _ = target.read_from(sid, 0)
    if len(back) != len(events) or digest(back) != want:
        raise StoreFailure(
            f"session {sid} did not verify after copying: {len(back)} events read back of "
            f"{len(events)}, digest {digest(back)[:12]} ≠ {want[:12]}",
            sessionId=sid,
        )
    return Copied(sid, action, len(events), want, skipped)
