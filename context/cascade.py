"""The cascade (DESIGN §4, spec §1 and §5): Budget Reduction, then Tiers 1 → 2 → 3 → 4, each only
when its condition holds, re-measuring after each and advancing only while the request is over
its threshold. Tier 5 (a provider's overflow report) re-enters it with a tighter target.

The cascade is a generator so the engine stays pure: when an LLM tier needs a summary it
yields a `SummaryNeeded`; the driver (the daemon, a test, `replay`) answers with a
`SummaryResult` or a `SummaryFailure`. Every tier decides *draft* records and re-renders with
them; nothing is written until the end, in one commit, so a cancelled or failed run writes
nothing. A tier that frees nothing stops the cascade with its reason — it never loops.
"""

from __future__ import annotations

from collections.abc import Callable, Generator
from typing import Any

import attrs

from . import collapse as tier3
from . import digest
from . import microcompact as tier1
from . import snip as tier2
from . import summary as tier4
from .budget import Calibration
from .errors import CannotFit, CompactdError
from .graph import Record
from .projection import CONTEXT_KINDS, REACTIVE
from .reactive import Overflow, target_tokens
from .render.request import Rendered, RequestSpec, render_request
from .session import Session
from .summarize import SummaryFailure, SummaryRequest, SummaryResult
from .tool_aging.policy import Policy
from .turns import turns_of
from .visibility import ViewOptions


@attrs.frozen
class SummaryNeeded:
    tier: str
    request: SummaryRequest


@attrs.define
class Outcome:
    rendered: Rendered
    events: list[dict[str, Any]]
    record_ids: list[str]
    tokens_before: int


class SessionChanged(CompactdError):
    """The session changed while a summary was being generated; nothing was written."""

    kind = "head_conflict"


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
        self.pending: list[tuple[dict[str, Any], dict[str, Any] | None]] = []  # (record, event)
        self.events: list[dict[str, Any]] = []
        self.thread = view.viewer
        self.rendered = self.render()
        self.limit = self.rendered.budget.limit
        self.threshold = int(policy.cascade_threshold * self.limit)

    # -- rendering with drafts ------------------------------------------------------------------

    def render(self) -> Rendered:
        return render_request(
            self.graph,
            self.view,
            self.spec,
            self.policy,
            self.calibration(),
            counter=self.engine.counter,
            extra_records=self.drafts,
        )

    def calibration(self) -> Calibration:
        if self.forced_calibration is not None:
            return self.forced_calibration
        return self.engine.calibration(self.session)

    @property
    def total(self) -> int:
        return self.rendered.total

    @property
    def path(self) -> Any:
        return self.rendered.view.own

    def propose(self, record: dict[str, Any], event: dict[str, Any]) -> None:
        """Adopt a draft record and re-render with it; `event` gets the token delta."""
        before = self.total
        self.drafts.append(
            self.graph.draft_record(
                record["kind"], record["covers"], record.get("data", {}), record.get("thread")
            )
        )
        self.rendered = self.render()
        event.update(applied=True, tokensBefore=before, tokensAfter=self.total)
        self.pending.append((record, event))
        self.events.append(event)

    def retract(self) -> None:
        """Withdraw the last proposed draft (a tier replacing its own earlier proposal)."""
        self.drafts.pop()
        self.pending.pop()
        self.events.pop()
        self.rendered = self.render()

    def withdraw(self, kind: str) -> bool:
        """Withdraw every draft of `kind` this run proposed (and its event)."""
        keep = [i for i, (rec, _) in enumerate(self.pending) if rec["kind"] != kind]
        if len(keep) == len(self.pending):
            return False
        gone = {id(self.pending[i][1]) for i in range(len(self.pending)) if i not in keep}
        self.drafts = [self.drafts[i] for i in keep]
        self.pending = [self.pending[i] for i in keep]
        self.events = [e for e in self.events if id(e) not in gone]
        self.rendered = self.render()
        return True

    def note(self, tier: str, reason: str, **details: Any) -> None:
        """A tier that looked and did nothing says why."""
        self.events.append(
            {
                "tier": tier,
                "applied": False,
                "tokensBefore": self.total,
                "tokensAfter": self.total,
                "reason": reason,
                "recordIds": [],
                "details": details,
            }
        )

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
            raise SessionChanged(
                "the session changed while compacting; nothing was written — render again",
                seq=g.seq,
            )

    # -- writing --------------------------------------------------------------------------------

    def commit(self) -> list[str]:
        if not self.pending:
            return []
        self.check_unchanged()
        ids = self.session.add_records([rec for rec, _ in self.pending])
        for rid, (_, event) in zip(ids, self.pending, strict=True):
            event["recordIds"] = [rid]
        self.drafts = []
        self.rendered = self.render()
        return ids


