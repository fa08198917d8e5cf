"""The engine: every operation the daemon exposes, over sessions in one store.

Thin over the modules that hold the rules: `session` writes, `render` renders, `cascade` runs
the tiers. The engine does no network I/O and starts no threads; summary providers are driven
by the daemon through `cascade`'s summary requests.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable, Collection
from pathlib import Path
from typing import Any

import attrs
import orjson

from .budget import Calibration, reported_prompt_tokens
from .budget_reduction import first_cut_line
from .cascade import Drive, run_cascade
from .decompose import from_anthropic, from_nodes, from_openai
from .errors import CompactdError, InvalidContent, Stopped, TooLarge
from .graph import Graph, Node, Record
from .policy import Policy, check_session_config, policy_from_config
from .projection import COLLAPSE, IDLE, PASSTHROUGH, REACTIVE, UNCOLLAPSE, USAGE, project
from .recall import CUT, Recalled, Search, recall, resolve, shown_content
from .render.request import Rendered, RenderParams, render_request
from .session import UNSET, AppendResult, Library, Session, collector_paused
from .stores.interface import SessionCounts, SessionStore, log_size
from .summarizer.types import Steps
from .tiers import microcompact, rolling_summary, snip
from .tiers.base import Outcome, Run, TierEvent
from .tiers.reactive import Overflow, parse_overflow
from .tiers.rolling_summary import PreparedKey
from .tokens import COUNTER, Counter
from .visibility import ViewOptions

Clock = Callable[[], float]


@attrs.frozen
class UsageReport:
    ratio: float
    reported: int | None
    estimated: int | None
    overflow: bool
    limit: int | None


@attrs.frozen
class ImportOutcome:
    """`existing`: ids among `session_ids` imported before from the same file content."""

    session_ids: list[str]
    warnings: list[str]
    existing: list[str]


@attrs.frozen
class IdleOutcome:
    cleared: int
    events: list[TierEvent]


USAGE_COUNTS = (
    "input_tokens",
    "cache_creation_input_tokens",
    "cache_read_input_tokens",
    "output_tokens",
)


def import_bound(limits: Policy, read: int) -> tuple[int, str]:
    """The most an import that read `read` bytes may write, and the limit that sets it: a
    multiple of what it read (`maxImportAmplification`) above a floor every import may write
    (`importFloorBytes`: a small file is never refused for being small), never over
    `maxImportLogBytes`."""
    multiple = limits.import_floor_bytes + limits.max_import_amplification * read
    if multiple <= limits.max_import_log_bytes:
        return multiple, "maxImportAmplification"
    return limits.max_import_log_bytes, "maxImportLogBytes"


def check_counts(data: dict[str, Any] | None, where: str, keys: tuple[str, ...]) -> None:
    """Token counts a client reports are non-negative integers (or absent/null): anything
    else is refused by name before it is stored or added up."""
    for key in keys:
        value = (data or {}).get(key)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise InvalidContent(
                f"{where}.{key} must be a non-negative integer, got {value!r:.40}",
                field=f"{where}.{key}",
            )


class Engine:
    def __init__(
        self,
        store: SessionStore,
        *,
        clock: Clock = time.time,
        counter: Counter = COUNTER,
        defaults: dict[str, Any] | None = None,
        summary_provider: str | None = None,
    ) -> None:
        self.store = store
        self.library = Library(store, clock)
        self.clock = clock
        self.counter = counter
        self.defaults = dict(defaults or {})
        self.limits = policy_from_config(self.defaults)  # the daemon-wide input limits
        store.max_event_bytes = self.limits.max_message_bytes
        self.summary_provider = summary_provider  # the daemon's default provider name
        self.sessions: dict[str, Session] = {}
        self._calibration: dict[str, tuple[int, Calibration]] = {}
        # per session: (model, estimate of what the model sees, estimate of what was sent)
        self._last_estimate: dict[str, tuple[str | None, int, int]] = {}
        # session -> (range key, (checkpoint, its input)): one prepared summary per session
        self._prepared: dict[str, tuple[PreparedKey, Any]] = {}
        self._preparations: dict[str, list[PreparedKey]] = {}  # ranges tried, newest last
        self._overflow: dict[str, Overflow] = {}

    # ---- sessions ----------------------------------------------------------------------------

    def open(
        self,
        session_id: str | None = None,
        config: dict[str, Any] | None = None,
        meta: dict[str, Any] | None = None,
        *,
        unborn: bool = False,
    ) -> tuple[Session, bool]:
        """Load a session, or create it (a new id when none is given); says if it is new.
        `unborn`: a new session's log is created with its first write (`Session.flush`)."""
        if config is not None:
            policy_from_config(config)  # reject a bad config before anything is written
            check_session_config(config)
        if session_id is not None and (
            session_id in self.sessions or self.library.exists(session_id)
        ):
            session = self.session(session_id)
            if config:
                session.update_config(config)
            return session, False
        session = self.library.create(session_id, config, meta, unborn=unborn)
        self._adopt(session)
        return session, True

    def _adopt(self, session: Session) -> None:
        """Hold a session; what is kept of it here goes when its graph is read again."""
        self.sessions[session.id] = session
        session.on_reload.append(lambda sid=session.id: self._forget_state(sid))

    def session(self, session_id: str) -> Session:
        """A loaded session (loading it on first use), caught up with other writers."""
        session = self.sessions.get(session_id)
        if session is None:
            session = self.library.load(session_id)
            self._adopt(session)
        else:
            session.catch_up()
        return session

    def import_file(self, path: str, *, new: bool = False) -> ImportOutcome:
        """Import every conversation of a transcript file; returns their session ids and what
        the importer had to skip. A conversation imported before from the same bytes is
        returned, not duplicated, unless `new`; one that holds no message is kept but warned
        about (a sub-agent file alone, a truncated file: an empty session is rarely meant)."""
        sessions, outcome = self.import_sessions(path, new=new)
        for session in sessions:
            self._adopt(session)
        return outcome

    def import_sessions(
        self, path: str, *, new: bool = False, stopped: Callable[[], bool] | None = None
    ) -> tuple[list[Session], ImportOutcome]:
        """Read a transcript (regular files only, each under `maxImportBytes`) and write its
        new sessions, counted for listings, touching none of the engine's loaded state: the
        daemon runs this in a worker thread so a big file never holds up its loop, and
        registers the sessions after. All its sessions are written or none: `stopped` (asked
        as the import goes) turning true raises `Stopped` before anything is written, and so
        does an import that would write more than its bound (`import_bound`: `TooLarge`)."""
        from .importers import load_transcript
        from .importers.apply import import_sessions
        from .importers.files import read_limit, read_regular

        max_bytes = self.limits.max_import_bytes
        with read_limit(max_bytes) as reads:
            conversations = load_transcript(path, max_bytes)  # unreadable, too big: typed errors
            digest = hashlib.sha256(read_regular(Path(path))).hexdigest()
        known = {} if new else self._imported_before()
        ids: list[str | None] = []
        existing: list[str] = []
        todo = []
        for imported in conversations:
            key = (digest, imported.source_id)
            if key in known:
                ids.append(known[key])
                existing.append(known[key])
            else:
                ids.append(None)
                todo.append((imported, digest))
        if stopped is not None and stopped():
            raise Stopped("the import was stopped before it wrote anything")
        sessions = import_sessions(
            self.library, todo, stopped=stopped, before_writing=self._bounded(reads.total)
        )
        for session in sessions:  # listings read these
            self.store.keep_counts(session.id, self.counts(session, session.offset))
        made = iter(sessions)
        warnings = []
        for (imported, _digest), session in zip(todo, sessions, strict=True):
            warnings.extend(f"{imported.source_id}: {w}" for w in imported.warnings)
            if not session.graph.nodes:
                warnings.append(
                    f"{imported.source_id}: the transcript holds no message, so the session is "
                    "empty (a sub-agent's file alone? import its parent session's file)"
                )
        order = [sid if sid is not None else next(made).id for sid in ids]
        return sessions, ImportOutcome(order, warnings, existing)

    def _bounded(self, read: int) -> Callable[[list[Session]], None]:
        """The check of what an import that read `read` bytes is about to write: everything
        its sessions hold, measured before any is written, over the bound is `TooLarge`."""
        bound, binding = import_bound(self.limits, read)

        def check(sessions: list[Session]) -> None:
            written = 0
            for session in sessions:
                pending = session.pending_events()
                written += log_size(pending, self.limits.max_message_bytes, bound - written)
                if written > bound:
                    what = "what the import would write"
                    if binding == "maxImportAmplification":
                        times = self.limits.max_import_amplification
                        floor = self.limits.import_floor_bytes
                        what += f" ({floor:,} bytes + {times} × the {read:,} bytes it read)"
                    raise TooLarge(what, binding, bound)

        return check

    def _imported_before(self) -> dict[tuple[str, str], str]:
        """(file digest, source id) → session, from each log's header line (its `open`)."""
        out: dict[tuple[str, str], str] = {}
        for sid in self.list():
            meta = self._header_meta(sid)
            if meta.get("sourceDigest") and meta.get("sourceId") is not None:
                out.setdefault((meta["sourceDigest"], str(meta["sourceId"])), sid)
        return out

    def _header_meta(self, session_id: str) -> dict[str, Any]:
        loaded = self.sessions.get(session_id)
        if loaded is not None:
            return loaded.graph.meta
        log_path = getattr(self.store, "log_path", None)  # files: the header line alone
        try:
            if log_path is None:
                return self.library.load(session_id).graph.meta
            with log_path(session_id).open("rb") as f:
                header = orjson.loads(f.readline())
        except (OSError, orjson.JSONDecodeError, CompactdError):
            return {}
        meta = header.get("meta") if isinstance(header, dict) else None
        return meta if isinstance(meta, dict) else {}

    def counts(self, session: Session, cursor: int) -> SessionCounts:
        """What a listing shows of a loaded session, as of `cursor` of its log: source and
        title (its header), turns and tokens (the current branch rendered with the
        defaults)."""
        tokens = self.render_session(session, RenderParams()).tokens()
        meta = session.graph.meta
        return SessionCounts(
            cursor, meta.get("source"), meta.get("title"), tokens["turns"], tokens["total"]
        )

    def keep_counts(self, session_id: str) -> SessionCounts:
        """Count a session now and keep the counts beside its log, so listings read them
        instead of loading it. A loaded session is caught up and counted as it is (its
        tokens are tokenized already); another is loaded for this alone and not kept. A log
        that cannot be loaded counts as empty, its header's source and title kept. The
        cursor is taken before the log is read: counts never claim more than they saw."""
        cursor = self.store.stat(session_id).cursor
        try:
            if session_id in self.sessions:
                counts = self.counts(self.session(session_id), cursor)
            else:
                # loaded for this alone (its objects go by reference counting when it is
                # done): the cyclic collector need not walk them while it is counted either
                with collector_paused():
                    counts = self.counts(self.library.load(session_id), cursor)
        except CompactdError:
            meta = self._header_meta(session_id)
            counts = SessionCounts(cursor, meta.get("source"), meta.get("title"), 0, 0)
        self.store.keep_counts(session_id, counts)
        return counts

    def evict(self, session_id: str) -> None:
        """Forget a session: everything held for it goes (its graph, estimates, calibration,
        a prepared summary, a pending overflow, its lock object), so evicted sessions cost
        nothing; it loads again from its log on next use."""
        self.sessions.pop(session_id, None)
        self._forget_state(session_id)
        self.store.forget(session_id)

    def _forget_state(self, session_id: str) -> None:
        """What is kept per session besides its graph, derived from it."""
        self._calibration.pop(session_id, None)
        self._prepared.pop(session_id, None)
        self._preparations.pop(session_id, None)
        self._last_estimate.pop(session_id, None)
        self._overflow.pop(session_id, None)

    def drop_held(self, session_id: str, owner: object) -> bool:
        """Forget the writes `owner` holds back in a session (`Session.holding`): a request
        refused after it was placed leaves nothing behind, a new session not even its log."""
        session = self.sessions.get(session_id)
        if session is None or not session.drop(owner):
            return False
        if session.unborn is not None:
            self.evict(session_id)
        return True

    def list(self) -> list[str]:
        return self.library.list()

    def policy(self, session: Session) -> Policy:
        """The session's policy, kept until its graph changes (a warm render re-reads it)."""
        g = session.graph
        kept = g.memo.get("policy")
        if kept is not None and kept[0] == g.version and kept[1] == id(self):
            return kept[2]  # type: ignore[no-any-return]
        policy = policy_from_config({**self.defaults, **g.config})
        g.memo["policy"] = (g.version, id(self), policy)
        return policy

    def provider_for(self, session: Session) -> str | None:
        """The summary provider this session uses: its config, else the daemon's default."""
        return self.policy(session).summary_provider or self.summary_provider

    def calibration(self, session: Session) -> Calibration:
        """Per-model ratios replayed from the session's usage and overflow records (so a
        restarted daemon estimates exactly as before)."""
        version = session.graph.records_version
        cached = self._calibration.get(session.id)
        if cached is not None and cached[0] == version:
            return cached[1]
        cal = Calibration()
        for rec in session.graph.records:
            data = rec.data
            if rec.kind in (USAGE, REACTIVE) and data.get("estimated") and data.get("reported"):
                model, counted = data.get("model") or "", data["reported"]
                if rec.kind == REACTIVE:  # the provider's count of that request, unclamped
                    cal.force(model, counted, data["estimated"], clamp=False)
                    continue
                adopt = cal.force if data.get("exact") else cal.observe
                if "cleared" in data and "sent" not in data:
                    # the provider cleared by an edit we did not count (a client's own):
                    # add it back, so the count of what we sent is compared
                    counted += int(data["cleared"] or 0)
                adopt(model, counted, data["estimated"])
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
        """Render without the cascade."""
        session = self.session(session_id)
        rendered = self.render_session(session, params)
        if remember:
            self._last_estimate[session_id] = (
                params.spec.model,
                rendered.estimate,
                rendered.sent_estimate,
            )
        return rendered

    def render_session(
        self,
        session: Session,
        params: RenderParams,
        *,
        extra_records: list[Record] | None = None,
        calibration: Calibration | None = None,
        unchanged_from: Rendered | None = None,
    ) -> Rendered:
        """The one render of a session: the request to send, measured as the model will see
        it — after Tier 1's server-side clears, whose edit it carries (`extra_records`: drafts
        a cascade run is trying). `unchanged_from`: a render of the same request whose drafts
        differ from these only by server-side clears — what is sent is the same, only what
        the model sees is measured again (a cascade's Tier 1 pass does not walk it twice)."""
        policy = self.policy(session)
        cal = calibration if calibration is not None else self.calibration(session)

        def render(
            as_seen: tuple[Collection[str], Collection[str]] | None = None,
            sent: Rendered | None = None,
            by_provider: bool = False,
        ) -> Rendered:
            return render_request(
                session.graph,
                params.view,
                params.spec,
                policy,
                cal,
                counter=self.counter,
                extra_records=extra_records,
                as_seen=as_seen,
                sent=sent,
                by_provider=by_provider,
            )

        rendered = self._sent_again(session, params, policy, cal, unchanged_from, extra_records)
        if rendered is None:
            rendered = render()
        proj = rendered.projection
        if not proj.server_clears:
            return rendered
        # the seen renders come from the same walk: only the cleared calls' parts differ
        if not microcompact.server_path(policy, params.spec):
            # no provider clears this request: the same calls are cleared client-side
            cleared = (proj.cache_cleared.keys(), proj.cache_cleared_inputs.keys())
            return render(cleared, rendered)
        plan = microcompact.server_plan(rendered, policy, params.spec)
        if plan is None:  # the cleared calls are out of this request already
            return rendered
        seen = render((plan.results, plan.inputs), rendered, by_provider=True)
        return microcompact.server_edit(rendered, seen, plan, policy)

    def _sent_again(
        self,
        session: Session,
        params: RenderParams,
        policy: Policy,
        cal: Calibration,
        prior: Rendered | None,
        extra_records: list[Record] | None,
    ) -> Rendered | None:
        """`prior`'s request as sent, with the projection of these drafts (the same request:
        server-side clears change nothing that is sent); None when it cannot be reused."""
        if prior is None or not microcompact.server_path(policy, params.spec):
            return None
        sent = prior.server.sent if prior.server is not None else prior
        if sent is None or sent.server is not None or params.spec.fallback_models:
            return None
        if sent.ratio != cal.ratio(params.spec.model):
            return None
        proj = project(session.graph, sent.view.own, extra_records)
        return attrs.evolve(sent, projection=proj)

    def cascade(
        self,
        session_id: str,
        params: RenderParams,
        *,
        overflow: Overflow | None = None,
        manual: bool = False,
        instructions: str | None = None,
        dry_run: bool = False,
    ) -> Drive:
        """The cascade as a generator (see `cascade.run_cascade`); drive it with
        `drive` or by answering its `SummaryNeeded` requests. A `dry_run` commits nothing and
        is not remembered as the request sent (the next usage report is not compared to it)."""
        session = self.session(session_id)
        if overflow is not None:
            overflow = self.with_estimate(session_id, overflow)
        steps = run_cascade(
            self,
            session,
            params.view,
            params.spec,
            summary_provider=self.provider_for(session),
            overflow=overflow,
            manual=manual,
            instructions=instructions,
            commit=not dry_run,
        )
        return steps if dry_run else self._remembering(session_id, params, steps)

    def _remembering(self, session_id: str, params: RenderParams, gen: Drive) -> Drive:
        outcome = yield from gen
        rendered = outcome.rendered
        self._last_estimate[session_id] = (
            params.spec.model,
            rendered.estimate,
            rendered.sent_estimate,
        )
        return outcome

    def snip(self, session_id: str, params: RenderParams, target: int | None) -> Outcome:
        """`context/snip`: Tier 2 alone, down to `target` (default: the cascade threshold)."""
        session = self.session(session_id)
        run = Run(self, session, params.view, params.spec, self.policy(session), None)
        before = run.total
        snip.on_demand(run, target if target is not None else run.threshold)
        return run.outcome(before, run.commit())

    def measure_advice(self, session: Session, rendered: Rendered) -> str | None:
        policy = self.policy(session)
        share = rendered.total / rendered.budget.limit if rendered.budget.limit else 0.0
        if share > 1:  # the panel says by how many tokens
            return (
                f"The context is {share:.0%} of its limit: a render with the cascade compacts "
                "it, or /compact now (optionally with instructions on what to keep)."
            )
        if share >= policy.manual_compact_advice:
            return (
                f"The context is {share:.0%} of its limit. Consider /compact now (optionally "
                "with instructions on what to keep) rather than waiting for auto-compact."
            )
        return None

    def uncollapse(self, session_id: str, collapse_id: str) -> str | None:
        """Undo a Tier 3 collapse (the originals show again); None if nothing to undo."""
        session = self.session(session_id)
        g = session.graph
        target = next((r for r in g.records if r.id == collapse_id), None)
        if target is None or target.kind != COLLAPSE:
            raise InvalidContent(
                f"no collapse record {collapse_id!r} in this session",
                field="collapseId",
                collapseId=collapse_id,
            )
        if any(r.kind == UNCOLLAPSE and r.data.get("collapse") == collapse_id for r in g.records):
            return None
        # it covers what the collapse covers, so it applies exactly where the collapse does
        return session.add_records(
            [
                {
                    "kind": UNCOLLAPSE,
                    "covers": list(target.covers),
                    "thread": target.thread,
                    "data": {"collapse": collapse_id},
                }
            ]
        )[0]

    def prepare(self, session_id: str, params: RenderParams) -> Steps[bool] | None:
        """A generator preparing the next Tier 4 summary, or None when it is not worth it: no
        provider, or `rolling_summary.prepare_due` says no (the next compaction is not near,
        or the agent is still at work and the range would move before it came)."""
        session = self.session(session_id)
        provider = self.provider_for(session)
        if provider is None:
            return None
        run = Run(self, session, params.view, params.spec, self.policy(session), provider)
        if not rolling_summary.prepare_due(run):
            return None
        return rolling_summary.prepare(run)

    # ---- summaries prepared in the background -------------------------------------------------

    PREPARATIONS_KEPT = 16

    def claim_preparation(self, session_id: str, key: PreparedKey) -> bool:
        """True the first time a range is to be prepared; False after (at most once per range,
        whatever came of it)."""
        tried = self._preparations.setdefault(session_id, [])
        if key in tried:
            return False
        tried.append(key)
        del tried[: -self.PREPARATIONS_KEPT]
        return True

    def prepared_summary(self, session_id: str, key: PreparedKey) -> Any | None:
        """The summary prepared for exactly this range, model and instructions, taken once."""
        entry = self._prepared.get(session_id)
        if entry is None or entry[0] != key:
            return None
        del self._prepared[session_id]
        return entry[1]

    def keep_prepared(self, session_id: str, key: PreparedKey, prepared: Any) -> None:
        self._prepared[session_id] = (key, prepared)

    def has_prepared(self, session_id: str, key: PreparedKey | None = None) -> bool:
        """Whether a summary is prepared (for exactly this key, when given)."""
        entry = self._prepared.get(session_id)
        if entry is None:
            return False
        return key is None or entry[0] == key

    # ---- idle ---------------------------------------------------------------------------------

    def idle_at(self, session: Session) -> float | None:
        """When the idle work of this idle period falls due (the engine's clock); None when it
        is done for this period already."""
        g = session.graph
        for rec in reversed(g.records):
            if rec.kind == IDLE:
                if rec.data.get("activity") == g.last_activity:
                    return None
                break
        return g.last_activity + self.policy(session).idle_seconds

    def idle_due(self, session: Session, now: float | None = None) -> float | None:
        """Seconds idle if the idle work is due and not yet done for this idle period."""
        at = self.idle_at(session)
        now = self.clock() if now is None else now
        if at is None or now < at:
            return None
        return now - session.graph.last_activity

    def run_idle(self, session: Session) -> IdleOutcome:
        """The idle work: the provider's cache has expired, so clear old results client-side
        (Tier 1, time-based) at no cache cost, and mark this idle period done."""
        policy = self.policy(session)
        g = session.graph
        rendered = self.render_session(session, RenderParams(view=ViewOptions()))
        cands, record, event = microcompact.idle_clear(
            g, g.branch_path(), rendered.projection, policy
        )
        records = [record] if record is not None else []
        records.append({"kind": IDLE, "covers": [], "data": {"activity": g.last_activity}})
        ids = session.add_records(records)
        if event is None:
            return IdleOutcome(cands.count, [])
        after = self.render_session(session, RenderParams(view=ViewOptions())).total
        event.applied, event.tokens_before, event.tokens_after = True, rendered.total, after
        event.record_ids = [ids[0]]
        return IdleOutcome(cands.count, [event])

    # ---- usage --------------------------------------------------------------------------------

    def report(
        self,
        session_id: str,
        model: str,
        usage: dict[str, Any] | None,
        error: tuple[int, str] | None,
        applied_edits: list[dict[str, Any]] | None,
    ) -> UsageReport:
        """What the provider said about the last rendered request. A prompt-too-long error is
        kept for the next render, which runs Tier 5 with it."""
        check_counts(usage, "usage", USAGE_COUNTS)
        for i, edit in enumerate(applied_edits or []):
            check_counts(edit, f"appliedEdits[{i}]", ("cleared_input_tokens",))
        ratio, reported, estimated = (
            self.calibration(self.session(session_id)).ratio(model),
            None,
            None,
        )
        if usage or applied_edits:
            ratio, reported, estimated = self.record_usage(
                session_id, model, usage, applied_edits=applied_edits
            )
        overflow = parse_overflow(*error) if error else None
        if overflow is not None:
            self._overflow[session_id] = self.with_estimate(session_id, overflow)
        return UsageReport(
            ratio,
            reported,
            estimated,
            overflow is not None,
            overflow.limit_tokens if overflow else None,
        )

    def with_estimate(self, session_id: str, overflow: Overflow) -> Overflow:
        """`overflow` with our estimate of the request it was about (the last one rendered), so
        Tier 5 compares the next request with that one."""
        last = self._last_estimate.get(session_id)
        if overflow.estimated is not None or last is None:
            return overflow
        return attrs.evolve(overflow, estimated=last[1])

    def take_overflow(self, session_id: str, *, keep: bool = False) -> Overflow | None:
        """The overflow the client reported for this session's next render; `keep` leaves it
        for the render after (a preview does not use it up)."""
        if keep:
            return self._overflow.get(session_id)
        return self._overflow.pop(session_id, None)

    def record_usage(
        self,
        session_id: str,
        model: str,
        usage: dict[str, Any] | None = None,
        *,
        estimated: int | None = None,
        sent: int | None = None,
        applied_edits: list[dict[str, Any]] | None = None,
        durable: bool = True,
        request: dict[str, Any] | None = None,
    ) -> tuple[float, int | None, int | None]:
        """Keep what the provider counted for the last rendered request; later estimates for
        this model are scaled by the observed ratio. Returns (ratio, reported, estimated).

        `estimated` is our count of what the model saw (after a server-side clear), `sent`
        of the request as sent; without them, the last render's. `request`: the request as a
        front sent it (its model, window and panel), which `last_sent` gives back."""
        session = self.session(session_id)
        if estimated is None:
            last = self._last_estimate.get(session_id)
            estimated = last[1] if last is not None else 0
            sent = last[2] if last is not None else None
        reported = reported_prompt_tokens(usage) if usage else None
        data: dict[str, Any] = {"model": model, "estimated": estimated}
        if sent is not None and sent != estimated:
            data["sent"] = sent
        if reported is not None and applied_edits:
            # what the provider cleared itself (our estimate already took off what Tier 1's
            # server path asked it to clear; see `calibration`)
            data["cleared"] = sum(int(e.get("cleared_input_tokens") or 0) for e in applied_edits)
        if usage:
            data["usage"] = usage
            data["reported"] = reported
        if applied_edits:
            data["appliedEdits"] = applied_edits
        if request:
            data["request"] = request
        session.add_records([{"kind": USAGE, "covers": [], "data": data}], durable=durable)
        return self.calibration(session).ratio(model), reported, estimated

    def last_sent(self, session_id: str) -> dict[str, Any] | None:
        """The last request a front recorded as it sent it (`record_usage`'s `request`), with
        the provider's count of it; None for a session no front sent a request of."""
        for record in reversed(self.session(session_id).graph.records):
            request = record.data.get("request") if record.kind == USAGE else None
            if isinstance(request, dict):
                return {**request, "reported": record.data.get("reported")}
        return None

    def record_passthrough(self, session_id: str, reason: str) -> None:
        """Keep that a request of this session went to its provider unmanaged, and why (the
        proxy could not keep its history): what `compactd stats` counts."""
        session = self.session(session_id)
        record = {"kind": PASSTHROUGH, "covers": [], "data": {"reason": reason[:500]}}
        session.add_records([record], durable=False)

    # ---- recall -------------------------------------------------------------------------------

    def recall(
        self,
        session_id: str,
        handle: str,
        start_line: int | None = None,
        end_line: int | None = None,
        branch: str | None = None,
        search: Search | None = None,
    ) -> Recalled:
        """What a handle stands for, a page of it — or, with `search`, the lines of it that
        match (all of it searched unless lines are given). A cut note's handle paged without
        lines starts at the first line the cut left out (the model has the lines before it).
        Reads only: a refusal (a foreign handle, a search RE2 will not run) writes nothing."""
        session = self.session(session_id)
        g = session.graph
        policy = self.policy(session)
        path = g.branch_path(branch)
        node, part = resolve(g, handle, path)
        if search is None and part == CUT and start_line is None:
            start_line = first_cut_line(
                shown_content(g, node),
                policy.max_tool_result_chars,
                policy.truncate_head_chars,
                policy.truncate_tail_chars,
            )
        return recall(g, handle, path, policy.recall_max_chars, start_line, end_line, search)

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
