"""Sessions: a graph bound to its log, and every operation that writes to it.

Each write validates its input against the graph first (so bad input raises a typed error and
nothing reaches the log), then — holding the session's lock, after reading what other writers
appended — writes its events with one fsync, and only then applies them in memory.
"""

from __future__ import annotations

import contextlib
import gc
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import attrs

from .blocks import check_result_content
from .decompose import ResultSpec, Spec, ThreadSpec
from .errors import (
    HeadConflict,
    InvalidContent,
    InvalidGraph,
    InvalidPairing,
    PendingToolResults,
    StoreFailure,
    UnknownBranch,
)
from .graph import EXPOSE_MODES, Graph, Node, Path
from .stores.interface import (
    SESSION_ID_RE,
    LoadReport,
    SessionStore,
    check_session_id,
    log_lines,
)

Clock = Callable[[], float]
UNSET: Any = object()
"""`expected_head` not given (None means: expect an empty thread)."""


@attrs.define
class _Held:
    """Writes applied in memory and kept back from the log for one owner (a request that may
    yet be refused): written by `Session.flush`, forgotten by `Session.drop`."""

    owner: object
    events: list[dict[str, Any]] = attrs.field(factory=list)
    durable: bool = False
    open: bool = True  # new writes join it (inside `Session.holding`)


@attrs.frozen
class AppendResult:
    head: str | None
    node_ids: list[str]
    seq: int