CONTENT_RECORDS = CONTEXT_KINDS | {REACTIVE}
"""Records whose arrival during a run means the run's decisions may no longer hold."""

Drive = Generator[SummaryNeeded, SummaryResult | SummaryFailure, Outcome]
Answer = Callable[[SummaryNeeded], SummaryResult | SummaryFailure]


def drive(gen: Drive, answer: Answer) -> Outcome:
    """Run a cascade to its end, answering each summary request synchronously."""
    try:
        need = next(gen)
        while True:
            need = gen.send(answer(need))
    except StopIteration as stop:
        return stop.value


def digest_answer(need: SummaryNeeded) -> SummaryResult | SummaryFailure:
    """Answers for the offline `digest` provider (pure, so the engine may call it itself)."""
    try:
        return digest.summarize(need.request)
    except SummaryFailure as failure:
        return failure


def run_cascade(
    engine: Any,
    session: Session,
    view: ViewOptions,
    spec: RequestSpec,
    *,
    summary_provider: str | None = None,
    overflow: Overflow | None = None,
    manual: bool = False,
    instructions: str | None = None,
) -> Drive:
    """Run the cascade; returns the final render and the events of every tier."""
    policy = engine.policy(session)
    run = Run(engine, session, view, spec, policy, summary_provider)
    before = run.total
    if overflow is not None:
        _reactive(run, overflow)
    if manual:
        yield from tier4.run(run, manual=True, instructions=instructions)
    else:
        _microcompact(run)
        if run.total > run.threshold:
            _snip(run)
        if run.total > run.threshold:
            yield from tier3.run(run)
        if run.total > run.threshold and not tier3.holds_headroom(run):
            # a snip of this very run is still a draft: let the summary see those turns whole
            # instead of only their user requests; snip again if the summary was not enough
            withdrawn = run.withdraw("snip") if run.provider is not None else False
            if withdrawn:
                run.note(
                    "snip",
                    "withdrawn: the rolling summary is tried first, so the turns "
                    "this snip would have dropped reach the summarizer whole",
                )
            yield from tier4.run(run, manual=False, instructions=None)
            if withdrawn and run.total > run.threshold:
                _snip(run)
        if run.total > run.limit:
            _last_resort(run)
    if run.total > run.limit:
        reasons = [e["reason"] for e in run.events if not e["applied"]]
        budget = run.rendered.budget
        why_limit = (
            f"window {budget.window:,} − output reserve {budget.output_reserve:,}"
            if run.limit == budget.limit
            else f"the provider's overflow report, less a {run.policy.reactive_margin:.0%} margin"
        )
        raise CannotFit(
            f"the request needs {run.total:,} tokens but only {run.limit:,} fit "
            f"({why_limit}); nothing more can be removed: "
            + ("; ".join(reasons) or "every remaining turn is protected"),
            tokens=run.total,
            limit=run.limit,
            events=run.events,
        )
    ids = run.commit()
    return Outcome(run.rendered, run.events, ids, before)


# ---- Tier 5 -----------------------------------------------------------------------------


