"""The session graph: nodes, threads, branches, turns and records, built from log events.

A session is an append-only DAG (DESIGN §2). Nothing here changes after it is written: a tool
result and a function's completion are events that *complete* a node, and everything that
changes the context is a `Record` beside the nodes. `Graph.apply` is the only way state
changes, so loading a log and appending live produce the same graph.

Threads are chains of user/assistant nodes. The top-level thread of a branch runs from the
root to the branch head; a function's internal thread starts at a node whose parent is the
function. Tool nodes hang off the assistant node that called them, a function off the tool
node that called it (or off an assistant node when the model did not call it as a tool).

Turns — the only places where history may be cut — are a property of a thread: a turn starts
at every non-meta user node. `Path` exposes them, computed once as nodes are appended.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterator
from typing import Any

import attrs

from .errors import InvalidGraph, UnknownBranch, UnknownNode

NODE_KINDS = ("user", "assistant", "tool", "function")
THREAD_KINDS = frozenset({"user", "assistant"})
FUNCTION_STATUSES = ("running", "completed", "error")
EXPOSE_MODES = ("io", "full", "none")
DEFAULT_BRANCH = "main"


@attrs.define(slots=True, eq=False)
class Node:
    """One node. Fields that do not apply to a kind stay at their defaults."""

    id: str
    kind: str
    parent: str | None
    seq: int
    ts: float
    # user / assistant: content blocks (an assistant's tool_use blocks are its tool nodes)
    content: list[dict[str, Any]] = attrs.field(factory=list)
    meta: bool = False
    # tool (and function called as a tool)
    tool_use_id: str | None = None
    name: str | None = None
    input: Any = None
    index: int | None = None  # position of the tool_use block in the assistant message
    extra: dict[str, Any] | None = None  # other keys of the tool_use block, kept verbatim
    # tool result / function output (set by a completing event)
    result: Any = None
    is_error: bool = False
    answered: bool = False
    result_seq: int = 0
    # function
    status: str | None = None
    expose: str = "io"
    # derived, never persisted
    calls: list[str] = attrs.field(factory=list)  # assistant: tool/function children in order
    function: str | None = None  # tool: the function bound to this call
    owner: str | None = None  # thread nodes: None (top level) or the owning function's id
    anchor: str = ""  # the top-level thread node this node lives under
    cache: dict[Any, Any] = attrs.field(factory=dict)  # render/token memo for this node

    @property
    def is_thread(self) -> bool:
        return self.kind in THREAD_KINDS

    @property
    def starts_turn(self) -> bool:
        return self.kind == "user" and not self.meta

    @property
    def pending(self) -> bool:
        """A call waiting for its result (a tool node, or a running function)."""
        if self.kind == "tool":
            return not self.answered
        return self.kind == "function" and self.status == "running"

    def to_json(self) -> dict[str, Any]:
        """The node as written in the log (derived fields omitted)."""
        out: dict[str, Any] = {"id": self.id, "kind": self.kind, "parent": self.parent}
        if self.kind in THREAD_KINDS:
            out["content"] = self.content
            if self.meta:
                out["meta"] = True
        elif self.kind == "tool":
            out.update(tool_use_id=self.tool_use_id, name=self.name, input=self.input)
            if self.index is not None:
                out["index"] = self.index
            if self.extra:
                out["extra"] = self.extra
        else:
            out.update(name=self.name, input=self.input, expose=self.expose)
            if self.tool_use_id is not None:
                out["tool_use_id"] = self.tool_use_id
        return out


@attrs.define(slots=True, eq=False)
class Record:
    """Something that changes the context, written beside the nodes it covers.

    A record applies to a thread only when every node it covers lies on that thread's path;
    since covered thread nodes form a chain, that holds exactly when `anchor` (the deepest
    covered node) does.
    """

    id: str
    kind: str
    seq: int
    ts: float
    covers: list[str]
    data: dict[str, Any]
    thread: str | None = None  # None: a top-level thread; else the function whose thread
    anchor: str | None = None  # derived
    cache: dict[Any, Any] = attrs.field(factory=dict)  # derived: memo of what it hides, per line

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"id": self.id, "kind": self.kind, "covers": self.covers}
        if self.data:
            out["data"] = self.data
        if self.thread is not None:
            out["thread"] = self.thread
        return out


class Line:
    """A growable chain of thread node ids shared by every path that is a prefix of it."""

    __slots__ = ("bounds", "ids", "pos", "tools", "turn_starts")

    def __init__(self, ids: list[str], starts: list[int], pos: dict[str, int]) -> None:
        self.ids = ids
        self.pos = pos
        self.turn_starts = starts
        # (length, turn bounds) of the path last asked: a prefix never changes, so a longer
        # path of the same line only adds to it
        self.bounds: tuple[int, tuple[tuple[int, int], ...]] | None = None
        # tools[i]: tool calls of the nodes ids[:i], for nodes that have a successor here (a
        # node's tool nodes are written right after it, before the next thread node: final)
        self.tools: list[int] = [0]


@attrs.frozen(slots=True)
class Path:
    """The thread from its root to one head: `line.ids[:length]`."""

    line: Line
    length: int
    owner: str | None  # None: top level; else the function whose internal thread this is

    def __len__(self) -> int:
        return self.length

    def __contains__(self, node_id: object) -> bool:
        i = self.line.pos.get(node_id)  # type: ignore[call-overload]
        return i is not None and i < self.length

    def index(self, node_id: str) -> int:
        i = self.line.pos.get(node_id)
        if i is None or i >= self.length:
            raise KeyError(node_id)
        return i

    @property
    def ids(self) -> list[str]:
        return self.line.ids[: self.length]

    @property
    def head(self) -> str | None:
        return self.line.ids[self.length - 1] if self.length else None

    def tool_count(self, nodes: dict[str, Node]) -> int:
        """Tool calls on the thread, without walking the history on every call: the counts of
        nodes that have a successor on the line are kept and only extended."""
        line = self.line
        tools, ids = line.tools, line.ids
        final = len(ids) - 1  # nodes before the line's last one have their tool nodes
        while len(tools) <= final:
            node = nodes[ids[len(tools) - 1]]
            tools.append(tools[-1] + sum(1 for c in node.calls if nodes[c].kind == "tool"))
        done = min(self.length, final)
        count = tools[done]
        for node_id in ids[done : self.length]:
            count += sum(1 for c in nodes[node_id].calls if nodes[c].kind == "tool")
        return count

    def turn_bounds(self) -> tuple[tuple[int, int], ...]:
        """Half-open index ranges of the turns; a leading run before the first user node
        (an assistant opener, meta content) is a turn of its own.

        Every render asks for them; they are kept on the line and extended as it grows, so
        a long session does not rebuild them all after each append."""
        if self.length == 0:
            return ()
        line = self.line
        memo = line.bounds
        if memo is not None and memo[0] == self.length:
            return memo[1]
        starts = line.turn_starts
        end = bisect.bisect_left(starts, self.length)
        if memo is not None and 0 < memo[0] < self.length:
            kept = memo[1][:-1]  # every turn but the last is final
            firsts = [memo[1][-1][0], *starts[bisect.bisect_right(starts, memo[1][-1][0]) : end]]
        else:
            kept = ()
            firsts = list(starts[:end])
            if not firsts or firsts[0] != 0:
                firsts.insert(0, 0)
        last = len(firsts) - 1
        bounds = kept + tuple(
            (b, firsts[i + 1] if i < last else self.length) for i, b in enumerate(firsts)
        )
        line.bounds = (self.length, bounds)
        return bounds


class Graph:
    """All state of one session, rebuilt by applying its log events in order."""

    def __init__(self, session_id: str) -> None:
        self.session_id = session_id
        self.nodes: dict[str, Node] = {}
        # tool_use id -> the tool nodes that carry it, oldest first: an id is unique on a
        # branch, not in the session (a client's compacted history repeats the ids of the
        # exchanges it kept, and lives on a branch of its own)
        self.calls_by_use_id: dict[str, list[str]] = {}
        self.branches: dict[str, str | None] = {DEFAULT_BRANCH: None}
        self.current_branch = DEFAULT_BRANCH
        self.function_heads: dict[str, str | None] = {}
        self.running: set[str] = set()  # derived: ids of functions still running
        self.records: list[Record] = []
        self.config: dict[str, Any] = {}
        self.meta: dict[str, Any] = {}
        self.seq = 0
        self.created = 0.0
        self.last_activity = 0.0
        self.version = 0  # bumps on every applied event, for caches keyed on the graph
        self.records_version = 0  # bumps when a record is added
        self.memo: dict[Any, Any] = {}  # derived views of records, keyed by what they depend on
        self._paths: dict[str, Path] = {}
        self._empty: dict[str | None, Path] = {}

    # ---- lookups -------------------------------------------------------------------------

    def node(self, node_id: str) -> Node:
        try:
            return self.nodes[node_id]
        except KeyError:
            raise UnknownNode(
                f"session {self.session_id} has no node {node_id!r}", nodeId=node_id
            ) from None

    def tool_by_use_id(self, tool_use_id: str, path: Path | None = None) -> Node | None:
        """The call with this tool_use id: the one on `path` when one is, else the latest."""
        ids = self.calls_by_use_id.get(tool_use_id)
        if not ids:
            return None
        if path is not None and len(ids) > 1:
            for node_id in reversed(ids):
                if self.on_path(node_id, path):
                    return self.nodes[node_id]
        return self.nodes[ids[-1]]

    def thread_path(self, node: Node) -> Path:
        """The thread a thread node lies on, from its root to it."""
        return self.path(node.id, node.owner)

    def head(self, branch: str | None = None, function: str | None = None) -> str | None:
        """The head of a branch's top-level thread, or of a function's internal thread."""
        if function is not None:
            fn = self.node(function)
            if fn.kind != "function":
                raise InvalidGraph(f"node {function!r} is not a function", nodeId=function)
            return self.function_heads.get(function)
        name = branch or self.current_branch
        if name not in self.branches:
            raise UnknownBranch(
                f"session {self.session_id} has no branch {name!r}",
                branch=name,
                branches=sorted(self.branches),
            )
        return self.branches[name]

    def path(self, head: str | None, owner: str | None = None) -> Path:
        """The thread ending at `head` (an empty path for an empty thread)."""
        if head is None:
            if owner not in self._empty:
                self._empty[owner] = Path(Line([], [], {}), 0, owner)
            return self._empty[owner]
        cached = self._paths.get(head)
        if cached is not None:
            return cached
        # climb to the nearest node whose path is known, then extend back down
        chain: list[str] = []
        cur: str | None = head
        while cur is not None and cur not in self._paths:
            node = self.nodes[cur]
            chain.append(cur)
            parent = self.nodes.get(node.parent) if node.parent is not None else None
            cur = parent.id if parent is not None and parent.is_thread else None
        base = self._paths[cur] if cur is not None else None
        for node_id in reversed(chain):
            base = self._extend(base, self.nodes[node_id])
            self._paths[node_id] = base
        assert base is not None
        return base

    def _extend(self, base: Path | None, node: Node) -> Path:
        if base is None:
            line = Line([], [], {})
        elif len(base.line.ids) == base.length:
            line = base.line  # grow in place: every older path stays a valid prefix
        else:  # a fork: copy the shared prefix once
            ids = base.line.ids[: base.length]
            line = Line(
                ids,
                [s for s in base.line.turn_starts if s < base.length],
                {x: i for i, x in enumerate(ids)},
            )
        i = len(line.ids)
        line.ids.append(node.id)
        line.pos[node.id] = i
        if node.starts_turn:
            line.turn_starts.append(i)
        return Path(line, i + 1, node.owner)

    def branch_path(self, branch: str | None = None) -> Path:
        return self.path(self.head(branch), None)

    def function_path(self, function: str) -> Path:
        return self.path(self.head(function=function), function)

    def on_path(self, node_id: str, path: Path) -> bool:
        """Whether a node (of any kind) lies on `path` or hangs off a node that does."""
        node = self.nodes.get(node_id)
        if node is None:
            return False
        if path.owner is None:
            return node.anchor in path
        # inside a function's thread: climb to the thread node owned by that function
        cur: Node | None = node
        while cur is not None and not (cur.is_thread and cur.owner == path.owner):
            cur = self.nodes.get(cur.parent) if cur.parent is not None else None
        return cur is not None and cur.id in path

    def calls_of(self, node: Node) -> Iterator[Node]:
        for call_id in node.calls:
            yield self.nodes[call_id]

    def pending_calls(self, assistant: Node) -> list[Node]:
        """Calls of an assistant node still waiting for a result."""
        out = []
        for call in self.calls_of(assistant):
            if (call.kind == "tool" and not call.answered) or (
                call.kind == "function" and call.status == "running"
            ):
                out.append(call)
        return out

    def function_of_thread_root(self, node: Node) -> Node | None:
        parent = self.nodes.get(node.parent) if node.parent else None
        return parent if parent is not None and parent.kind == "function" else None

    # ---- applying events -----------------------------------------------------------------

    def apply(self, event: dict[str, Any]) -> None:
        """Apply one log event. Events are validated before they are written, so a failure
        here means the log itself is inconsistent (`InvalidGraph`); the loader reports it."""
        kind = event["t"]
        seq = event["seq"]
        ts = float(event.get("ts", 0.0))
        if seq <= self.seq:
            raise InvalidGraph(f"event seq {seq} is not after {self.seq}", seq=seq)
        handler = _HANDLERS.get(kind)
        if handler is None:
            raise InvalidGraph(f"unknown event type {kind!r}", seq=seq)
        handler(self, event, seq, ts)
        self.seq = seq
        self.version += 1
        if kind in ("node", "result", "fdone", "activity"):
            self.last_activity = max(self.last_activity, ts)

    def _apply_open(self, event: dict[str, Any], seq: int, ts: float) -> None:
        self.created = ts
        self.last_activity = max(self.last_activity, ts)
        self.config = dict(event.get("config") or {})
        self.meta = dict(event.get("meta") or {})

    def _apply_node(self, event: dict[str, Any], seq: int, ts: float) -> None:
        raw = event["n"]
        node_id = raw["id"]
        if node_id in self.nodes:
            raise InvalidGraph(f"duplicate node id {node_id!r}", nodeId=node_id)
        kind = raw["kind"]
        parent_id = raw.get("parent")
        parent = self.nodes.get(parent_id) if parent_id is not None else None
        if parent_id is not None and parent is None:
            raise InvalidGraph(f"node {node_id!r} has unknown parent {parent_id!r}")
        node = Node(id=node_id, kind=kind, parent=parent_id, seq=seq, ts=ts)
        if kind in THREAD_KINDS:
            node.content = raw.get("content") or []
            node.meta = bool(raw.get("meta", False))
            if parent is None:
                node.owner, node.anchor = None, node_id
            elif parent.kind == "function":
                node.owner, node.anchor = parent.id, parent.anchor
            elif parent.is_thread:
                node.owner = parent.owner
                node.anchor = node_id if parent.owner is None else parent.anchor
            else:
                raise InvalidGraph(f"a {kind} node cannot hang off a {parent.kind} node")
            if node.owner is None:
                branch = event.get("b") or DEFAULT_BRANCH
                self.branches[branch] = node_id
            else:
                self.function_heads[node.owner] = node_id
        elif kind == "tool":
            if parent is None or parent.kind != "assistant":
                raise InvalidGraph(f"tool node {node_id!r} must hang off an assistant node")
            node.tool_use_id = raw["tool_use_id"]
            node.name = raw["name"]
            node.input = raw.get("input", {})
            node.index = raw.get("index")
            node.extra = raw.get("extra")
            node.anchor = parent.anchor
            same = self.calls_by_use_id.setdefault(node.tool_use_id, [])
            if same:
                thread = self.thread_path(parent)
                if any(self.on_path(other, thread) for other in same):
                    raise InvalidGraph(f"duplicate tool_use_id {node.tool_use_id!r} on a thread")
            same.append(node_id)
            parent.calls.append(node_id)
        elif kind == "function":
            if parent is None or parent.kind not in ("assistant", "tool"):
                raise InvalidGraph(f"function {node_id!r} must hang off an assistant or tool node")
            node.name = raw["name"]
            node.input = raw.get("input")
            node.expose = raw.get("expose", "io")
            node.tool_use_id = raw.get("tool_use_id")
            node.status = "running"
            node.anchor = parent.anchor
            if parent.kind == "tool":
                parent.function = node_id
            else:
                parent.calls.append(node_id)
            self.function_heads[node_id] = None
            self.running.add(node_id)
        else:
            raise InvalidGraph(f"unknown node kind {kind!r}")
        self.nodes[node_id] = node

    def _apply_result(self, event: dict[str, Any], seq: int, ts: float) -> None:
        node = self.nodes.get(event["node"])
        if node is None or node.kind != "tool":
            raise InvalidGraph(f"result for unknown tool node {event['node']!r}")
        if node.answered:
            raise InvalidGraph(f"tool node {node.id!r} already has a result")
        node.result = event.get("content", "")
        node.is_error = bool(event.get("is_error", False))
        node.answered = True
        node.result_seq = seq

    def _apply_function_done(self, event: dict[str, Any], seq: int, ts: float) -> None:
        fn = self.nodes.get(event["node"])
        if fn is None or fn.kind != "function":
            raise InvalidGraph(f"completion for unknown function {event['node']!r}")
        if fn.status != "running":
            raise InvalidGraph(f"function {fn.id!r} is already {fn.status}")
        fn.status = event["status"]
        self.running.discard(fn.id)
        fn.result = event.get("output")
        fn.is_error = fn.status == "error"
        fn.result_seq = seq
        parent = self.nodes.get(fn.parent) if fn.parent else None
        if parent is not None and parent.kind == "tool" and parent.function == fn.id:
            parent.result = fn.result
            parent.is_error = fn.is_error
            parent.answered = True
            parent.result_seq = seq

    def _apply_branch(self, event: dict[str, Any], seq: int, ts: float) -> None:
        head = event.get("head")
        if head is not None and head not in self.nodes:
            raise InvalidGraph(f"branch {event['name']!r} points at unknown node {head!r}")
        self.branches[event["name"]] = head

    def _apply_checkout(self, event: dict[str, Any], seq: int, ts: float) -> None:
        if event["name"] not in self.branches:
            raise InvalidGraph(f"checkout of unknown branch {event['name']!r}")
        self.current_branch = event["name"]

    def _apply_record(self, event: dict[str, Any], seq: int, ts: float) -> None:
        raw = event["r"]
        record = Record(
            id=raw["id"],
            kind=raw["kind"],
            seq=seq,
            ts=ts,
            covers=list(raw.get("covers", [])),
            data=dict(raw.get("data") or {}),
            thread=raw.get("thread"),
        )
        record.anchor = self._deepest(record.covers)
        self.records.append(record)
        self.records_version += 1

    def _apply_config(self, event: dict[str, Any], seq: int, ts: float) -> None:
        self.config.update(event.get("config") or {})

    def _apply_activity(self, event: dict[str, Any], seq: int, ts: float) -> None:
        return None

    def _deepest(self, covers: list[str]) -> str | None:
        """The covered node deepest in its thread: all others are its ancestors or hang off
        them when the record is well formed, so it alone decides applicability."""
        best: str | None = None
        best_key = (-1, -1)
        # a node's depth is its position on any line holding it: look it up on the heads'
        # lines first, rather than building a path object for every covered node
        heads = [h for h in (*self.branches.values(), *self.function_heads.values()) if h]
        lines = [p.line for p in (self._paths.get(h) for h in heads) if p is not None]
        for node_id in covers:
            node = self.nodes.get(node_id)
            if node is None:
                continue
            thread_node = node
            while not thread_node.is_thread and thread_node.parent is not None:
                thread_node = self.nodes[thread_node.parent]
            depth = next(
                (i + 1 for line in lines if (i := line.pos.get(thread_node.id)) is not None),
                None,
            )
            if depth is None:
                depth = self.path(thread_node.id, thread_node.owner).length
            key = (depth, node.seq)
            if key > best_key:
                best, best_key = thread_node.id, key
        return best

    def draft_record(
        self, kind: str, covers: list[str], data: dict[str, Any], thread: str | None = None
    ) -> Record:
        """A record held in memory only — what a tier tries before it decides to write it."""
        record = Record(
            id=f"draft{len(self.records)}",
            kind=kind,
            seq=self.seq + 1,
            ts=0.0,
            covers=covers,
            data=data,
            thread=thread,
        )
        record.anchor = self._deepest(covers)
        return record

    def record_applies(self, record: Record, path: Path) -> bool:
        if record.thread != path.owner or record.anchor is None:
            return False
        return record.anchor in path


_HANDLERS = {
    "open": Graph._apply_open,
    "node": Graph._apply_node,
    "result": Graph._apply_result,
    "fdone": Graph._apply_function_done,
    "branch": Graph._apply_branch,
    "checkout": Graph._apply_checkout,
    "record": Graph._apply_record,
    "config": Graph._apply_config,
    "activity": Graph._apply_activity,
}
