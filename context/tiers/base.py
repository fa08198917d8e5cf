"""What every tier works on: one cascade `Run`, the `TierEvent`s it reports, and the interface a
tier implements — a `due(run)` condition beside an `apply(run)` action.

A tier never writes: it proposes *draft* records to the run, which re-renders with them; the
cascade (`compactd.context.cascade`) orders the tiers and commits every draft at the end in
one write, so a cancelled or failed run writes nothing. This module imports no tier, so the
tiers and the cascade that calls them have no cycle between them.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol

import attrs

from ..budget import Calibration
from ..errors import HeadConflict
from ..graph import Path, Record
from ..policy import Policy
from ..projection import CLEAR, CONTEXT_KINDS, REACTIVE, USAGE
from ..render.request import Rendered, RenderParams, RequestSpec
from ..session import Session
from ..summarizer.input import Range, SummaryInput, build_input
from ..summarizer.types import Steps, SummaryFailure
from ..visibility import ViewOptions

CONTENT_RECORDS = CONTEXT_KINDS | {REACTIVE}
"""Records whose arrival during a run means the run's decisions may no longer hold."""


@attrs.define
class TierEvent:
    """What one tier did to the context in a run — or why it did nothing: nothing changes
    silently (DESIGN §4). JSON only at the wire (`context/compacted`, render's `events`)."""

    tier: str
    reason: str
    applied: bool = False
    tokens_before: int = 0
    tokens_after: int = 0
    record_ids: list[str] = attrs.field(factory=list)
    details: dict[str, Any] = attrs.field(factory=dict)


@attrs.define
class Outcome:
    """A finished run: the final render, every tier's event, the records written."""

    rendered: Rendered
    events: list[TierEvent]
    record_ids: list[str]
    tokens_before: int


class Tier(Protocol):
    """One tier of the cascade: `due` says whether it should act on this run, `apply` acts
    (proposing drafts, or noting why not). LLM tiers return the steps that ask for summaries;
    the others return None."""

    TIER: str

    def due(self, run: Run) -> bool: ...

    def apply(self, run: Run) -> Steps[None] | None: ...