def _reactive(run: Run, overflow: Overflow) -> None:
    """Adopt the provider's count, then aim under its limit with a margin — once per turn."""
    turns = turns_of(run.path)
    active = turns[-1].start_id if turns else None
    for rec in run.graph.records:
        if rec.kind == REACTIVE and rec.data.get("turn") == active and rec.thread == run.thread:
            raise CannotFit(
                "the provider reported the prompt too long again in this turn; reactive "
                "compaction runs once per turn — stop and start a new turn or /compact",
                turn=active,
                reported=overflow.prompt_tokens,
                limit=overflow.limit_tokens,
            )
    model = run.spec.model or ""
    estimate = run.rendered.estimate
    if overflow.prompt_tokens is not None and estimate > 0:
        forced = Calibration(dict(run.engine.calibration(run.session).ratios))
        forced.force(model, overflow.prompt_tokens, estimate)
        run.forced_calibration = forced
        run.rendered = run.render()
    target = target_tokens(overflow, run.total, run.limit, run.policy.reactive_margin)
    run.threshold = min(run.threshold, target)
    run.limit = min(run.limit, target)
    record = {
        "kind": REACTIVE,
        "covers": [],
        "thread": run.thread,
        "data": {
            "turn": active,
            "status": overflow.status,
            "reported": overflow.prompt_tokens,
            "limit": overflow.limit_tokens,
            "estimated": estimate,
            "model": model,
        },
    }
    event = {
        "tier": "reactive",
        "reason": f"provider overflow ({overflow.status}): {overflow.message[:200]}",
        "recordIds": [],
        "details": {
            "target": target,
            "reported": overflow.prompt_tokens,
            "limit": overflow.limit_tokens,
        },
    }
    before = run.total
    run.pending.append((record, event))
    event.update(applied=True, tokensBefore=before, tokensAfter=before)
    run.events.append(event)


# ---- Tier 1 ---------------------------------------------------------------------------------


def _microcompact(run: Run) -> None:
    policy = run.policy
    cands = tier1.candidates(run.graph, run.path, run.rendered.projection, policy)
    if policy.microcompact_mode == "cache":
        if "context_management" in run.rendered.request:  # the render put the edit in
            run.note(
                "microcompact",
                "cache-aware: the provider clears old tool results "
                "server-side; the messages stay unchanged",
                calls=cands.calls,
            )
        return
    over = run.total > run.threshold
    due = tier1.count_due(cands, policy)
    if not due and not (over and policy.microcompact_when_over):
        return
    if not cands.any:
        if due:
            run.note(
                "microcompact",
                "count trigger reached but no old compactable result to clear",
                calls=cands.calls,
            )
        return
    if due and not over and policy.microcompact_warm != "apply":
        pays, saved, rewritten = _clear_pays(run, cands)
        if not pays:
            run.note(
                "microcompact",
                f"deferred: the cache is warm and the request is under its threshold; "
                f"clearing would save {saved:,} tokens per request but re-write {rewritten:,} "
                "cached tokens",
                calls=cands.calls,
                clearable=cands.count,
            )
            return
    trigger = "count" if due else "forced"
    why = (
        f"{cands.calls} tool calls"
        if due
        else "over threshold (the window forces a change; old results go before whole turns)"
    )
    run.propose(
        tier1.clear_record(cands, trigger, run.thread),
        {
            "tier": "microcompact",
            "reason": f"{why}: cleared {len(cands.clearable)} old tool results and shortened "
            f"{len(cands.inputs)} old tool inputs (kept the {policy.microcompact_keep_recent} "
            "most recent calls)",
            "recordIds": [],
            "details": {
                "trigger": trigger,
                "cleared": len(cands.clearable),
                "inputs": len(cands.inputs),
                "calls": cands.calls,
                "mode": "time",
            },
        },
    )
    saved = run.events[-1]["tokensBefore"] - run.total
    minimum = int(policy.microcompact_min_gain * run.limit)
    if trigger == "forced" and run.events[-1]["tokensBefore"] <= run.limit and saved < minimum:
        # the request still fits: breaking the cache for a few tokens is not worth it
        run.retract()
        run.note(
            "microcompact",
            f"not worth it: a forced clear would free only {saved:,} tokens (under "
            f"{minimum:,}) while the request still fits; the cache is kept",
            calls=cands.calls,
        )


