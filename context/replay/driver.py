"""`replay`: how a recorded session would have gone under the cascade, priced with the
provider's cache rules, in the provider's units — beside "no management" and the recorded run.

Driving the engine the way a live agent does (`../shared/notes/economy.md`): for each step
(the ops before one recorded model call) the replay applies the ops, runs the idle work when
the recorded gap exceeds the idle threshold, renders with the cascade (a system prompt
included), and reports the provider's count of that request back, as a client reports `usage`.

Units. The transcript records the provider's prompt size for each call; compactd estimates in
cl100k. A first pass renders "no management" (every result as the agent sent it, nothing
removed) and fits the recorded sizes before the first recorded compaction as
`overhead + ratio × estimate` (main thread; sub-agents get their own overhead at the same
ratio). Then every row is in the provider's units: a request counts `ratio × estimate`, with a
system prompt whose count is the thread's overhead (or `system_tokens` when given). Without a
recording, the model family's prior ratio and a 20,000-token system prompt stand in.
"""

from __future__ import annotations

import bisect
import hashlib
from collections.abc import Callable, Iterable
from typing import Any, TypeVar

import attrs
import orjson

from ..budget import prior_ratio
from ..budget_reduction import first_cut_line
from ..engine import Engine, RenderParams
from ..errors import CannotFit, Stopped
from ..importers.apply import OpApplier, steps
from ..importers.plan import ImportedSession, Note
from ..prices import price_of
from ..recall import CUT, FROM, PREFIX, content_text, handle_for, shown_content
from ..render.conversation import MARKERS
from ..render.request import Rendered, RequestSpec
from ..summarizer.types import Answer, Fork, Steps, SummaryFailure, SummaryNeeded, SummaryResult
from ..tiers.base import TierEvent
from ..tiers.microcompact import CLEAR_EDIT
from ..tokens import MESSAGE_OVERHEAD, Counter
from ..visibility import ViewOptions
from .anchors import (
    Call,
    ClaudeCodeLike,
    CodexLike,
    Item,
    OpencodeLike,
    ServerSideCompaction,
)
from .cache_model import (
    TTL_SECONDS,
    WRITE_5M,
    CacheModel,
    Charge,
    price_call,
    price_recorded,
    summary_price,
)
from .fidelity import (
    FURTHER,
    ONE_CALL,
    VISIBLE,
    Fidelity,
    Use,
    block_text,
    in_view,
    pages_to,
    uses_by_call,
)
from .fidelity import terms as terms_of
from .recall_counts import RecallCounts

T = TypeVar("T")
EVIDENCE = "evidence"  # a tool-evidence call's purpose
REWRITE_SHARE = 0.9  # a request that reads less than this of the previous one re-wrote it
NO_MANAGEMENT = {"maxToolResultChars": 10**15}
# Codex records a tool's output cut to 10,000 bytes, half its head and half its tail
# (prior-art.md §1): the Codex-like anchor's messages
CODEX_RECORDING = {
    "maxToolResultChars": 10_000,
    "truncateHeadChars": 5_000,
    "truncateTailChars": 5_000,
}
REMOVING_TIERS = ("microcompact", "snip")
DEFAULT_SYSTEM_TOKENS = 20_000  # Claude Code's own system prompt and tools are about this size
COMPACTION_NOTES = ("compact_boundary", "compacted")  # a recorded compaction ends the fit
SYSTEM_FILLER = (
    "You are a coding agent working in the user's repository. Read before you edit, run the "
    "tests after every change, keep changes small and explain each one. "
)


@attrs.frozen
class ReplayOptions:
    window: int | None = None
    reserve: int | None = None
    ttl: str = "5m"
    model: str | None = None  # None: the transcript's own model
    config: dict[str, Any] = attrs.field(factory=dict)  # session config (policy overrides)
    baseline: bool = True
    # provider tokens of the system prompt on every request (None: the fitted overhead)
    system_tokens: int | None = None
    ratio: float | None = None  # provider tokens per estimated token (None: fitted, or prior)
    # the price of a cache write (None: the documented one, 1.25× for 5 minutes, 2× for an
    # hour; the economy notes' instrument prices every write at 1.25×)
    write_price: float | None = None
    anchors: bool = True  # price the anchor policies (Codex-like, opencode-like) beside
    # a sensitivity, not economy.md's instrument: the system prompt and tools are read back
    # after any change (the API reads at the breakpoint agents put on them)
    system_breakpoint: bool = False


@attrs.frozen
class Fit:
    """Recorded prompt sizes ≈ overhead + ratio × compactd's estimate of the messages."""

    overhead: int
    ratio: float
    points: int
    median_error: float  # relative, over the fitted points
    max_error: float

    def to_json(self) -> dict[str, Any]:
        return {
            "overhead": self.overhead,
            "ratio": round(self.ratio, 4),
            "points": self.points,
            "medianError": round(self.median_error, 4),
            "maxError": round(self.max_error, 4),
        }