class Session:
    """One session's graph and log. Not thread-safe: the daemon serializes calls per session."""

    def __init__(
        self,
        store: SessionStore,
        graph: Graph,
        offset: int,
        report: LoadReport,
        clock: Clock = time.time,
    ) -> None:
        self.store = store
        self.graph = graph
        self.offset = offset
        self.report = report
        self.clock = clock
        self._buffer: list[dict[str, Any]] | None = None
        self.unborn: list[dict[str, Any]] | None = None  # events of a log not yet created
        self.listeners: list[Callable[[list[dict[str, Any]]], None]] = []
        self._held: _Held | None = None
        self.on_reload: list[Callable[[], None]] = []  # what else holds state of this graph

    @property
    def id(self) -> str:
        return self.graph.session_id

    # ---- reading what others wrote ----------------------------------------------------------

    def catch_up(self) -> list[dict[str, Any]]:
        """Apply events other writers appended since we last read; returns them. Not while
        writes are held back (theirs are read when ours are written: `_write_held`)."""
        if self._buffer is not None or self._held is not None or self.unborn is not None:
            return []
        if self.store.unchanged(self.id, self.offset):
            self.report.torn_tail = False  # nothing past what we read (a stat, not a read)
            return []
        events, report = self.store.read_from(self.id, self.offset)
        applied = []
        for event in events:
            seq = event.get("seq")
            if isinstance(seq, int) and seq <= self.graph.seq:
                continue  # already ours
            if apply_or_report(self.graph, event, self.report):
                applied.append(event)
        self.offset = report.end_offset
        self.report.torn_tail = report.torn_tail
        if applied:
            for listener in self.listeners:
                listener(applied)
        return applied

    # ---- the one write path -------------------------------------------------------------------

    def commit(
        self, build: Callable[[Graph, int, float], list[dict[str, Any]]], *, durable: bool = True
    ) -> list[dict[str, Any]]:
        """Validate-and-build events with `build(graph, next_seq, now)`, write them, apply
        (`durable=False`: see `SessionStore.append`)."""
        if self._buffer is not None:
            events = build(self.graph, self.graph.seq + 1, self.clock())
            for event in events:
                self.graph.apply(event)
            self._buffer.extend(events)
            return events
        held = self._held
        if held is not None and held.open:
            events = build(self.graph, self.graph.seq + 1, self.clock())
            log_lines(events, self.store.max_event_bytes)  # what the store would refuse, now
            for event in events:
                self.graph.apply(event)
            held.events.extend(events)
            held.durable = held.durable or durable
            return events
        if self.unborn is not None:
            self._create()
        with self.store.locked(self.id):
            self._write_held()
            self.catch_up()
            events = build(self.graph, self.graph.seq + 1, self.clock())
            if not events:
                return events
            self.offset = self.store.append(self.id, events, durable=durable)
            for event in events:
                self.graph.apply(event)
        return events

    # ---- writes held back ---------------------------------------------------------------------

    @contextlib.contextmanager
    def holding(self, owner: object) -> Iterator[None]:
        """Writes inside the block are applied in memory and kept back from the log for
        `owner` — a request the upstream may yet refuse, which must then leave nothing
        behind: `flush(owner)` writes them (with any later block's of the same owner),
        `drop(owner)` forgets them. Another owner's held writes are written first, and any
        other write writes them too: only the latest owner's can be dropped."""
        if self._held is not None and self._held.owner is not owner:
            self.flush()
        if self._held is None:
            self._held = _Held(owner)
        self._held.open = True
        try:
            yield
        finally:
            if self._held is not None:
                self._held.open = False

    def holds(self, owner: object) -> bool:
        return self._held is not None and self._held.owner is owner

    def flush(self, owner: object | None = None) -> None:
        """Write what is held (for `owner`, or whoever holds it), and an unborn log."""
        if owner is not None and not self.holds(owner):
            return
        if self.unborn is not None:
            self._create()
        elif self._held is not None and not self._held.events:
            self._held = None  # nothing to write
        elif self._held is not None:
            with self.store.locked(self.id):
                self._write_held()

    def drop(self, owner: object) -> bool:
        """Forget what `owner` holds: the graph is its log's again. False when it holds
        nothing (written already, by `flush` or another write)."""
        if not self.holds(owner):
            return False
        if self._held is not None and not self._held.events and self.unborn is None:
            self._held = None  # nothing was applied: the graph is its log's already
        else:
            self.reload()
        return True

    def _write_held(self) -> None:
        """Under the store's lock: the held writes go to the log. When another writer
        appended meanwhile, they cannot (their sequence numbers and ids may be taken): the
        session is read again from its log and they are gone — a copy of what a client
        resends, placed again by its next request."""
        held, self._held = self._held, None
        if held is None or not held.events:
            return
        try:
            if not self.store.unchanged(self.id, self.offset):
                theirs, _report = self.store.read_from(self.id, self.offset)
                if theirs:
                    self.reload()
                    return
            self.offset = self.store.append(self.id, held.events, durable=held.durable)
        except BaseException:
            self.reload()  # the graph must hold what the log holds, nothing more
            raise

    def _create(self) -> None:
        """An unborn session's log, made with what is held (a create takes no lock: it
        fails if the log exists). Another writer that made it meanwhile wins, as above."""
        assert self.unborn is not None
        held, self._held = self._held, None
        try:
            if self.store.exists(self.id):
                self.reload()
                return
            self.offset = self.store.create(self.id, self.unborn + (held.events if held else []))
            self.unborn = None
        except BaseException:
            self.reload()
            raise

    def reload(self) -> None:
        """The graph as the log holds it (an unborn session: its header alone): writes held
        or half-applied in memory are gone, and whatever keeps state of the graph hears."""
        self._held = None
        if self.unborn is not None and not self.store.exists(self.id):
            graph = Graph(self.id)
            graph.apply(self.unborn[0])
            self.graph, self.report = graph, LoadReport(events=1)
        else:
            self.unborn = None
            self.graph, self.report = read_graph(self.store, self.id)
            self.offset = self.report.end_offset
        for hook in self.on_reload:
            hook()

    @contextlib.contextmanager
    def buffered(self) -> Iterator[None]:
        """Collect writes in memory and write them with one fsync at the end (imports); an
        unborn session's log is created then, holding everything at once."""
        self._buffer = []
        try:
            yield
        except BaseException:
            self._buffer = None
            raise
        events, self._buffer = self._buffer, None
        if self.unborn is not None:
            self.offset = self.store.create(self.id, self.unborn + events)
            self.unborn = None
        elif events:
            with self.store.locked(self.id):
                self.offset = self.store.append(self.id, events)

    def pending_events(self) -> list[dict[str, Any]]:
        """What a `buffered` block holds that is not written yet (and an unborn session's
        header): what the block's end will write."""
        return [*(self.unborn or []), *(self._buffer or [])]

    # ---- conversation ----------------------------------------------------------------------

    def append(
        self,
        specs: list[Spec],
        *,
        branch: str | None = None,
        function: str | None = None,
        expected_head: Any = UNSET,
        allow_orphans: bool = False,
        durable: bool = True,
        fork_at: Any = UNSET,
    ) -> AppendResult:
        """Append decomposed messages to a branch's thread or a running function's thread.
        `fork_at`: `branch` is a new branch, made in the same write, whose thread starts
        after that node (None: a branch with no node) — so a history that cannot be appended
        leaves no branch behind either."""
        out: dict[str, Any] = {}

        def build(g: Graph, seq: int, now: float) -> list[dict[str, Any]]:
            fork: list[dict[str, Any]] = []
            if fork_at is not UNSET:
                fork = [_branch_event(g, str(branch), fork_at, seq, now)]
            events, ids, head = _plan_append(
                g,
                specs,
                branch=branch,
                function=function,
                expected_head=expected_head,
                allow_orphans=allow_orphans,
                seq=seq + len(fork),
                ts=now,
                start=fork_at,
            )
            out.update(ids=ids, head=head)
            return [*fork, *events]

        events = self.commit(build, durable=durable)
        return AppendResult(
            out["head"], out["ids"], events[-1]["seq"] if events else self.graph.seq
        )

    def tool_result(self, tool_use_id: str, content: Any, is_error: bool = False) -> AppendResult:
        check_result_content(content, "content")
        # a result attaches to its call wherever that call is; no branch is involved
        return self.append([ResultSpec(tool_use_id, content, is_error)])

    def function_start(
        self,
        name: str,
        input: Any,
        *,
        tool_use_id: str | None = None,
        parent: str | None = None,
        expose: str = "io",
        branch: str | None = None,
        function: str | None = None,
    ) -> str:
        """Start a function (sub-agent); returns its id. Called as a tool, it hangs off that
        call and its output becomes the call's result."""
        if not isinstance(name, str) or not name:
            raise InvalidContent("function name must be a non-empty string", field="name")
        if expose not in EXPOSE_MODES:
            raise InvalidContent(f"expose must be one of {list(EXPOSE_MODES)}", field="expose")
        out: dict[str, str] = {}

        def build(g: Graph, seq: int, now: float) -> list[dict[str, Any]]:
            if tool_use_id is not None:
                thread = g.path(g.head(branch, function), function)
                tool = g.tool_by_use_id(tool_use_id, thread)
                if tool is None:
                    raise InvalidPairing(
                        f"no tool call with id {tool_use_id!r} to run as a function",
                        toolUseId=tool_use_id,
                    )
                if tool.answered or tool.function is not None:
                    raise InvalidPairing(
                        f"tool call {tool_use_id!r} already has a result or a function",
                        toolUseId=tool_use_id,
                    )
                attach = tool.id
            else:
                attach = parent if parent is not None else g.head(branch, function)
                node = g.nodes.get(attach) if attach else None
                if node is None or node.kind != "assistant":
                    if attach is None:
                        where = "the thread is empty"
                    elif node is None:
                        where = f"got {attach!r}, which does not exist"
                    else:
                        where = f"got {attach!r}, a {node.kind} node"
                    raise InvalidGraph(
                        "a function not called as a tool must hang off an assistant node "
                        f"({where}); pass toolUseId or parent",
                        parent=attach,
                    )
            fid = _new_id(g, "f", seq)
            out["id"] = fid
            raw: dict[str, Any] = {
                "id": fid,
                "kind": "function",
                "parent": attach,
                "name": name,
                "input": input,
                "expose": expose,
            }
            if tool_use_id is not None:
                raw["tool_use_id"] = tool_use_id
            return [{"t": "node", "seq": seq, "ts": now, "n": raw}]

        self.commit(build)
        return out["id"]

    def function_complete(self, function_id: str, output: Any, status: str = "completed") -> None:
        if status not in ("completed", "error"):
            raise InvalidContent("status must be 'completed' or 'error'", field="status")
        check_result_content(output if output is not None else "", "output")

        def build(g: Graph, seq: int, now: float) -> list[dict[str, Any]]:
            fn = g.node(function_id)
            if fn.kind != "function":
                raise InvalidGraph(f"node {function_id!r} is not a function", nodeId=function_id)
            if fn.status != "running":
                raise InvalidGraph(
                    f"function {function_id!r} is already {fn.status}",
                    nodeId=function_id,
                    status=fn.status,
                )
            return [
                {
                    "t": "fdone",
                    "seq": seq,
                    "ts": now,
                    "node": function_id,
                    "output": output if output is not None else "",
                    "status": status,
                }
            ]

        self.commit(build)

    # ---- branches --------------------------------------------------------------------------

    def create_branch(
        self, name: str, from_node: str | None = None, *, empty: bool = False
    ) -> str | None:
        """A new branch whose head is `from_node` (default: the current head), or, `empty`,
        one with no node yet: a conversation that shares nothing with the others (the proxy
        forks there when a client's history differs from its very first message)."""
        if not isinstance(name, str) or not SESSION_ID_RE.fullmatch(name):
            raise InvalidContent(f"invalid branch name {name!r}", field="name")
        out: dict[str, str | None] = {}

        def build(g: Graph, seq: int, now: float) -> list[dict[str, Any]]:
            head = None if empty else from_node if from_node is not None else g.head()
            out["head"] = head
            return [_branch_event(g, name, head, seq, now)]

        self.commit(build)
        return out["head"]

    def checkout(self, name: str) -> str | None:
        # checked before anything else: `""` would fall back to the current branch below
        if not isinstance(name, str) or not SESSION_ID_RE.fullmatch(name):
            raise UnknownBranch(
                f"session {self.id} has no branch {name!r}",
                branch=name if isinstance(name, str) else repr(name),
                branches=sorted(self.graph.branches),
            )

        def build(g: Graph, seq: int, now: float) -> list[dict[str, Any]]:
            g.head(name)  # raises UnknownBranch
            if g.current_branch == name:
                return []
            return [{"t": "checkout", "seq": seq, "ts": now, "name": name}]

        self.commit(build)
        return self.graph.head(name)

    # ---- records and bookkeeping -----------------------------------------------------------

    def add_records(self, records: list[dict[str, Any]], *, durable: bool = True) -> list[str]:
        """Write records (`{kind, covers, data?, thread?}`); returns their ids."""
        out: list[str] = []

        def build(g: Graph, seq: int, now: float) -> list[dict[str, Any]]:
            events = []
            for i, rec in enumerate(records):
                for node_id in rec.get("covers", []):
                    if node_id not in g.nodes:
                        raise InvalidGraph(f"record covers unknown node {node_id!r}")
                rid = _new_id(g, "r", seq + i)
                out.append(rid)
                events.append({"t": "record", "seq": seq + i, "ts": now, "r": {"id": rid, **rec}})
            return events

        out.clear()
        self.commit(build, durable=durable)
        return out

    def touch(self) -> None:
        """Persist that the client was active now (idle timers read it after a restart)."""
        self.commit(lambda g, seq, now: [{"t": "activity", "seq": seq, "ts": now}])

    def update_config(self, config: dict[str, Any]) -> None:
        changed = {k: v for k, v in config.items() if self.graph.config.get(k) != v}
        if changed:
            self.commit(
                lambda g, seq, now: [{"t": "config", "seq": seq, "ts": now, "config": changed}]
            )


