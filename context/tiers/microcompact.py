"""Tier 1 — Microcompact: clear old results of compactable tools, keeping the most recent few.

Two paths (spec §4, DESIGN §4):
- time-based: the result is replaced by a fixed placeholder, recorded per tool id (a `clear`
  record), so every later render is byte-identical. Used by any provider, and always when the
  session was idle (the provider's cache has expired anyway).
- cache-aware (Anthropic, `microcompactMode: "cache"`): the rendered messages stay unchanged
  and the request carries a `clear_tool_uses_20250919` context edit; the provider clears
  server-side and reports `applied_edits`, which `context/reportUsage` records.

Triggers: the count trigger (first pass at 50 tool calls, then every 25 more) and the idle
trigger. A count-triggered clear while the cache is warm and the request is under its
threshold is deferred (DESIGN §4 "cache-aware scheduling"): it would re-write the cache for
little gain; it is applied with the next change the window forces, or when the cache is cold.

Clearing reaches into the latest turns too (never the `keep_recent` newest calls): a single
agentic turn can hold hundreds of results, and without this nothing could make it fit. The
same old calls also lose the long strings of their inputs (`microcompactClearInputs`, as the
API's `clear_tool_inputs`): a file an agent wrote is often its biggest part, and the call keeps
its shape and small arguments.
"""

from __future__ import annotations

from typing import Any

import attrs

from ..graph import Graph, Path
from ..policy import CLEARED_PLACEHOLDER, Policy, is_compactable
from ..projection import CLEAR, Projection
from ..render.request import Rendered, RequestSpec
from ..truncate import has_long_strings
from .base import Run, TierEvent

TIER = "microcompact"

CONTEXT_MANAGEMENT_BETA = "context-management-2025-06-27"
CLEAR_EDIT = "clear_tool_uses_20250919"


@attrs.frozen
class Candidates:
    calls: int  # tool calls on the thread
    clearable: list[str]  # tool node ids whose results may be cleared, oldest first
    last_pass_at: int | None  # tool-call count at the last count-triggered pass
    inputs: list[str] = attrs.field(factory=list)  # tool node ids whose long inputs may go

    @property
    def any(self) -> bool:
        return bool(self.clearable or self.inputs)

    @property
    def count(self) -> int:
        return len(set(self.clearable) | set(self.inputs))


def tool_calls(graph: Graph, path: Path) -> list[str]:
    """Every tool node on the thread, in call order."""
    out: list[str] = []
    nodes = graph.nodes
    for node_id in path.ids:
        for call_id in nodes[node_id].calls:
            if nodes[call_id].kind == "tool":
                out.append(call_id)
    return out


def candidates(graph: Graph, path: Path, proj: Projection, policy: Policy) -> Candidates:
    calls = tool_calls(graph, path)
    hidden = _hidden_nodes(graph, path, proj)
    compactable = [
        c
        for c in calls
        if graph.nodes[c].answered
        and graph.nodes[c].function is None
        and is_compactable(policy, graph.nodes[c].name)
        and c not in hidden
    ]
    keep = (
        set(compactable[-policy.microcompact_keep_recent :])
        if policy.microcompact_keep_recent
        else set()
    )
    clearable = [
        c
        for c in compactable
        if c not in keep
        and c not in proj.cleared
        and c not in proj.evidence
        and larger_than_placeholder(graph.nodes[c].result)
    ]
    inputs = []
    if policy.microcompact_clear_inputs:
        inputs = [
            c
            for c in compactable
            if c not in keep
            and c not in proj.cleared_inputs
            and has_long_strings(graph.nodes[c].input, policy.microcompact_input_chars)
        ]
    last = None
    for rec in proj.applied:
        if rec.kind == CLEAR and rec.data.get("trigger") == "count":
            at = rec.data.get("atCalls")
            if isinstance(at, int) and (last is None or at > last):
                last = at
    return Candidates(len(calls), clearable, last, inputs)


def larger_than_placeholder(result: Any) -> bool:
    """Clearing only pays when the result is bigger than the placeholder that replaces it: a
    short result ("No files found") would grow the request and still break the cache."""
    if isinstance(result, str):
        return len(result) > len(CLEARED_PLACEHOLDER)
    if isinstance(result, list):
        if any(not isinstance(b, dict) or b.get("type") != "text" for b in result):
            return True  # images and documents are always worth clearing
        return sum(len(b.get("text", "")) for b in result) > len(CLEARED_PLACEHOLDER)
    return False


