"""Applying an imported transcript's ops to a session.

`import_session` writes the whole conversation with one fsync (`import_sessions` several,
all or none); `Replayer` applies the same ops
step by step (a step ends at each `ModelCall`), which is how `compactd replay` and the
cascade tests relive a session the way the agent did.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import attrs

from ..decompose import from_anthropic
from ..errors import InvalidGraph, Stopped
from ..projection import ABANDON, NOTE
from ..session import Library, Session
from .compaction import compaction_record
from .plan import (
    Compaction,
    FunctionEnd,
    FunctionStart,
    ImportedSession,
    Messages,
    ModelCall,
    Note,
    Op,
)


def session_meta(imported: ImportedSession, source_digest: str | None = None) -> dict[str, Any]:
    """`sourceDigest` (the file's sha256) lets a re-import of the same file find it."""
    meta: dict[str, Any] = {
        "source": imported.source_format,
        "sourceId": imported.source_id,
    }
    if source_digest:
        meta["sourceDigest"] = source_digest
    if imported.model:
        meta["model"] = imported.model
    if imported.system:
        meta["system"] = imported.system
    if imported.title:
        meta["title"] = imported.title
    if imported.warnings:
        meta["importWarnings"] = list(imported.warnings)
    return meta


class OpApplier:
    """Applies ops to one session, remembering which function each thread key names. With
    `sent` (an `ImportedSession.sent`), tool results are what the recorded agent sent. With
    `compactions`, the agent's recorded compactions become summary records (an import); a
    replay leaves them out, so what it measures is compactd's own management."""

    def __init__(
        self, session: Session, sent: dict[str, Any] | None = None, *, compactions: bool = False
    ) -> None:
        self.session = session
        self.functions: dict[str, str] = {}
        self.now = session.clock()
        self.sent = sent or {}
        self.compactions = compactions

    def thread(self, key: str | None) -> str | None:
        if key is None:
            return None
        try:
            return self.functions[key]
        except KeyError:
            raise InvalidGraph(f"import refers to unknown function thread {key!r}") from None

    def apply(self, op: Op) -> None:
        if getattr(op, "timestamp", None) is not None:
            self.now = max(self.now, float(op.timestamp))  # type: ignore[arg-type]
        s = self.session
        if isinstance(op, Messages):
            if op.messages:
                messages = as_sent(op.messages, self.sent) if self.sent else op.messages
                s.append(
                    from_anthropic(messages), function=self.thread(op.thread), allow_orphans=True
                )
        elif isinstance(op, FunctionStart):
            fid = s.function_start(
                op.name, op.input, tool_use_id=op.tool_use_id, function=self.thread(op.thread)
            )
            self.functions[op.key] = fid
        elif isinstance(op, FunctionEnd):
            s.function_complete(self.thread(op.key) or "", op.output, op.status)
        elif isinstance(op, Note):
            s.add_records([{"kind": NOTE, "covers": [], "data": {"note": op.kind, **op.data}}])
        elif isinstance(op, Compaction) and self.compactions:
            record = compaction_record(s.graph, op, self.thread(op.thread))
            if record is not None:
                s.add_records([record])
        elif isinstance(op, Compaction):
            # a replay leaves the agent's compaction out, but not what it meant: calls still
            # open at that thread's head (the agent compacted before their results came)
            # never get one, so the next request renders them as such
            abandon_head(s, self.thread(op.thread))
        elif isinstance(op, ModelCall):
            return  # a step boundary, not data


def as_sent(messages: list[dict[str, Any]], sent: dict[str, Any]) -> list[dict[str, Any]]:
    """`messages` with each tool result named in `sent` replaced by what the agent sent."""
    out = []
    for msg in messages:
        content = msg.get("content")
        if isinstance(content, list) and any(
            isinstance(b, dict) and b.get("tool_use_id") in sent for b in content
        ):
            content = [
                {**b, "content": sent[b["tool_use_id"]]}
                if isinstance(b, dict)
                and b.get("type") == "tool_result"
                and b.get("tool_use_id") in sent
                else b
                for b in content
            ]
            msg = {**msg, "content": content}
        out.append(msg)
    return out


def import_session(
    library: Library,
    imported: ImportedSession,
    session_id: str | None = None,
    *,
    source_digest: str | None = None,
) -> Session:
    """Create a session holding the whole transcript, written with a single fsync."""
    return import_sessions(library, [(imported, source_digest)], session_id=session_id)[0]


def import_sessions(
    library: Library,
    conversations: list[tuple[ImportedSession, str | None]],
    *,
    session_id: str | None = None,
    stopped: Callable[[], bool] | None = None,
    before_writing: Callable[[list[Session]], None] | None = None,
) -> list[Session]:
    """Create one session per (conversation, source digest), all or none: each is built in
    memory and the logs are written (one fsync each) only once every one is built. `stopped`
    is asked before each op; when it says yes, `Stopped` is raised and nothing is written.
    `before_writing(sessions)` sees them all built, before any is written (an import's bound
    on what it writes): what it raises leaves nothing written either."""
    sessions: list[Session] = []
    with contextlib.ExitStack() as pending:
        for imported, digest in conversations:
            meta = session_meta(imported, digest)
            session = library.create(session_id, meta=meta, unborn=True)
            pending.enter_context(session.buffered())  # written when the stack closes
            _apply_all(session, imported, stopped)
            sessions.append(session)
        if before_writing is not None:
            before_writing(sessions)
    return sessions


def _apply_all(
    session: Session, imported: ImportedSession, stopped: Callable[[], bool] | None
) -> None:
    applier = OpApplier(session, compactions=True)
    real_clock = session.clock
    session.clock = lambda: applier.now
    try:
        for op in imported.ops:
            if stopped is not None and stopped():
                raise Stopped("the import was stopped before it wrote anything")
            applier.apply(op)
        abandon_open_calls(session)
    finally:
        session.clock = real_clock


def abandon_open_calls(session: Session) -> None:
    """The transcript ended while calls at a thread's head were still open: they will never
    get a result, so record that (they render as `[no result recorded]`, never as pending)."""
    g = session.graph
    heads = [(g.branches[b], None) for b in g.branches] + list(
        (head, fid) for fid, head in g.function_heads.items()
    )
    for head, owner in heads:
        _abandon(session, head, owner, "the transcript ended before a result")


def abandon_head(session: Session, function: str | None) -> None:
    """The calls open at the head of one thread (the top level's current branch, or a
    function's) will never get a result: the agent compacted before they came."""
    g = session.graph
    head = g.function_heads.get(function) if function else g.branches.get(g.current_branch)
    _abandon(session, head, function, "the agent compacted before a result")


def _abandon(session: Session, head: str | None, owner: str | None, reason: str) -> None:
    g = session.graph
    node = g.nodes.get(head) if head else None
    if node is None or node.kind != "assistant":
        return
    open_calls = [c.id for c in g.pending_calls(node) if c.kind == "tool" and c.function is None]
    if open_calls:
        session.add_records(
            [{"kind": ABANDON, "covers": open_calls, "thread": owner, "data": {"reason": reason}}]
        )


@attrs.frozen
class Step:
    """Ops up to (not including) one model call, and that call."""

    ops: list[Op]
    call: ModelCall | None  # None for trailing ops after the last call


def steps(imported: ImportedSession) -> Iterator[Step]:
    pending: list[Op] = []
    for op in imported.ops:
        if isinstance(op, ModelCall):
            yield Step(pending, op)
            pending = []
        else:
            pending.append(op)
    if pending:
        yield Step(pending, None)