def _clear_pays(run: Run, cands: tier1.Candidates) -> tuple[bool, int, int]:
    """DESIGN §4's rule for a change made only to save tokens while the cache is warm: it pays
    when 0.1 × tokens saved × requests still to come > 1.25 × tokens re-written (everything
    after the first changed position). `microcompactWarm: "defer"` never pays;
    `"economic"` expects `microcompactHorizon` more requests."""
    if run.policy.microcompact_warm == "defer":
        return False, 0, 0
    before = run.rendered
    trial = run.graph.draft_record(
        "clear",
        tier1.clear_record(cands, "count", run.thread)["covers"],
        tier1.clear_record(cands, "count", run.thread)["data"],
        run.thread,
    )
    after = render_request(
        run.graph,
        run.view,
        run.spec,
        run.policy,
        run.calibration(),
        counter=run.engine.counter,
        extra_records=[*run.drafts, trial],
    )
    old = [p for m in before.conversation.messages for p in m.parts]
    new = [p for m in after.conversation.messages for p in m.parts]
    first = next(
        (i for i, (a, b) in enumerate(zip(old, new, strict=False)) if a is not b),
        min(len(old), len(new)),
    )
    rewritten = sum(p.tokens for p in new[first:])
    saved = before.total - after.total
    horizon = run.policy.microcompact_horizon
    return 0.1 * saved * horizon > 1.25 * rewritten, saved, rewritten


def _last_resort(run: Run) -> None:
    """Before answering "cannot fit": one more Tier 1 pass that keeps only the newest result
    (`microcompactKeepLast`). What is left is whole turns no tier may take, so old results
    are the only thing that can still go — better than a request that cannot be sent."""
    policy = attrs.evolve(run.policy, microcompact_keep_recent=run.policy.microcompact_keep_last)
    if policy.microcompact_mode != "time" or policy.microcompact_keep_last >= (
        run.policy.microcompact_keep_recent
    ):
        return
    cands = tier1.candidates(run.graph, run.path, run.rendered.projection, policy)
    if not cands.any:
        return
    run.propose(
        tier1.clear_record(cands, "last-resort", run.thread),
        {
            "tier": "microcompact",
            "reason": f"still over the limit after every tier: cleared {len(cands.clearable)} "
            f"more old tool results and shortened {len(cands.inputs)} inputs, keeping only the "
            f"{policy.microcompact_keep_recent} newest",
            "recordIds": [],
            "details": {
                "trigger": "last-resort",
                "cleared": len(cands.clearable),
                "inputs": len(cands.inputs),
                "calls": cands.calls,
                "mode": "time",
            },
        },
    )


# ---- Tier 2 ---------------------------------------------------------------------------------


def _snip(run: Run, target: int | None = None, reason: str = "over threshold") -> None:
    goal = run.threshold if target is None else target
    if not run.policy.snip_enabled:
        run.note("snip", "snip is disabled for this session")
        return
    start = run.total
    if start <= goal:
        run.note("snip", f"already under the target ({start:,} ≤ {goal:,} tokens); nothing removed")
        return
    chosen_all: list[Any] = []
    for _ in range(64):  # every pass removes at least one turn; bounded all the same
        if run.total <= goal:
            break
        removable = tier2.removable_turns(run.graph, run.path, run.rendered.projection, run.policy)
        # calibrated like run.total, or a ratio above 1 removes turns it did not need to
        ratio = run.rendered.ratio
        costs = {
            k: round(v * ratio) for k, v in tier2.turn_tokens(run.rendered.conversation).items()
        }
        chosen = tier2.choose(removable, costs, run.total - goal)
        if not chosen:
            break
        if chosen_all:
            run.retract()  # one snip record per run, covering every chosen turn
        chosen_all.extend(chosen)
        run.propose(
            tier2.snip_record(run.graph, run.path, chosen_all, reason, run.thread),
            {
                "tier": "snip",
                "reason": f"{reason}: removed the {len(chosen_all)} oldest removable turn(s)",
                "recordIds": [],
                "details": {
                    "removedTurns": len(chosen_all),
                    "turns": [t.start_id for t in chosen_all],
                },
            },
        )
    if chosen_all and run.total >= start:
        # the turns cost less than the marker that would replace them
        run.retract()
        run.note(
            "snip",
            f"no gain: removing the {len(chosen_all)} removable turn(s) would not make the "
            "request smaller; nothing was removed",
        )
    elif chosen_all:
        run.events[-1]["tokensBefore"] = start
    else:
        run.note(
            "snip",
            "no removable turn: what is left is the active turn, the latest "
            "complete turn, the first user turn or a running function",
        )


def snip_now(run: Run, target: int) -> None:
    """`context/snip` on demand: Tier 2 alone, down to `target` tokens."""
    _snip(run, target, reason=f"snip requested to {target:,} tokens")
