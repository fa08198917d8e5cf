"""The engine: every operation the daemon exposes, over sessions in one store.

Thin over the modules that hold the rules: `session` writes, `render` renders, `cascade` runs
the tiers. The engine does no network I/O and starts no threads; summary providers are driven
by the daemon through `cascade`'s summary requests.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import attrs

from .budget import Calibration, reported_prompt_tokens
from .decompose import from_anthropic, from_nodes, from_openai
from .errors import InvalidContent
from .graph import Graph, Node
from .projection import USAGE
from .render.request import Rendered, RequestSpec, render_request
from .session import UNSET, AppendResult, Library, Session
from .store import Store
from .tokens import COUNTER, Counter
from .tool_aging.policy import Policy, policy_from_config
from .visibility import ViewOptions

Clock = Callable[[], float]


@attrs.frozen
class RenderParams:
    """Everything a render depends on besides the graph."""

    view: ViewOptions = attrs.field(factory=ViewOptions)
    spec: RequestSpec = attrs.field(factory=RequestSpec)


class Engine:
    def __init__(
        self, store: Store, *, clock: Clock = time.time, counter: Counter = COUNTER
    ) -> None:
        self.store = store
        self.library = Library(store, clock)
        self.clock = clock
        self.counter = counter
        self.sessions: dict[str, Session] = {}
        self._calibration: dict[str, tuple[int, Calibration]] = {}
        self._last_estimate: dict[str, tuple[str | None, int]] = {}

    # ---- sessions ----------------------------------------------------------------------------

    def open(
        self,
        session_id: str | None = None,
        config: dict[str, Any] | None = None,
        meta: dict[str, Any] | None = None,
    ) -> Session:
        """Load a session, or create it (a new id when none is given)."""
        if config is not None:
            policy_from_config(config)  # reject a bad config before anything is written
        if (session_id is not None and session_id in self.sessions) or (
            session_id is not None and self.library.exists(session_id)
        ):
            session = self.session(session_id)
        else:
            session = self.library.create(session_id, config, meta)
            self.sessions[session.id] = session
            return session
        if config:
            session.update_config(config)
        return session

    def session(self, session_id: str) -> Session:
        """A loaded session (loading it on first use), caught up with other writers."""
        session = self.sessions.get(session_id)
        if session is None:
            session = self.library.load(session_id)
            self.sessions[session_id] = session
        else:
            session.catch_up()
        return session

    def evict(self, session_id: str) -> None:
        self.sessions.pop(session_id, None)
        self._calibration.pop(session_id, None)

    def list(self) -> list[str]:
        return self.library.list()

    def policy(self, session: Session) -> Policy:
        return policy_from_config(session.graph.config)

    def calibration(self, session: Session) -> Calibration:
        """Per-model ratios replayed from the session's usage records (so a restarted daemon
        estimates exactly as before)."""
        version = session.graph.records_version
        cached = self._calibration.get(session.id)
        if cached is not None and cached[0] == version:
            return cached[1]
        cal = Calibration()
        for rec in session.graph.records:
            data = rec.data
            if rec.kind == USAGE and data.get("estimated") and data.get("reported"):
                adopt = cal.force if data.get("exact") else cal.observe
                adopt(data["model"], data["reported"], data["estimated"])
        self._calibration[session.id] = (version, cal)
        return cal

    # ---- writing ------------------------------------------------------------------------------

    def append(
        self,
        session_id: str,
        *,
        messages: Any = None,
        nodes: Any = None,
        format: str = "anthropic",
        branch: str | None = None,
        function: str | None = None,
        expected_head: Any = UNSET,
        allow_orphans: bool = False,
    ) -> AppendResult:
        if (messages is None) == (nodes is None):
            raise InvalidContent("give exactly one of messages or nodes", field="messages")
        if nodes is not None:
            specs = from_nodes(nodes)
        elif format == "anthropic":
            specs = from_anthropic(messages)
        elif format == "openai":
            specs = from_openai(messages)
        else:
            raise InvalidContent("format must be 'anthropic' or 'openai'", field="format")
        session = self.session(session_id)
        return session.append(
            specs,
            branch=branch,
            function=function,
            expected_head=expected_head,
            allow_orphans=allow_orphans,
        )

    # ---- rendering ----------------------------------------------------------------------------

    def render(self, session_id: str, params: RenderParams, *, remember: bool = True) -> Rendered:
        """Render without the cascade (the cascade lives in `cascade.run_cascade`)."""
        session = self.session(session_id)
        rendered = self.render_session(session, params)
        if remember:
            self._last_estimate[session_id] = (params.spec.model, rendered.estimate)
        return rendered

    def render_session(self, session: Session, params: RenderParams, **kw: Any) -> Rendered:
        return render_request(
            session.graph,
            params.view,
            params.spec,
            self.policy(session),
            self.calibration(session),
            counter=self.counter,
            **kw,
        )

    # ---- usage --------------------------------------------------------------------------------

    def record_usage(
        self,
        session_id: str,
        model: str,
        usage: dict[str, Any],
        estimated: int | None = None,
        exact: bool = False,
    ) -> float:
        """Keep what the provider counted for the last rendered request; later estimates for
        this model are scaled by the observed ratio."""
        session = self.session(session_id)
        if estimated is None:
            last = self._last_estimate.get(session_id)
            estimated = last[1] if last is not None else 0
        reported = reported_prompt_tokens(usage)
        data = {"model": model, "usage": usage, "reported": reported, "estimated": estimated}
        if exact:
            data["exact"] = True
        session.add_records([{"kind": USAGE, "covers": [], "data": data}])
        return self.calibration(session).ratio(model)

    # ---- inspection ---------------------------------------------------------------------------

    def inspect(
        self, session_id: str, node_id: str | None = None, branch: str | None = None
    ) -> dict[str, Any]:
        session = self.session(session_id)
        g = session.graph
        if node_id is not None:
            node = g.node(node_id)
            return {
                "sessionId": g.session_id,
                "node": node_view(g, node),
                "children": [node_view(g, c) for c in children_of(g, node)],
            }
        path = g.branch_path(branch)
        return {
            "sessionId": g.session_id,
            "branch": branch or g.current_branch,
            "head": path.head,
            "currentBranch": g.current_branch,
            "branches": dict(g.branches),
            "config": g.config,
            "meta": g.meta,
            "lastActivity": g.last_activity,
            "nodes": [node_view(g, g.nodes[i], with_calls=True) for i in path.ids],
            "records": [r.to_json() | {"seq": r.seq, "ts": r.ts} for r in g.records],
            "load": {
                "tornTail": session.report.torn_tail,
                "badLines": list(session.report.bad_lines),
            },
        }


def children_of(g: Graph, node: Node) -> list[Node]:
    """The nodes hanging directly under `node`: calls, a bound function, a function's thread."""
    out = list(g.calls_of(node))
    if node.kind == "tool" and node.function:
        out.append(g.nodes[node.function])
    if node.kind == "function":
        out.extend(g.nodes[i] for i in g.function_path(node.id).ids)
    return out


def node_view(g: Graph, node: Node, with_calls: bool = False) -> dict[str, Any]:
    """A node as inspection shows it: its stored fields plus its result or output."""
    view = node.to_json()
    view["seq"] = node.seq
    view["ts"] = node.ts
    if node.kind == "tool":
        view["answered"] = node.answered
        if node.answered:
            view["result"] = node.result
            view["isError"] = node.is_error
        if node.function:
            view["function"] = node.function
    elif node.kind == "function":
        view["status"] = node.status
        view["output"] = node.result
        view["head"] = g.function_heads.get(node.id)
    if with_calls and node.calls:
        view["calls"] = [node_view(g, c) for c in g.calls_of(node)]
    return view
