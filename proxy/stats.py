"""What the proxy records of its work, from the few places it happens: a render's cascade events,
a request's answer (`Proxy.report`), a request sent on unmanaged (`Proxy._plain`), a recall
follow-up and a summary call. The rows and their sums are `service/stats.py`'s; each wire's
usage fields are read by its own adapter into a `Usage` before they reach here.
"""

from __future__ import annotations

from typing import Any

import attrs

from ..context.engine import Engine, RenderParams
from ..context.graph import Graph
from ..context.projection import CLEAR, COLLAPSE, SNIP, SUMMARY
from ..context.recall import FROM, handle_for
from ..context.render.client import client_request_tokens
from ..context.render.conversation import TOOL_RESULTS
from ..context.render.request import Rendered
from ..context.session import Session
from ..context.tiers.base import TierEvent
from ..service.events import event_json
from ..service.stats import CallRow, PassedRow, Recorder, RequestRow, SplitFit, Usage

MAX_HANDLES = 20
"""Recall handles an event names on the page (a clear of hundreds of results names the newest)."""


def event_handles(graph: Graph, record_ids: list[str]) -> list[str]:
    """The handles of what an event's records left out: each cleared result's, and the
    transcript of each snipped, collapsed or summarized range."""
    wanted = set(record_ids)
    out: list[str] = []
    for record in graph.records:
        if record.id not in wanted or not record.covers:
            continue
        if record.kind == CLEAR:
            out.extend(handle_for(graph.session_id, node) for node in record.covers)
        elif record.kind in (SNIP, COLLAPSE, SUMMARY):
            out.append(handle_for(graph.session_id, record.covers[0], FROM))
    return out[-MAX_HANDLES:]


class Ledger:
    """The proxy's recording: rows built from what the handlers hold, taken by a `Recorder`."""

    def __init__(self, engine: Engine, recorder: Recorder) -> None:
        self.engine = engine
        self.recorder = recorder
        self._events: dict[tuple[str, str], list[TierEvent]] = {}  # (session, branch) -> …
        self._fits: dict[str, SplitFit] = {}  # per session: results and the rest, apart

    def rendered(self, session_id: str, branch: str, events: list[TierEvent]) -> None:
        """A render's cascade events, kept for the request's row (a retry's add to them)."""
        if self.recorder.enabled:
            self._events.setdefault((session_id, branch), []).extend(events)

    def request(
        self,
        session: Session,
        branch: str,
        params: RenderParams,
        rendered: Rendered,
        *,
        wire: str,
        usage: Usage | None,
        cleared: int = 0,
        status: int = 200,
    ) -> RequestRow | None:
        """The row of a request compactd managed; in the session's turn (it counts what the
        client sent from the branch, each node once in its life)."""
        events = self._events.pop((session.id, branch), [])
        if not self.recorder.enabled:
            return None
        spec = params.spec
        client = client_request_tokens(
            session.graph, branch, self.engine.counter, system=spec.system, tools=spec.tools
        )
        fit = self._fits.setdefault(session.id, SplitFit())
        if usage is not None:  # the request as sent, and the provider's count of it
            sent = rendered.server.sent if rendered.server and rendered.server.sent else None
            as_sent = sent or rendered
            results = as_sent.tally.by_category[TOOL_RESULTS]
            blocks = sum(len(m.parts) for m in as_sent.conversation.messages)
            counted = usage.prompt + (cleared if sent is not None else 0)
            fit.add((results, as_sent.tally.prompt - results, blocks), counted)
        ratio = self.engine.calibration(session).ratio(spec.model)
        terms = fit.coefficients() or (ratio, ratio, 0.0)
        features = (client.results, client.other, client.blocks)
        fitted = sum(t * f for t, f in zip(terms, features, strict=True))
        # a regression outside what it was fitted on is held to half the plain estimate
        client_tokens = round(max(fitted, 0.5 * ratio * client.total))
        budget = rendered.budget
        return RequestRow(
            at=self.recorder.now(),
            session_id=session.id,
            agent=str(session.graph.meta.get("client") or ""),
            wire=wire,
            model=spec.model or "",
            branch=branch,
            status=status,
            client_tokens=client_tokens,
            sent_tokens=round(rendered.sent_estimate * rendered.ratio),
            usage=usage,
            window=budget.window,
            limit=budget.limit,
            output_reserve=budget.output_reserve,
            categories=rendered.categories,
            ttl=spec.cache_ttl,
            ratios=terms,
            events=[
                {**event_json(e), "handles": event_handles(session.graph, e.record_ids)}
                for e in events
                if e.applied
            ],
        )

    def panel(self, rendered: Rendered, reported: int | None = None) -> dict[str, Any]:
        """The request as sent, as the session remembers it (`compactd context`): with the
        provider's count of it (`reported`), in that count — the session's calibration lags a
        change of what the request holds (a clear, a summary) by a request or two."""
        if reported and rendered.estimate:
            rendered = attrs.evolve(rendered, ratio=reported / rendered.estimate)
        return {"at": self.recorder.now(), "model": rendered.budget.model, **rendered.tokens()}

    def take(self, row: RequestRow | None) -> None:
        if row is not None:
            self.recorder.take(row)

    def passed(
        self, session_id: str | None, agent: str, wire: str, model: Any, reason: str
    ) -> None:
        self.recorder.take(
            PassedRow(
                self.recorder.now(),
                session_id,
                agent,
                wire,
                model if isinstance(model, str) else "",
                reason,
            )
        )

    def call(
        self,
        session_id: str,
        purpose: str,
        model: str,
        wire: str,
        usage: Usage | None,
        ok: bool = True,
    ) -> None:
        """A call compactd made itself (a summary, a recall follow-up), with its usage."""
        self.recorder.take(
            CallRow(self.recorder.now(), session_id, purpose, model, wire, usage, ok)
        )