class Run:
    """State of one cascade run: the draft records and the current render with them."""

    def __init__(
        self,
        engine: Any,
        session: Session,
        view: ViewOptions,
        spec: RequestSpec,
        policy: Policy,
        summary_provider: str | None,
    ) -> None:
        self.engine = engine
        self.session = session
        self.graph = session.graph
        self.view = view
        self.spec = spec
        self.policy = policy
        self.provider = summary_provider
        self.start_seq = session.graph.seq
        self.start_layout = self._layout()
        # Tier 5 adopts the provider's count for this run only; the reactive record, once
        # written, makes it the engine's too (a failed run must leave no trace, in memory either)
        self.forced_calibration: Calibration | None = None
        self.drafts: list[Record] = []
        self.pending: list[tuple[dict[str, Any], TierEvent]] = []  # (record, its event)
        self.events: list[TierEvent] = []
        self.thread = view.viewer
        self.memo: dict[Any, Any] = {}  # what tiers computed from the current render
        self.rendered = self.render()
        # the request as it goes without this run's changes: what extends the request sent
        # last, whose prefix the provider cached (a summary asked as a fork sends it)
        self.start = self.rendered
        self.limit = self.rendered.budget.limit
        self.threshold = int(policy.cascade_threshold * self.limit)
        self.target = min(self.threshold, int(policy.cascade_target * self.limit))

    # -- rendering with drafts ------------------------------------------------------------------

    def summary_input(
        self,
        rng: Range,
        evidence: Mapping[str, str] | None = None,
        originals: Mapping[str, str] | None = None,
    ) -> SummaryInput:
        """The summarizer's input for `rng`, as this run's current render shows it (the plain
        one memoized: a range's key and its checkpoint both read it)."""
        plain = not evidence and not originals
        key = ("summary_input", tuple(rng.covers), rng.through)
        if plain and key in self.memo:
            return self.memo[key]
        rendered = self.rendered
        built = build_input(
            self.graph,
            self.path,
            rendered.projection,
            rendered.conversation,
            rng,
            self.engine.counter,
            evidence,
            originals,
        )
        if plain:
            self.memo[key] = built
        return built

    def render(self, extra: list[Record] | None = None) -> Rendered:
        """The request with this run's drafts (and `extra` ones a tier is only trying): a walk
        of its own (a trial compares its parts with the current render's)."""
        return self.engine.render_session(
            self.session,
            RenderParams(self.view, self.spec),
            extra_records=[*self.drafts, *(extra or [])],
            calibration=self.calibration(),
        )

    def rerender(self, unchanged_from: Rendered | None = None) -> None:
        self.rendered = self.engine.render_session(
            self.session,
            RenderParams(self.view, self.spec),
            extra_records=list(self.drafts),
            calibration=self.calibration(),
            unchanged_from=unchanged_from,
        )
        self.memo.clear()

    def calibration(self) -> Calibration:
        if self.forced_calibration is not None:
            return self.forced_calibration
        return self.engine.calibration(self.session)

    @property
    def total(self) -> int:
        return self.rendered.total

    @property
    def path(self) -> Path:
        return self.rendered.view.own

    def propose(self, record: dict[str, Any], event: TierEvent) -> None:
        """Adopt a draft record and re-render with it; `event` gets the token delta."""
        before = self.total
        draft = self.graph.draft_record(
            record["kind"], record["covers"], record.get("data", {}), record.get("thread")
        )
        self.drafts.append(draft)
        self.rerender(self.rendered if _server_side(draft) else None)
        event.applied, event.tokens_before, event.tokens_after = True, before, self.total
        self.pending.append((record, event))
        self.events.append(event)

    def propose_all(self, records: list[dict[str, Any]], event: TierEvent) -> None:
        """Adopt several drafts with one event and one re-render (a record per tool result
        would otherwise re-render the request once each)."""
        before = self.total
        for record in records:
            self.drafts.append(
                self.graph.draft_record(
                    record["kind"], record["covers"], record.get("data", {}), record.get("thread")
                )
            )
            self.pending.append((record, event))
        self.rerender()
        event.applied, event.tokens_before, event.tokens_after = True, before, self.total
        self.events.append(event)

    def retract(self) -> None:
        """Withdraw the last proposed draft (a tier replacing its own earlier proposal)."""
        self.drafts.pop()
        self.pending.pop()
        self.events.pop()
        self.rerender()

    def withdraw(self, kind: str) -> bool:
        """Withdraw every draft of `kind` this run proposed (and its event)."""
        keep = [i for i, (rec, _) in enumerate(self.pending) if rec["kind"] != kind]
        if len(keep) == len(self.pending):
            return False
        gone = [self.pending[i][1] for i in range(len(self.pending)) if i not in keep]
        self.drafts = [self.drafts[i] for i in keep]
        self.pending = [self.pending[i] for i in keep]
        self.events = [e for e in self.events if not any(e is g for g in gone)]
        self.rerender()
        return True

    def failed(self, tier: str, failure: SummaryFailure) -> None:
        """A tier whose provider gave nothing it could use: nothing was written, and a
        compaction that did nothing is notified (`attempted`)."""
        self.note(
            tier,
            f"{failure.message}; nothing was written",
            failed=True,
            failure=failure.kind,
            attempted=True,
        )

    def note(self, tier: str, reason: str, **details: Any) -> None:
        """A tier that looked and did nothing says why (`attempted=True`: it asked a provider
        and got nothing it could use — a compaction that did nothing, which is notified)."""
        self.events.append(TierEvent(tier, reason, False, self.total, self.total, [], details))

    def _layout(self) -> tuple[Any, ...]:
        g = self.graph
        return (dict(g.branches), g.current_branch, dict(g.function_heads), dict(g.config))

    def check_unchanged(self) -> None:
        """Refuse to write when the session's content moved since the run started: a node, a
        result, a head, the config or a record that changes the context. Bookkeeping that
        changes no content (a usage report, activity, idle marks, notes) does not count — a
        client reporting the usage of its last call must not undo a /compact."""
        self.session.catch_up()
        g = self.graph
        if g.seq == self.start_seq:
            return
        since = self.start_seq
        if (
            self._layout() != self.start_layout
            or any(n.seq > since or n.result_seq > since for n in g.nodes.values())
            or any(r.seq > since and r.kind in CONTENT_RECORDS for r in g.records)
        ):
            raise HeadConflict(
                "the session changed while compacting; nothing was written — render again",
                seq=g.seq,
            )

    # -- writing --------------------------------------------------------------------------------

    def commit(self) -> list[str]:
        if not self.pending:
            return []
        self.check_unchanged()
        ids = self.session.add_records([rec for rec, _ in self.pending])
        for _, event in self.pending:
            event.record_ids = []
        for rid, (_, event) in zip(ids, self.pending, strict=True):
            event.record_ids.append(rid)
        self.drafts = []
        self.rerender()
        return ids

    def outcome(self, tokens_before: int, record_ids: list[str]) -> Outcome:
        return Outcome(self.rendered, self.events, record_ids, tokens_before)