def fit_prompt_sizes(points: list[tuple[int, int]], ratio: float | None = None) -> Fit | None:
    """Least squares of `recorded = overhead + ratio × estimate` (only the overhead when
    `ratio` is given); None with too few points to say anything."""
    if len(points) < (1 if ratio is not None else 2):
        return None
    n = len(points)
    mean_x = sum(x for x, _ in points) / n
    mean_y = sum(y for _, y in points) / n
    if ratio is None:
        spread = sum((x - mean_x) ** 2 for x, _ in points)
        if spread == 0:
            return None
        ratio = sum((x - mean_x) * (y - mean_y) for x, y in points) / spread
    overhead = mean_y - ratio * mean_x
    errors = sorted(abs(overhead + ratio * x - y) / y for x, y in points if y > 0)
    return Fit(round(overhead), ratio, n, errors[len(errors) // 2] if errors else 0.0, errors[-1])


@attrs.frozen
class Units:
    """The provider's units for one replay: tokens per estimated token, and each thread
    kind's fixed overhead (system prompt and tools) in provider tokens."""

    ratio: float
    overhead: dict[str, int]  # "main" | "function" -> provider tokens
    source: str  # "fitted" | "prior" | "given"
    fits: dict[str, Fit | None]

    def to_json(self) -> dict[str, Any]:
        return {
            "ratio": round(self.ratio, 4),
            "systemTokens": dict(self.overhead),
            "source": self.source,
            "fit": {k: (f.to_json() if f else None) for k, f in self.fits.items()},
        }


@attrs.define
class Totals:
    requests: int = 0
    cost: float = 0.0  # requests and LLM calls, in input-token equivalents
    peak: int = 0
    over_limit: int = 0  # requests over window − output reserve
    over_window: int = 0  # …over the window itself (what the provider refuses)
    input_tokens: int = 0
    cache_read: int = 0
    cache_write: int = 0
    llm_calls: int = 0  # every summary, collapse and tool-evidence call, prepared ones too
    llm_cost: float = 0.0  # what those calls cost (part of `cost`)
    evidence_calls: int = 0
    summary_input: int = 0
    summary_output: int = 0
    summary_read: int = 0  # of `summary_input`, read from the prompt cache (forks)
    prepared: int = 0  # checkpoints written by background preparation
    prepared_unused: int = 0  # …of which no compaction used
    removed_without_summary: int = 0
    cannot_fit: int = 0
    cache_rewrites: int = 0  # requests that re-wrote part of the previous one's live cache
    fidelity: Fidelity = attrs.Factory(Fidelity)  # what the agent later used, where it was

    def add(
        self,
        charge: Charge,
        tokens: int,
        limits: tuple[int, int],
        cannot_fit: bool,
        rewrite: bool,
    ) -> None:
        """One request; `limits` is (window − output reserve, window)."""
        self.requests += 1
        self.cost += charge.cost
        self.peak = max(self.peak, tokens)
        self.over_limit += tokens > limits[0]
        self.over_window += tokens > limits[1]
        self.input_tokens += charge.tokens
        self.cache_read += charge.read
        self.cache_write += charge.written
        self.cannot_fit += cannot_fit
        self.cache_rewrites += rewrite

    def add_calls(
        self, calls: list[Call], price: float = 1.0, write_price: float = WRITE_5M
    ) -> float:
        """LLM calls priced as economy.md says (`cache_model.price_call`), at `price` times
        the request's model (a cheaper summary model costs less); returns their cost."""
        cost = sum(
            price_call(c.purpose, c.input, c.output, c.results, c.read, c.written, write_price)
            for c in calls
        )
        cost *= price
        self.cost += cost
        self.llm_cost += cost
        self.llm_calls += len(calls)
        self.evidence_calls += sum(1 for c in calls if c.purpose == EVIDENCE)
        self.summary_input += sum(c.input for c in calls)
        self.summary_read += sum(c.read for c in calls)
        self.summary_output += sum(c.output for c in calls)
        return cost

    def add_recorded(self, usage: dict[str, int], cost: float, limits: tuple[int, int]) -> None:
        prompt = recorded_prompt(usage)
        self.requests += 1
        self.cost += cost
        self.peak = max(self.peak, prompt)
        self.over_limit += prompt > limits[0]
        self.over_window += prompt > limits[1]
        self.input_tokens += prompt
        self.cache_read += int(usage.get("cache_read_input_tokens") or 0)
        self.cache_write += int(usage.get("cache_creation_input_tokens") or 0)

    @property
    def cache_read_share(self) -> float:
        return self.cache_read / self.input_tokens if self.input_tokens else 0.0

    @property
    def rewrites_per_100(self) -> float:
        return 100 * self.cache_rewrites / self.requests if self.requests else 0.0

    @property
    def llm_calls_per_100(self) -> float:
        return 100 * self.llm_calls / self.requests if self.requests else 0.0

    def to_json(self) -> dict[str, Any]:
        out = attrs.asdict(self, filter=lambda a, _: a.name != "fidelity")
        out["fidelity"] = self.fidelity.to_json()
        out["cacheReadShare"] = round(self.cache_read_share, 4)
        out["rewritesPer100"] = round(self.rewrites_per_100, 1)
        out["llmCallsPer100"] = round(self.llm_calls_per_100, 1)
        out["cost"] = round(self.cost, 1)
        out["llm_cost"] = round(self.llm_cost, 1)
        return {_camel(k): v for k, v in out.items()}


@attrs.define
class Step:
    index: int
    thread: str
    time: float
    tokens: int
    limit: int
    tiers: list[str]
    events: list[dict[str, Any]]
    cache_read: int
    cache_write: int
    cost: float  # the request's own cost; `llm_cost` is its LLM calls'
    llm_calls: int  # summaries, collapses, tool evidence, and preparation after the request
    llm_cost: float
    llm_input: int
    llm_output: int
    cannot_fit: bool
    rewrite: bool = False
    baseline_tokens: int | None = None
    baseline_cost: float | None = None
    recorded_tokens: int | None = None
    recorded_cost: float | None = None
    anchor_tokens: dict[str, int] = attrs.field(factory=dict)  # each anchor's request

    def to_json(self) -> dict[str, Any]:
        return {_camel(k): v for k, v in attrs.asdict(self).items()}


ANCHORS = (CodexLike, OpencodeLike, ClaudeCodeLike, ServerSideCompaction)
POLICIES = ("compactd", "baseline", "recorded", *(a.NAME for a in ANCHORS))


@attrs.define
class ReplayReport:
    source: str
    window: int
    limit: int
    threshold: int
    ttl: str
    provider: str | None
    steps: list[Step]
    totals: dict[str, Totals]  # by policy: every request
    main: dict[str, Totals]  # by policy: the main thread's requests only
    units: Units | None = None
    write_price: float = 0.0
    recall: RecallCounts | None = None  # cut on arrival, cleared, handles shown
    # what the report says of an anchor beside its figures (server-side compaction's trigger,
    # and whether it can serve the window at all)
    anchor_notes: dict[str, dict[str, Any]] = attrs.field(factory=dict)
    model: str | None = None  # the model the requests were priced for

    @property
    def compactd(self) -> Totals:
        return self.totals["compactd"]

    def to_json(self) -> dict[str, Any]:
        return {
            "source": self.source,
            "window": self.window,
            "limit": self.limit,
            "threshold": self.threshold,
            "ttl": self.ttl,
            "writePrice": self.write_price,
            "provider": self.provider,
            "units": self.units.to_json() if self.units else None,
            "steps": [s.to_json() for s in self.steps],
            "totals": {p: (t.to_json() if (t := self.totals.get(p)) else None) for p in POLICIES},
            "mainThread": {p: (t.to_json() if (t := self.main.get(p)) else None) for p in POLICIES},
            "recall": self.recall.to_json() if self.recall else None,
            "anchors": self.anchor_notes,
            "model": self.model,
            # US$ per input-token equivalent (the model's published input price), for money
            "price": _price_json(self.model),
        }


def _price_json(model: str | None) -> dict[str, Any] | None:
    price = price_of(model)
    if price is None:
        return None
    return {"inputPerMillion": price.input, "taken": price.taken}


def _camel(name: str) -> str:
    head, *rest = name.split("_")
    return head + "".join(p.title() for p in rest)


def request_items(
    rendered: Rendered, counter: Any, terms: dict[bytes, frozenset[str]] | None = None
) -> list[Item]:
    """The request as the cache sees it: a block per item — its content key and tokens, in
    prefix order (tools, system, then each message's blocks; cache_control marks are not
    content), with Tier 1's server path the request after the provider's clear (a clear
    re-writes the cache from the cleared point, by the documented rule) — and each block's
    panel category, turn and message (what the anchor policies need to know of it). `terms`:
    each block's terms (`fidelity.terms`) are noted there by its key, summaries' as none."""
    request = rendered.seen_request
    out: list[Item] = []

    def key(kind: str, value: Any, category: str = "") -> bytes:
        digest = hashlib.blake2b(kind.encode() + orjson.dumps(value), digest_size=16).digest()
        if terms is not None and digest not in terms:
            terms[digest] = frozenset() if category == MARKERS else terms_of(block_text(value))
        return digest

    for tool in request.get("tools", []):
        plain = {k: v for k, v in tool.items() if k != "cache_control"}
        out.append(Item(key("tool", plain), counter.tool_definition(plain), "tools", -1, -1))
    for block in request.get("system", []):
        plain = {k: v for k, v in block.items() if k != "cache_control"}
        out.append(Item(key("system", plain), counter.system_block(plain), "system", -1, -1))
    messages = rendered.conversation.messages
    parts = [(p, m.turn, i) for i, m in enumerate(messages) for p in m.parts]
    wire = [
        (msg["role"], i, b) for msg in request["messages"] for i, b in enumerate(msg["content"])
    ]
    if len(parts) != len(wire):  # not the Anthropic format: count per message
        for i, msg in enumerate(request["messages"]):
            text = orjson.dumps(msg)
            turn = messages[i].turn if len(messages) == len(request["messages"]) else -1
            out.append(
                Item(key("message", msg), len(text) // 4 + MESSAGE_OVERHEAD, msg["role"], turn, i)
            )
        return out
    for (role, position, block), (part, turn, index) in zip(wire, parts, strict=True):
        plain = {k: v for k, v in block.items() if k != "cache_control"}
        overhead = MESSAGE_OVERHEAD if position == 0 else 0
        out.append(
            Item(
                key(role + str(position == 0), plain, part.category),
                part.tokens + overhead,
                part.category,
                turn,
                index,
            )
        )
    return out


def _applied_edits(rendered: Rendered, ratio: float) -> list[dict[str, Any]] | None:
    """What the provider reports as applied for a request carrying Tier 1's server edit."""
    if rendered.server is None:
        return None
    cleared = round((rendered.sent_estimate - rendered.estimate) * ratio)
    return [{"type": CLEAR_EDIT, "cleared_input_tokens": cleared}]


def scaled(blocks: list[tuple[bytes, int]], ratio: float) -> list[tuple[bytes, int]]:
    return [(k, round(t * ratio)) for k, t in blocks]


def synthetic_system(estimate: int, counter: Counter) -> str:
    """A deterministic system prompt of about `estimate` cl100k tokens."""
    if estimate <= 0:
        return ""
    unit = counter.text(SYSTEM_FILLER)
    copies = estimate // unit + 1
    while counter.text(SYSTEM_FILLER * copies) <= estimate:  # copies tokenize as a whole
        copies += copies // 8 + 1
    text = SYSTEM_FILLER * copies
    lo, hi = 0, len(text)
    while lo < hi:  # the longest prefix that is not over the estimate
        mid = (lo + hi + 1) // 2
        if counter.text(text[:mid]) <= estimate:
            lo = mid
        else:
            hi = mid - 1
    return text[:lo]


@attrs.frozen
class _Recorded:
    """One recorded model call as "no management" rendered it (the first pass)."""

    index: int
    kind: str  # "main" | "function"
    estimate: int  # compactd's estimate of the messages, as the agent sent them
    items: tuple[Item, ...]
    time: float
    usage: dict[str, int] | None
    before_compaction: bool


def _no_management(
    engine: Engine,
    imported: ImportedSession,
    config: dict[str, Any] = NO_MANAGEMENT,
    terms: dict[bytes, frozenset[str]] | None = None,
) -> list[_Recorded]:
    """Render every step as the recorded agent sent it, nothing removed or shortened (or,
    with another `config`, as an agent that shortens results on arrival would have)."""
    base = engine.library.create(config=dict(config))
    engine.sessions[base.id] = base
    applier = OpApplier(base, imported.sent)
    base.clock = lambda: applier.now
    out: list[_Recorded] = []
    compacted = False
    previous: float | None = None
    for index, step in enumerate(steps(imported)):
        for op in step.ops:
            applier.apply(op)
            if isinstance(op, Note) and op.kind.endswith(COMPACTION_NOTES):
                compacted = True
        call = step.call
        if call is None:
            continue
        at = call.timestamp if call.timestamp is not None else (previous or 0.0) + 1.0
        previous = at
        viewer = applier.functions.get(call.thread) if call.thread else None
        rendered = engine.render_session(base, RenderParams(view=ViewOptions(viewer=viewer)))
        out.append(
            _Recorded(
                index,
                "main" if call.thread is None else "function",
                rendered.estimate,
                tuple(request_items(rendered, engine.counter, terms)),
                at,
                call.usage,
                not compacted,
            )
        )
    return out


def recorded_prompt(usage: dict[str, int]) -> int:
    return sum(
        int(usage.get(k) or 0)
        for k in ("input_tokens", "cache_creation_input_tokens", "cache_read_input_tokens")
    )


def provider_units(recorded: list[_Recorded], model: str | None, options: ReplayOptions) -> Units:
    """Fit the provider's units on the recorded calls (see the module's docstring)."""
    main = [
        (r.estimate, recorded_prompt(r.usage))
        for r in recorded
        if r.usage and r.kind == "main" and r.before_compaction
    ]
    subs = [
        (r.estimate, recorded_prompt(r.usage)) for r in recorded if r.usage and r.kind != "main"
    ]
    main_fit = fit_prompt_sizes(main)
    if options.ratio:
        ratio, source = options.ratio, "given"
    elif main_fit is not None and main_fit.ratio > 0:
        ratio, source = main_fit.ratio, "fitted"
    else:
        ratio, source = prior_ratio(model), "prior"
    fits = {"main": main_fit, "function": fit_prompt_sizes(subs, ratio=ratio)}
    at_ratio = {"main": fit_prompt_sizes(main, ratio=ratio), "function": fits["function"]}
    overhead = {}
    for kind, fit in at_ratio.items():
        if options.system_tokens is not None:
            overhead[kind] = options.system_tokens
        elif fit is not None and fit.overhead > 0:
            overhead[kind] = fit.overhead
        else:
            overhead[kind] = DEFAULT_SYSTEM_TOKENS
    return Units(ratio, overhead, source, fits)


def recorded_units(engine: Engine, imported: ImportedSession, options: ReplayOptions) -> Units:
    """The provider's units fitted on the recorded calls of `imported`, as a replay fits them
    (the sessions it renders for that stay in `engine`'s store)."""
    model = options.model or imported.model
    return provider_units(_no_management(engine, imported), model, options)


def replay(
    engine: Engine,
    imported: ImportedSession,
    options: ReplayOptions,
    stopped: Callable[[], bool] | None = None,
) -> Steps[ReplayReport]:
    """Relive `imported` under the cascade, step by step; `stopped` is asked before each
    step (a cancelled request), and `Stopped` raised when it says so."""
    model = options.model or imported.model
    terms: dict[bytes, frozenset[str]] = {}  # each block's terms, by its key (fidelity)
    recorded = _no_management(engine, imported, terms=terms)
    units = provider_units(recorded, model, options)
    codex_view = (
        {r.index: r for r in _no_management(engine, imported, CODEX_RECORDING, terms)}
        if options.anchors
        else {}
    )
    uses = uses_by_call(imported)
    ratio = units.ratio
    systems = {
        kind: synthetic_system(round(tokens / ratio), engine.counter)
        for kind, tokens in units.overhead.items()
    }
    # the policies compared all send this very system prompt: price it as compactd's render
    # counts it (the synthetic text lands a few tokens off the fitted overhead)
    system_tokens = {
        kind: round(engine.counter.system_block({"type": "text", "text": text}) * ratio)
        if text
        else 0
        for kind, text in systems.items()
    }
    # named by the transcript, so a replay's handles (a digest of the session id) and with
    # them its figures come out the same on every run; a new id only if the store has it
    sid = "replay-" + hashlib.sha256(imported.source_id.encode()).hexdigest()[:16]
    session = engine.library.create(
        None if engine.library.exists(sid) else sid,
        dict(options.config),
        {"replayOf": imported.source_id},
    )
    engine.sessions[session.id] = session
    applier = OpApplier(session)
    applier.now = 0.0  # the transcript's own times: what the cascade weighs a pause by
    session.clock = lambda: applier.now
    ttl_seconds = TTL_SECONDS[options.ttl]
    fixed_prefix = options.system_breakpoint
    cache = CacheModel(options.ttl, write_price=options.write_price, system_breakpoint=fixed_prefix)
    base_cache = CacheModel(
        options.ttl, write_price=options.write_price, system_breakpoint=fixed_prefix
    )
    write_price = cache.write_price
    policies = ["compactd"] + ["baseline"] * options.baseline
    policies += ["recorded"] * any(r.usage for r in recorded)
    policy = engine.policy(session)
    provider = engine.provider_for(session)
    clock = [0.0]  # the time of the step being replayed (a fork is priced then)

    def price_fork(fork: Fork) -> Charge:
        """A fork as the provider prices it: the request it continues (its blocks as the cache
        sees them) with the instruction after it, reading what an earlier request cached."""
        blocks = [(i.key, i.tokens) for i in request_items(fork.rendered, engine.counter)]
        ask = hashlib.blake2b(fork.instruction.encode(), digest_size=16).digest()
        blocks.append((ask, engine.counter.request_text(fork.instruction) + MESSAGE_OVERHEAD))
        return cache.summary_call(scaled(blocks, ratio), clock[0], 0)

    meter = Meter(ratio if provider in ("digest", None) else 1.0, price_fork)
    price = summary_price(policy.summary_model, model)
    anchors: list[tuple[Any, CacheModel, dict[str, tuple[float, int]]]] = []
    by_index = {r.index: r for r in recorded}
    times = [r.time for r in recorded]
    totals = {p: Totals() for p in policies}
    main = {p: Totals() for p in policies}
    last_request: dict[str, tuple[float, int]] = {}  # thread -> (time, provider tokens)
    base_last: dict[str, tuple[float, int]] = {}
    report_steps: list[Step] = []
    previous: float | None = None
    limit = window = 0
    recall_counts = RecallCounts()
    for index, step in enumerate(steps(imported)):
        if stopped is not None and stopped():
            raise Stopped("the replay was stopped")
        for op in step.ops:
            applier.apply(op)
        call = step.call
        if call is None:
            continue
        rec = by_index[index]
        at = clock[0] = rec.time
        applier.now = max(applier.now, at)  # the request's own time: what the cascade records
        events: list[TierEvent] = []
        if previous is not None and at - previous >= policy.idle_seconds:
            events.extend(engine.run_idle(session).events)
        previous = at
        viewer = applier.functions.get(call.thread) if call.thread else None
        thread = "main" if call.thread is None else f"function:{viewer}"
        params = RenderParams(
            view=ViewOptions(viewer=viewer),
            spec=RequestSpec(
                model=model,
                window=options.window,
                max_output_tokens=options.reserve,
                system=systems[rec.kind] or None,
                cache_ttl=options.ttl,
            ),
        )
        cannot_fit = False
        try:
            outcome = yield from meter.through(engine.cascade(session.id, params))
            rendered = outcome.rendered
            events.extend(outcome.events)
        except CannotFit:
            cannot_fit = True
            rendered = engine.render_session(session, params)
        tokens = round(rendered.estimate * ratio)  # what the provider counts
        handles: set[str] = set()
        if policy.recall:  # handles only show with recall on
            handles = recall_counts.observe(rendered.request)
        if not cannot_fit:  # the usage a live client reports after the call
            engine.record_usage(
                session.id,
                model or "",
                {"input_tokens": tokens},
                estimated=rendered.estimate,
                sent=rendered.sent_estimate,
                applied_edits=_applied_edits(rendered, ratio),
            )
        limit, window = rendered.budget.limit, rendered.budget.window
        if not anchors and options.anchors:
            anchors = _anchors(
                system_tokens,
                window,
                limit,
                options.ttl,
                options.write_price,
                options.system_breakpoint,
            )
        items_sent = request_items(rendered, engine.counter, terms)
        fixed = next(
            (n for n, i in enumerate(items_sent) if i.category not in ("tools", "system")),
            len(items_sent),
        )
        charge = cache.request(scaled([(i.key, i.tokens) for i in items_sent], ratio), at, 0, fixed)
        rewrite = _rewrote(last_request.get(thread), at, charge, ttl_seconds)
        last_request[thread] = (at, charge.tokens)
        calls = meter.take()
        prepared = False
        reused = sum(1 for e in events if e.applied and e.details.get("reused"))
        ordinal = bisect.bisect_right(times, at)  # the next recorded call, on any thread
        gap = times[ordinal] - at if ordinal < len(times) else 0.0
        if gap >= policy.prepare_idle_seconds:  # the daemon's idle loop prepares meanwhile
            work = engine.prepare(session.id, params)
            if work is not None:
                prepared = yield from meter.through(work)
                preparation = meter.take()
                calls.extend(preparation)
                prepared = prepared or bool(preparation)
        applied = [e for e in events if e.applied]
        removed = sum(
            max(0, e.tokens_before - e.tokens_after) for e in applied if e.tier in REMOVING_TIERS
        )
        row = Step(
            index=index,
            thread=thread,
            time=at,
            tokens=tokens,
            limit=limit,
            tiers=[e.tier for e in applied],
            events=[
                {
                    "tier": e.tier,
                    "applied": e.applied,
                    "reason": e.reason,
                    "tokensBefore": e.tokens_before,
                    "tokensAfter": e.tokens_after,
                    # a summary provider that failed: the CLI's table and exit code say so
                    **({"failed": True} if e.details.get("failed") else {}),
                }
                for e in events
            ],
            cache_read=charge.read,
            cache_write=charge.written,
            cost=round(charge.cost, 1),
            llm_calls=len(calls),
            llm_cost=0.0,
            llm_input=sum(c.input for c in calls),
            llm_output=sum(c.output for c in calls),
            cannot_fit=cannot_fit,
            rewrite=rewrite,
        )
        scopes = [totals, main] if call.thread is None else [totals]
        used = uses.get(index, [])
        if used:
            where = _compactd_fidelity(
                used, items_sent, rendered, terms, handles, session.graph, policy
            )
            for scope in scopes:
                for place, pages in where:
                    scope["compactd"].fidelity.add(place, pages)
        for scope in scopes:
            mine = scope["compactd"]
            mine.add(charge, tokens, (limit, window), cannot_fit, rewrite)
            row.llm_cost = round(mine.add_calls(calls, price, write_price), 1)
            mine.removed_without_summary += removed
            mine.prepared += prepared
            mine.prepared_unused += prepared - reused  # settled when a preparation is used
        system_block = (b"system:" + rec.kind.encode(), system_tokens[rec.kind])
        items = [attrs.evolve(i, tokens=round(i.tokens * ratio)) for i in rec.items]
        if "baseline" in totals:
            base_blocks = [system_block, *((i.key, i.tokens) for i in items)]
            base_charge = base_cache.request(base_blocks, at, 0, 1)
            base_rewrite = _rewrote(base_last.get(thread), at, base_charge, ttl_seconds)
            base_last[thread] = (at, base_charge.tokens)
            for scope in scopes:
                scope["baseline"].add(
                    base_charge, base_charge.tokens, (limit, window), False, base_rewrite
                )
            row.baseline_tokens = base_charge.tokens
            row.baseline_cost = round(base_charge.cost, 1)
        for anchor, anchor_cache, anchor_last in anchors:
            mine_items = items
            if anchor.NAME == CodexLike.NAME:
                mine_items = [
                    attrs.evolve(i, tokens=round(i.tokens * ratio)) for i in codex_view[index].items
                ]
            sent = anchor.request(thread, rec.kind, mine_items)
            keys = [k for k, _ in sent.blocks]
            for use in used:
                place = VISIBLE if in_view(use.term, keys, terms) else FURTHER
                for scope in scopes:
                    scope.setdefault(anchor.NAME, Totals()).fidelity.add(place)
            anchor_charge = anchor_cache.request(sent.blocks, at, 0, 1)
            anchor_rewrite = _rewrote(anchor_last.get(thread), at, anchor_charge, ttl_seconds)
            anchor_last[thread] = (at, anchor_charge.tokens)
            for scope in scopes:
                mine = scope.setdefault(anchor.NAME, Totals())
                mine.add(
                    anchor_charge, anchor_charge.tokens, (limit, window), False, anchor_rewrite
                )
                mine.add_calls(sent.calls)
            row.anchor_tokens[anchor.NAME] = anchor_charge.tokens
        if "recorded" in totals and rec.usage:
            prompt = recorded_prompt(rec.usage)
            cost = price_recorded(rec.usage, options.ttl, options.write_price)
            for scope in scopes:
                scope["recorded"].add_recorded(rec.usage, cost, (limit, window))
            row.recorded_tokens, row.recorded_cost = prompt, round(cost, 1)
        report_steps.append(row)
    recall_counts.finish(
        session.graph,
        policy.max_tool_result_chars,
        policy.truncate_head_chars,
        policy.truncate_tail_chars,
    )
    return ReplayReport(
        imported.source_id,
        window,
        limit,
        int(policy.cascade_threshold * limit),
        options.ttl,
        engine.provider_for(session),
        report_steps,
        totals,
        main,
        units,
        write_price,
        recall_counts,
        {a.NAME: a.notes() for a, _, _ in anchors if hasattr(a, "notes")},
        model,
    )


def _compactd_fidelity(
    used: list[Use],
    items: list[Item],
    rendered: Rendered,
    terms: dict[bytes, frozenset[str]],
    handles: set[str],
    graph: Any,
    policy: Any,
) -> list[tuple[str, int]]:
    """Where each use's term was in compactd's request: in view (summaries aside), one
    `compactd_recall` call away (with the pages paging would have read), or further."""
    keys = [i.key for i in items if i.category != MARKERS]
    shown_ids: set[str] | None = None
    out: list[tuple[str, int]] = []
    for use in used:
        if in_view(use.term, keys, terms):
            out.append((VISIBLE, 0))
            continue
        if not policy.recall:
            out.append((FURTHER, 0))
            continue
        if shown_ids is None:
            shown_ids = _tool_use_ids(rendered.seen_request)
        best = 0
        for use_id in use.results:
            node = graph.tool_by_use_id(use_id)
            if node is None:
                continue
            whole = handle_for(graph.session_id, node.id)
            cut = handle_for(graph.session_id, node.id, CUT)
            if cut in handles and whole not in handles and use_id not in shown_ids:
                content = shown_content(graph, node)
                start = first_cut_line(
                    content,
                    policy.max_tool_result_chars,
                    policy.truncate_head_chars,
                    policy.truncate_tail_chars,
                )
            elif whole in handles or cut in handles or use_id in shown_ids:
                content, start = shown_content(graph, node), 1
            else:
                continue
            pages = pages_to(content_text(content), use.term, start or 1, policy.recall_max_chars)
            if pages and (best == 0 or pages < best):
                best = pages
        if not best and _in_a_range(graph, use.results, handles):
            best = 1  # one search of the range's transcript handle reaches the result
        out.append((ONE_CALL, best) if best else (FURTHER, 0))
    return out


def _in_a_range(graph: Any, use_ids: Iterable[str], handles: set[str]) -> bool:
    """Whether a transcript handle the request shows (a snip, collapse or summary marker's)
    covers one of these results: a search of it looks in every result of its turns."""
    starts = [graph.nodes.get(h[len(PREFIX) :].rsplit(".", 2)[0]) for h in handles if _is_from(h)]
    if not starts:
        return False
    for use_id in use_ids:
        call = graph.tool_by_use_id(use_id)
        message = graph.nodes.get(call.parent) if call is not None else None
        if message is None:
            continue
        for start in starts:
            if start is not None and start.owner == message.owner and start.seq <= message.seq:
                return True
    return False


def _is_from(handle: str) -> bool:
    key = handle[len(PREFIX) :].rsplit(".", 1)[0]
    return key.endswith(f".{FROM}")


def _tool_use_ids(request: dict[str, Any]) -> set[str]:
    """The ids of the tool calls a request shows (a cleared result is recalled by its id)."""
    return {
        str(block.get("id"))
        for message in request.get("messages", [])
        if isinstance(message.get("content"), list)
        for block in message["content"]
        if isinstance(block, dict) and block.get("type") == "tool_use"
    }


def _anchors(
    system_tokens: dict[str, int],
    window: int,
    limit: int,
    ttl: str,
    write_price: float | None,
    system_breakpoint: bool = False,
) -> list[tuple[Any, CacheModel, dict[str, tuple[float, int]]]]:
    """The anchor policies, each with a cache of its own and its threads' last requests."""
    systems = {kind: (b"system:" + kind.encode(), t) for kind, t in system_tokens.items()}
    policies: list[Any] = [
        CodexLike(systems, window),
        OpencodeLike(systems, window, limit),
        ClaudeCodeLike(systems, window, limit),
        ServerSideCompaction(systems, window, limit),
    ]
    return [
        (p, CacheModel(ttl, write_price=write_price, system_breakpoint=system_breakpoint), {})
        for p in policies
    ]


class Meter:
    """Every LLM call a cascade or a preparation makes, seen on its way to the driver, in the
    provider's units (the digest's counts scaled by the replay's ratio); a call the provider
    answered as a fork of the cached request is priced as it is sent (`price_fork`: what it
    read from the cache and what it wrote, by the replay's cache model)."""

    def __init__(self, scale: float, price_fork: Callable[[Fork], Charge] | None = None) -> None:
        self.scale = scale
        self.price_fork = price_fork
        self.calls: list[Call] = []

    def through(self, steps: Steps[T]) -> Steps[T]:
        """`steps`, passing each summary request on and noting it with its answer."""
        try:
            need = next(steps)
            while True:
                answer = yield need
                self.note(need, answer)
                need = steps.send(answer)
        except StopIteration as done:
            return done.value
        finally:
            steps.close()

    def note(self, need: SummaryNeeded, answer: Answer) -> None:
        request = need.request
        if isinstance(answer, SummaryFailure):
            inp, out = request.input_tokens_estimate, 0
        else:
            inp = answer.input_tokens or request.input_tokens_estimate
            out = answer.output_tokens
        # a model writes no more than the call's max_tokens (the provider's tokens); the
        # offline digest may (it quotes every user request whole), which no real call costs
        output = min(round(out * self.scale), request.max_output_tokens)
        results = len(request.items) if request.purpose == EVIDENCE else 0
        fork = request.fork
        forked = isinstance(answer, SummaryResult) and answer.forked
        if fork is not None and forked and self.price_fork is not None:
            charge = self.price_fork(fork)
            call = Call(
                request.purpose,
                charge.tokens,
                output,
                read=charge.read,
                written=charge.written,
            )
        else:
            call = Call(request.purpose, round(inp * self.scale), output, results)
        self.calls.append(call)

    def take(self) -> list[Call]:
        calls, self.calls = self.calls, []
        return calls


def _rewrote(
    previous: tuple[float, int] | None, at: float, charge: Charge, ttl_seconds: float
) -> bool:
    """A cache-rewriting event: the thread's previous request was still cached, and this one
    read less than 90 % of it (something well before its end changed)."""
    if previous is None:
        return False
    when, tokens = previous
    return at - when < ttl_seconds and charge.read < REWRITE_SHARE * tokens