class Library:
    """Creates, loads and lists sessions in one store."""

    def __init__(self, store: SessionStore, clock: Clock = time.time) -> None:
        self.store = store
        self.clock = clock

    def create(
        self,
        session_id: str | None = None,
        config: dict[str, Any] | None = None,
        meta: dict[str, Any] | None = None,
        *,
        unborn: bool = False,
    ) -> Session:
        """A new session. `unborn`: nothing is on disk until its `buffered()` block ends, so
        an import that fails half-way leaves no session behind."""
        sid = check_session_id(session_id) if session_id is not None else uuid.uuid4().hex
        now = self.clock()
        event = {
            "t": "open",
            "seq": 1,
            "ts": now,
            "sid": sid,
            "config": config or {},
            "meta": meta or {},
        }
        graph = Graph(sid)
        graph.apply(event)
        if unborn:
            if self.store.exists(sid):
                raise StoreFailure(f"session {sid} already exists", sessionId=sid)
            session = Session(self.store, graph, 0, LoadReport(events=1), self.clock)
            session.unborn = [event]
            return session
        size = self.store.create(sid, [event])
        return Session(self.store, graph, size, LoadReport(events=1, end_offset=size), self.clock)

    def load(self, session_id: str) -> Session:
        sid = check_session_id(session_id)
        graph, report = read_graph(self.store, sid)
        return Session(self.store, graph, report.end_offset, report, self.clock)

    def exists(self, session_id: str) -> bool:
        return self.store.exists(check_session_id(session_id))

    def list(self) -> list[str]:
        return self.store.list_sessions()