def _hidden_nodes(graph: Graph, path: Path, proj: Projection) -> set[str]:
    """Tool nodes already out of the context (summarized, collapsed or snipped turns)."""
    hidden_starts = set(proj.summary_turns) | set(proj.snipped) | set(proj.collapsed)
    if not hidden_starts:
        return set()
    out: set[str] = set()
    ids = path.line.ids
    for start, end in path.turn_bounds():
        if ids[start] in hidden_starts:
            for node_id in ids[start:end]:
                out.update(graph.nodes[node_id].calls)
    return out


def count_due(c: Candidates, policy: Policy) -> bool:
    """The count trigger: first at `microcompact_first_at` calls, then every `…_every` more."""
    if c.calls < policy.microcompact_first_at:
        return False
    if c.last_pass_at is None:
        return True
    return c.calls >= c.last_pass_at + policy.microcompact_every


def clear_record(c: Candidates, trigger: str, thread: str | None) -> dict[str, Any]:
    """The `clear` record of one pass (time-based, per tool id): `results` get the fixed
    placeholder, `inputs` lose their long strings; `covers` lists every call touched."""
    results, inputs = list(c.clearable), list(c.inputs)
    covers = results + [i for i in inputs if i not in set(results)]
    return {
        "kind": CLEAR,
        "covers": covers,
        "data": {
            "mode": "time",
            "trigger": trigger,
            "atCalls": c.calls,
            "results": results,
            "inputs": inputs,
        },
        "thread": thread,
    }


def cache_edit(
    graph: Graph,
    path: Path,
    policy: Policy,
    request_tools: list[dict[str, Any]] | None,
    trigger_tokens: int,
) -> dict[str, Any]:
    """The `context_management` body for the cache-aware path; `exclude_tools` lists every
    tool in use that is not compactable, so the provider only clears what we would."""
    names = {t.get("name") for t in request_tools or [] if isinstance(t, dict)}
    names.update(graph.nodes[c].name for c in tool_calls(graph, path))
    exclude = sorted(n for n in names if n and not is_compactable(policy, n))
    edit: dict[str, Any] = {
        "type": CLEAR_EDIT,
        "trigger": {"type": "input_tokens", "value": max(1, trigger_tokens)},
        "keep": {"type": "tool_uses", "value": policy.microcompact_keep_recent},
        "clear_at_least": {
            "type": "input_tokens",
            "value": policy.microcompact_cache_clear_at_least,
        },
    }
    if exclude:
        edit["exclude_tools"] = exclude
    return {"edits": [edit]}


def attach_server_edit(rendered: Rendered, graph: Graph, policy: Policy, spec: RequestSpec) -> None:
    """Tier 1's cache-aware path: an Anthropic request carries the context edit in
    `microcompactMode: "cache"` once the thread holds `microcompactFirstAt` tool calls — on
    every render from then on, with the cascade or without, so the messages the provider
    caches never change."""
    if policy.microcompact_mode != "cache" or spec.format != "anthropic":
        return
    path = rendered.view.own
    if len(tool_calls(graph, path)) < policy.microcompact_first_at:
        return
    limit = rendered.budget.limit
    rendered.request["context_management"] = cache_edit(
        graph, path, policy, spec.tools, int(policy.cascade_threshold * limit)
    )
    rendered.request["betas"] = [CONTEXT_MANAGEMENT_BETA]


# ---- the tier ---------------------------------------------------------------------------------


def _candidates(run: Run, keep_recent: int | None = None) -> Candidates:
    """Candidates on the run's current render (memoized until it changes)."""
    policy = run.policy
    if keep_recent is not None:
        policy = attrs.evolve(policy, microcompact_keep_recent=keep_recent)
    key = (TIER, policy.microcompact_keep_recent)
    found = run.memo.get(key)
    if found is None:
        found = run.memo[key] = candidates(run.graph, run.path, run.rendered.projection, policy)
    return found


def due(run: Run) -> bool:
    """The count trigger (50 calls, then every 25), or a request over its threshold (a forced
    change: old results go before whole turns). In cache mode: the request carries the edit."""
    policy = run.policy
    if policy.microcompact_mode == "cache":
        return "context_management" in run.rendered.request
    over = run.total > run.threshold
    return count_due(_candidates(run), policy) or (over and policy.microcompact_when_over)


