"""`replay`: how a recorded session would have gone under the cascade, priced with the
provider's cache rules — and the same for "no management" and for the recorded run.

For each step (the ops before one recorded model call) the replay applies the ops, runs the
idle work when the recorded gap since the previous request exceeds the idle threshold (the
cache is cold then), runs the cascade as before a model call, and prices the rendered request
with `CacheModel` at the recorded time. The baseline is the same history rendered with nothing
removed or shortened. A generator like the cascade: LLM summaries are yielded to the driver.
"""

from __future__ import annotations

import hashlib
from typing import Any

import attrs
import orjson

from .cache_model import CacheModel, Charge, price_recorded
from .engine import Engine, RenderParams
from .errors import CannotFit
from .importers.apply import OpApplier, steps
from .importers.plan import ImportedSession
from .render.request import Rendered, RequestSpec
from .summarizer.types import Steps
from .tiers.base import TierEvent
from .tokens import MESSAGE_OVERHEAD
from .visibility import ViewOptions

NO_MANAGEMENT = {"maxToolResultChars": 10**15}
REMOVING_TIERS = ("microcompact", "snip")


@attrs.frozen
class ReplayOptions:
    window: int | None = None
    reserve: int | None = None
    ttl: str = "5m"
    model: str | None = None
    config: dict[str, Any] = attrs.field(factory=dict)  # session config (policy overrides)
    baseline: bool = True


@attrs.define
class Totals:
    requests: int = 0
    cost: float = 0.0
    peak: int = 0
    over_window: int = 0
    input_tokens: int = 0
    cache_read: int = 0
    cache_write: int = 0
    llm_calls: int = 0
    summary_input: int = 0
    summary_output: int = 0
    removed_without_summary: int = 0
    cannot_fit: int = 0

    @property
    def cache_read_share(self) -> float:
        return self.cache_read / self.input_tokens if self.input_tokens else 0.0

    def to_json(self) -> dict[str, Any]:
        out = attrs.asdict(self)
        out["cacheReadShare"] = round(self.cache_read_share, 4)
        out["cost"] = round(self.cost, 1)
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
    cost: float
    summary_calls: int
    summary_input: int
    summary_output: int
    cannot_fit: bool
    baseline_tokens: int | None = None
    baseline_cost: float | None = None
    recorded_tokens: int | None = None
    recorded_cost: float | None = None

    def to_json(self) -> dict[str, Any]:
        return {_camel(k): v for k, v in attrs.asdict(self).items()}


@attrs.define
class ReplayReport:
    source: str
    window: int
    limit: int
    threshold: int
    ttl: str
    provider: str | None
    steps: list[Step]
    compactd: Totals
    baseline: Totals | None
    recorded: Totals | None

    def to_json(self) -> dict[str, Any]:
        return {
            "source": self.source,
            "window": self.window,
            "limit": self.limit,
            "threshold": self.threshold,
            "ttl": self.ttl,
            "provider": self.provider,
            "steps": [s.to_json() for s in self.steps],
            "totals": {
                "compactd": self.compactd.to_json(),
                "baseline": self.baseline.to_json() if self.baseline else None,
                "recorded": self.recorded.to_json() if self.recorded else None,
            },
        }


def _camel(name: str) -> str:
    head, *rest = name.split("_")
    return head + "".join(p.title() for p in rest)