def read_graph(store: SessionStore, sid: str) -> tuple[Graph, LoadReport]:
    """A session's graph from its whole log."""
    with collector_paused():  # a log's objects all live on: no full collection mid-load
        events, report = store.read_from(sid, 0)
        graph = Graph(sid)
        for event in events:
            apply_or_report(graph, event, report)
    if not events or events[0].get("t") != "open" or graph.seq == 0:
        raise StoreFailure(
            f"the log of session {sid!r} has no valid header; it cannot be loaded",
            sessionId=sid,
            badLines=report.bad_lines,
        )
    return graph, report


def apply_or_report(graph: Graph, event: dict[str, Any], report: LoadReport) -> bool:
    """Apply one event read from a log; an event that does not fit (inconsistent, or of the
    wrong shape — a hand-edited or foreign line) is reported as a bad line, never fatal."""
    seq = event.get("seq")
    try:
        if not isinstance(seq, int) or isinstance(seq, bool):
            raise InvalidGraph(f"event seq must be an integer, got {seq!r}")
        graph.apply(event)
        return True
    except (InvalidGraph, KeyError, TypeError, ValueError, AttributeError):
        report.bad_lines.append(-seq if isinstance(seq, int) else 0)
        return False


# ---- planning an append ------------------------------------------------------------------