def apply(run: Run) -> None:
    policy = run.policy
    cands = _candidates(run)
    if policy.microcompact_mode == "cache":
        run.note(
            TIER,
            "cache-aware: the provider clears old tool results "
            "server-side; the messages stay unchanged",
            calls=cands.calls,
        )
        return
    over = run.total > run.threshold
    count = count_due(cands, policy)
    if not cands.any:
        if count:
            run.note(
                TIER,
                "count trigger reached but no old compactable result to clear",
                calls=cands.calls,
            )
        return
    if count and not over and policy.microcompact_warm != "apply":
        pays, saved, rewritten = clear_pays(run, cands)
        if not pays:
            run.note(
                TIER,
                f"deferred: the cache is warm and the request is under its threshold; "
                f"clearing would save {saved:,} tokens per request but re-write {rewritten:,} "
                "cached tokens",
                calls=cands.calls,
                clearable=cands.count,
            )
            return
    trigger = "count" if count else "forced"
    why = (
        f"{cands.calls} tool calls"
        if count
        else "over threshold (the window forces a change; old results go before whole turns)"
    )
    event = clear_event(
        cands,
        trigger,
        f"{why}: cleared {len(cands.clearable)} old tool results and shortened "
        f"{len(cands.inputs)} old tool inputs (kept the {policy.microcompact_keep_recent} "
        "most recent calls)",
    )
    run.propose(clear_record(cands, trigger, run.thread), event)
    saved = event.tokens_before - run.total
    minimum = int(policy.microcompact_min_gain * run.limit)
    if trigger == "forced" and event.tokens_before <= run.limit and saved < minimum:
        # the request still fits: breaking the cache for a few tokens is not worth it
        run.retract()
        run.note(
            TIER,
            f"not worth it: a forced clear would free only {saved:,} tokens (under "
            f"{minimum:,}) while the request still fits; the cache is kept",
            calls=cands.calls,
        )


def clear_pays(run: Run, cands: Candidates) -> tuple[bool, int, int]:
    """DESIGN §4's rule for a change made only to save tokens while the cache is warm: it pays
    when 0.1 × tokens saved × requests still to come > 1.25 × tokens re-written (everything
    after the first changed position). `microcompactWarm: "defer"` never pays;
    `"economic"` expects `microcompactHorizon` more requests."""
    if run.policy.microcompact_warm == "defer":
        return False, 0, 0
    before = run.rendered
    record = clear_record(cands, "count", run.thread)
    trial = run.graph.draft_record("clear", record["covers"], record["data"], run.thread)
    after = run.render([trial])
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


def last_resort_due(run: Run) -> bool:
    """Before answering "cannot fit" (time mode, when `microcompactKeepLast` keeps fewer than
    `microcompactKeepRecent`): old results are the only thing left that can go."""
    policy = run.policy
    return (
        run.total > run.limit
        and policy.microcompact_mode == "time"
        and policy.microcompact_keep_last < policy.microcompact_keep_recent
        and _candidates(run, policy.microcompact_keep_last).any
    )


def last_resort(run: Run) -> None:
    """One more Tier 1 pass that keeps only the newest results (`microcompactKeepLast`). What
    is left is whole turns no tier may take — better than a request that cannot be sent."""
    keep = run.policy.microcompact_keep_last
    cands = _candidates(run, keep)
    run.propose(
        clear_record(cands, "last-resort", run.thread),
        clear_event(
            cands,
            "last-resort",
            f"still over the limit after every tier: cleared {len(cands.clearable)} "
            f"more old tool results and shortened {len(cands.inputs)} inputs, keeping only the "
            f"{keep} newest",
        ),
    )


def clear_event(cands: Candidates, trigger: str, reason: str) -> TierEvent:
    details: dict[str, Any] = {
        "trigger": trigger,
        "cleared": len(cands.clearable),
        "inputs": len(cands.inputs),
    }
    if trigger != "idle":
        details["calls"] = cands.calls
    details["mode"] = "time"
    return TierEvent(TIER, reason, details=details)


def idle_clear(
    graph: Graph, path: Path, proj: Projection, policy: Policy
) -> tuple[Candidates, dict[str, Any] | None, TierEvent | None]:
    """The idle work's Tier 1 pass: the provider's cache has expired, so old results are
    cleared client-side at no cache cost. The record and event, or None when nothing is old."""
    cands = candidates(graph, path, proj, policy)
    if not cands.any:
        return cands, None, None
    event = clear_event(
        cands,
        "idle",
        f"idle for {policy.idle_seconds / 60:.0f}+ minutes (the provider's "
        f"cache has expired): cleared {len(cands.clearable)} old tool results and "
        f"shortened {len(cands.inputs)} old tool inputs",
    )
    return cands, clear_record(cands, "idle", None), event