def _server_side(record: Record) -> bool:
    """A clear the provider makes (Tier 1's server path): it changes nothing that is sent."""
    return record.kind == CLEAR and record.data.get("mode") == "cache"


def server_path(policy: Policy, spec: RequestSpec) -> bool:
    """Tier 1 clears server-side: the Anthropic format in `microcompactMode: "cache"`, to a
    provider that applies context edits — it holds the cache explicitly, and the messages
    sent never change."""
    return policy.microcompact_mode == "cache" and spec.format == "anthropic" and spec.server_edits


def llm_bar(run: Run) -> int:
    """Over this, after the cheaper tiers, the LLM tiers run (`summaryWhen`): the threshold
    where the provider holds the cache explicitly — a summary there buys headroom the cache
    already makes cheap (0.1× a cached token), at the price of a call and a rewrite — and the
    target elsewhere, where a cache hit is the provider's best effort and every token of a
    request near its threshold is likelier paid in full. (Under the threshold, the summary
    may still run where it buys runway cheaper than the cheaper tiers' change alone:
    `rolling_summary.buys_runway`.)"""
    when = run.policy.summary_when
    if when == "auto":
        when = "threshold" if server_path(run.policy, run.spec) else "pressed"
    return run.threshold if when == "threshold" else run.target


def cache_cold(run: Run) -> bool:
    """The provider's cache of this session has expired: no request of it was reported within
    the TTL its breakpoints ask (`RequestSpec.cache_seconds`). The next request is written
    whole whatever changes in it, so a change costs no rewrite, and a summary asked as a fork
    reads nothing back. A session whose requests were never reported counts as warm (the
    rules for a warm cache are the careful ones)."""
    last = last_reported(run.graph)
    return last is not None and run.session.clock() - last >= run.spec.cache_seconds


def last_reported(graph: Any) -> float | None:
    """When the provider's usage of the session's last request was recorded (any thread: a
    sub-agent's request does not keep the main thread's prefix alive, so this errs warm)."""
    seen, last = graph.memo.get("last_reported", (0, None))
    records = graph.records  # append-only: only the records since the last look are read
    if seen < len(records):
        found = next((r.ts for r in reversed(records[seen:]) if r.kind == USAGE), None)
        last = found if found is not None else last
        graph.memo["last_reported"] = (len(records), last)
    return last  # type: ignore[no-any-return]


def growth(run: Run, steps: int = 5) -> int:
    """What a request adds to this thread, in calibrated tokens: the mean of its newest
    `steps` steps as the request shows them (each assistant message with what answers it),
    and no less than half a percent of the limit."""
    sizes: list[int] = []
    step = 0
    for message in reversed(run.rendered.conversation.messages):
        if message.kind != "turn":
            break
        step += message.tokens
        if message.role == "assistant":
            sizes.append(step)
            step = 0
            if len(sizes) == steps:
                break
    mean = sum(sizes) / len(sizes) if sizes else 0.0
    return max(int(mean * run.rendered.ratio), run.limit // 200)