def _new_id(g: Graph, prefix: str, seq: int, taken: set[str] | None = None) -> str:
    candidate = f"{prefix}{seq}"
    k = 0
    while candidate in g.nodes or (taken and candidate in taken):
        k += 1
        candidate = f"{prefix}{seq}_{k}"
    return candidate


def _pending_ids(
    g: Graph, cursor: str | None, new_calls: dict[str, list[str]], answered: set[str]
) -> list[str]:
    if cursor is None:
        return []
    if cursor in new_calls:
        return [g_id for g_id in new_calls[cursor] if g_id not in answered]
    node = g.nodes.get(cursor)
    if node is None or node.kind != "assistant":
        return []
    return [c.id for c in g.pending_calls(node) if c.id not in answered]


def _branch_event(g: Graph, name: str, head: str | None, seq: int, ts: float) -> dict[str, Any]:
    """The event that makes branch `name` with its head at `head` (None: no node yet)."""
    if not SESSION_ID_RE.fullmatch(name):
        raise InvalidContent(f"invalid branch name {name!r}", field="name")
    if name in g.branches:
        raise InvalidGraph(f"branch {name!r} already exists", branch=name)
    if head is not None:
        node = g.node(head)
        if not node.is_thread or node.owner is not None:
            raise InvalidGraph(
                f"branches fork at top-level user/assistant nodes; {head!r} is a {node.kind} node",
                nodeId=head,
            )
    return {"t": "branch", "seq": seq, "ts": ts, "name": name, "head": head}