def request_blocks(rendered: Rendered, counter: Any) -> list[tuple[bytes, int]]:
    """The request as the cache sees it: (content key, tokens) per block, in prefix order
    (tools, system, then each message's blocks; cache_control marks are not content)."""
    request = rendered.request
    out: list[tuple[bytes, int]] = []

    def key(kind: str, value: Any) -> bytes:
        return hashlib.blake2b(kind.encode() + orjson.dumps(value), digest_size=16).digest()

    for tool in request.get("tools", []):
        plain = {k: v for k, v in tool.items() if k != "cache_control"}
        out.append((key("tool", plain), counter.tool_definition(plain)))
    for block in request.get("system", []):
        plain = {k: v for k, v in block.items() if k != "cache_control"}
        out.append((key("system", plain), counter.system_block(plain)))
    parts = [p for msg in rendered.conversation.messages for p in msg.parts]
    wire = [
        (msg["role"], i, b) for msg in request["messages"] for i, b in enumerate(msg["content"])
    ]
    if len(parts) != len(wire):  # not the Anthropic format: count per message
        for msg in request["messages"]:
            text = orjson.dumps(msg)
            out.append((key("message", msg), len(text) // 4 + MESSAGE_OVERHEAD))
        return out
    for (role, position, block), part in zip(wire, parts, strict=True):
        plain = {k: v for k, v in block.items() if k != "cache_control"}
        overhead = MESSAGE_OVERHEAD if position == 0 else 0
        out.append((key(role + str(position == 0), plain), part.tokens + overhead))
    return out


def replay(
    engine: Engine, imported: ImportedSession, options: ReplayOptions
) -> Steps[ReplayReport]:
    session = engine.library.create(
        config=dict(options.config), meta={"replayOf": imported.source_id}
    )
    engine.sessions[session.id] = session
    base = None
    if options.baseline:
        base = engine.library.create(config=dict(NO_MANAGEMENT))
        engine.sessions[base.id] = base
    appliers = [OpApplier(session)] + ([OpApplier(base)] if base is not None else [])
    for applier in appliers:
        applier.session.clock = lambda a=applier: a.now
    cache, base_cache = CacheModel(options.ttl), CacheModel(options.ttl)
    totals, base_totals = Totals(), Totals() if base is not None else None
    recorded = Totals() if any(s.call and s.call.usage for s in steps(imported)) else None
    report_steps: list[Step] = []
    policy = engine.policy(session)
    previous: float | None = None
    limit = window = 0
    for index, step in enumerate(steps(imported)):
        for op in step.ops:
            for applier in appliers:
                applier.apply(op)
        call = step.call
        if call is None:
            continue
        at = call.timestamp if call.timestamp is not None else (previous or 0.0) + 1.0
        events: list[TierEvent] = []
        if previous is not None and at - previous >= policy.idle_seconds:
            events.extend(engine.run_idle(session).events)
        previous = at
        viewer = appliers[0].functions.get(call.thread) if call.thread else None
        params = RenderParams(
            view=ViewOptions(viewer=viewer),
            spec=RequestSpec(
                model=options.model,
                window=options.window,
                max_output_tokens=options.reserve,
                cache_ttl=None,
            ),
        )
        cannot_fit = False
        try:
            outcome = yield from engine.cascade(session.id, params)
            rendered = outcome.rendered
            events.extend(outcome.events)
        except CannotFit:
            cannot_fit = True
            rendered = engine.render_session(session, params)
        limit, window = rendered.budget.limit, rendered.budget.window
        charge = cache.request(request_blocks(rendered, engine.counter), at)
        summary_calls, summary_in, summary_out = _summary_usage(events)
        summary_cost = summary_in + summary_out * 5.0
        applied = [e for e in events if e.applied]
        removed = sum(
            max(0, e.tokens_before - e.tokens_after) for e in applied if e.tier in REMOVING_TIERS
        )
        row = Step(
            index=index,
            thread="main" if call.thread is None else f"function:{viewer}",
            time=at,
            tokens=rendered.total,
            limit=limit,
            tiers=[e.tier for e in applied],
            events=[
                {
                    "tier": e.tier,
                    "applied": e.applied,
                    "reason": e.reason,
                    "tokensBefore": e.tokens_before,
                    "tokensAfter": e.tokens_after,
                }
                for e in events
            ],
            cache_read=charge.read,
            cache_write=charge.written,
            cost=round(charge.cost, 1),
            summary_calls=summary_calls,
            summary_input=summary_in,
            summary_output=summary_out,
            cannot_fit=cannot_fit,
        )
        _add(totals, charge, rendered.total, limit, cannot_fit)
        totals.cost += summary_cost
        totals.llm_calls += summary_calls
        totals.summary_input += summary_in
        totals.summary_output += summary_out
        totals.removed_without_summary += removed
        if base is not None and base_totals is not None:
            base_viewer = appliers[1].functions.get(call.thread) if call.thread else None
            base_params = attrs.evolve(params, view=ViewOptions(viewer=base_viewer))
            base_rendered = engine.render_session(base, base_params)
            base_charge = base_cache.request(request_blocks(base_rendered, engine.counter), at)
            _add(base_totals, base_charge, base_rendered.total, limit, False)
            row.baseline_tokens, row.baseline_cost = base_rendered.total, round(base_charge.cost, 1)
        if recorded is not None and call.usage:
            usage = call.usage
            tokens = sum(
                int(usage.get(k) or 0)
                for k in ("input_tokens", "cache_creation_input_tokens", "cache_read_input_tokens")
            )
            cost = price_recorded(usage, options.ttl)
            recorded.requests += 1
            recorded.cost += cost
            recorded.peak = max(recorded.peak, tokens)
            recorded.input_tokens += tokens
            recorded.cache_read += int(usage.get("cache_read_input_tokens") or 0)
            recorded.cache_write += int(usage.get("cache_creation_input_tokens") or 0)
            recorded.over_window += tokens > limit
            row.recorded_tokens, row.recorded_cost = tokens, round(cost, 1)
        report_steps.append(row)
    return ReplayReport(
        imported.source_id,
        window,
        limit,
        int(policy.cascade_threshold * limit),
        options.ttl,
        engine.provider_for(session),
        report_steps,
        totals,
        base_totals,
        recorded,
    )


def _add(totals: Totals, charge: Charge, tokens: int, limit: int, cannot_fit: bool) -> None:
    totals.requests += 1
    totals.cost += charge.cost
    totals.peak = max(totals.peak, tokens)
    totals.over_window += tokens > limit
    totals.input_tokens += charge.tokens
    totals.cache_read += charge.read
    totals.cache_write += charge.written
    totals.cannot_fit += cannot_fit


def _summary_usage(events: list[TierEvent]) -> tuple[int, int, int]:
    calls = inp = out = 0
    for event in events:
        details = event.details
        if event.tier in ("summary", "collapse") and event.applied:
            calls += int(details.get("calls") or 0)
            inp += int(details.get("inputTokens") or 0)
            out += int(details.get("outputTokens") or 0)
    return calls, inp, out