def _plan_append(
    g: Graph,
    specs: list[Spec],
    *,
    branch: str | None,
    function: str | None,
    expected_head: Any,
    allow_orphans: bool,
    seq: int,
    ts: float,
    start: Any = UNSET,
) -> tuple[list[dict[str, Any]], list[str], str | None]:
    """The events of an append (`start`: the head of a branch made in the same write)."""
    if start is not UNSET:
        head, branch_name = start, branch
    elif function is not None:
        fn = g.node(function)
        if fn.kind != "function":
            raise InvalidGraph(f"node {function!r} is not a function", nodeId=function)
        if fn.status != "running":
            raise InvalidGraph(
                f"function {function!r} is {fn.status}; its thread is closed", nodeId=function
            )
        head = g.function_heads.get(function)
        branch_name = None
    else:
        branch_name = branch or g.current_branch
        head = g.head(branch_name)
    if expected_head is not UNSET and expected_head != head:
        raise HeadConflict(
            f"expected head {expected_head!r} but the thread is at {head!r}",
            expectedHead=expected_head,
            head=head,
        )
    events: list[dict[str, Any]] = []
    ids: list[str] = []
    taken: set[str] = set()
    tool_ids: dict[str, str] = {}  # tool_use_id -> new tool node id
    new_calls: dict[str, list[str]] = {}  # new assistant id -> its tool node ids
    answered: set[str] = set()
    cursor = head
    # the thread appended to: a tool_use id is unique on it, and a result answers its call
    # there (an id may recur on another branch: a client's compacted history repeats them)
    thread = g.path(head, function)
    for spec in specs:
        if isinstance(spec, ResultSpec):
            stored = g.tool_by_use_id(spec.tool_use_id, thread)
            tid = tool_ids.get(spec.tool_use_id) or (stored.id if stored is not None else None)
            if tid is None:
                raise InvalidPairing(
                    f"tool_result for unknown tool_use_id {spec.tool_use_id!r}: no call has it",
                    toolUseId=spec.tool_use_id,
                )
            existing: Node | None = g.nodes.get(tid)
            if tid in answered or (existing is not None and existing.answered):
                raise InvalidPairing(
                    f"tool_use_id {spec.tool_use_id!r} already has a result",
                    toolUseId=spec.tool_use_id,
                )
            if existing is not None and existing.function is not None:
                raise InvalidPairing(
                    f"tool call {spec.tool_use_id!r} is answered by function "
                    f"{existing.function!r}; finish it with function/complete",
                    toolUseId=spec.tool_use_id,
                    functionId=existing.function,
                )
            event = {"t": "result", "seq": seq, "ts": ts, "node": tid, "content": spec.content}
            if spec.is_error:
                event["is_error"] = True
            events.append(event)
            answered.add(tid)
            seq += 1
            continue
        assert isinstance(spec, ThreadSpec)
        pending = _pending_ids(g, cursor, new_calls, answered)
        if pending and not allow_orphans:
            # a function the model did not call as a tool waits under its synthetic call id
            use_ids = [
                (g.nodes[p].tool_use_id if p in g.nodes else _use_id_of(tool_ids, p)) or f"fn_{p}"
                for p in pending
            ]
            raise PendingToolResults(
                f"the head still waits for tool results: {', '.join(use_ids)}",
                pendingToolUseIds=use_ids,
            )
        node_id = spec.node_id
        if node_id is not None:
            if not SESSION_ID_RE.fullmatch(node_id):
                raise InvalidContent(f"invalid node id {node_id!r}", nodeId=node_id)
            if node_id in g.nodes or node_id in taken:
                raise InvalidGraph(f"duplicate node id {node_id!r}", nodeId=node_id)
        else:
            node_id = _new_id(g, "n", seq, taken)
        taken.add(node_id)
        parent = cursor if cursor is not None else function
        raw: dict[str, Any] = {
            "id": node_id,
            "kind": spec.kind,
            "parent": parent,
            "content": spec.content,
        }
        if spec.meta:
            raw["meta"] = True
        event = {"t": "node", "seq": seq, "ts": ts, "n": raw}
        if branch_name is not None:
            event["b"] = branch_name
        events.append(event)
        ids.append(node_id)
        seq += 1
        cursor = node_id
        calls = new_calls.setdefault(node_id, [])
        for call in spec.calls:
            if call.tool_use_id in tool_ids or _on_thread(g, call.tool_use_id, thread):
                raise InvalidPairing(
                    f"duplicate tool_use_id {call.tool_use_id!r}", toolUseId=call.tool_use_id
                )
            tid = _new_id(g, "n", seq, taken)
            taken.add(tid)
            traw: dict[str, Any] = {
                "id": tid,
                "kind": "tool",
                "parent": node_id,
                "tool_use_id": call.tool_use_id,
                "name": call.name,
                "input": call.input,
                "index": call.index,
            }
            if call.extra:
                traw["extra"] = call.extra
            events.append({"t": "node", "seq": seq, "ts": ts, "n": traw})
            ids.append(tid)
            tool_ids[call.tool_use_id] = tid
            calls.append(tid)
            seq += 1
    return events, ids, cursor if cursor is not None else head


def _on_thread(g: Graph, tool_use_id: str, thread: Path) -> bool:
    """Whether a stored call with this id lies on the thread being appended to."""
    return any(g.on_path(node_id, thread) for node_id in g.calls_by_use_id.get(tool_use_id, ()))


def _use_id_of(tool_ids: dict[str, str], node_id: str) -> str | None:
    for use_id, tid in tool_ids.items():
        if tid == node_id:
            return use_id
    return None


@contextlib.contextmanager
def collector_paused() -> Iterator[None]:
    """The cyclic collector off while a log loads: millions of objects that all stay alive
    made it walk the growing heap again and again (a 100k-message load took twice as long).
    The collector is the process's, so what every thread allocated meanwhile is frozen
    (`gc.freeze`: never walked again, still freed by reference counting) before it is back
    on: else its first pass walked all of it at once (a 0.5 s pause for every thread, when
    another thread rendered a big session during the load)."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.freeze()
            gc.enable()
