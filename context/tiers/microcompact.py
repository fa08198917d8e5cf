"""Tier 1 — Microcompact: clear old results of compactable tools, keeping the most recent few.

Two paths (spec §4, DESIGN §4):
- time-based: the result is replaced by a fixed placeholder, recorded per tool id (a `clear`
  record), so every later render is byte-identical. Used by any provider, and always when the
  session was idle (the provider's cache has expired anyway).
- server path (the Anthropic format in `microcompactMode: "cache"`, the default): the same
  decision writes a `clear` record with `mode: "cache"`; the messages sent never change, and
  every later request carries a `clear_tool_uses_20250919` context edit whose `keep` makes the
  provider clear exactly the recorded calls (the provider is stateless: it clears the oldest
  uses beyond `keep`, so a growing `keep` holds the cleared set — and the cached prefix —
  still between clears). The request's measure is what the model sees after the clear, so
  the cascade counts it and Snip runs only when that is still over.

Triggers: the count trigger (first pass at 50 tool calls, then every 25 more) and the idle
trigger. A count-triggered clear while the cache is warm and the request is under its
threshold is deferred (DESIGN §4 "cache-aware scheduling") when it would re-write the cache for
little gain: it is applied with the next change the window forces, or when the cache is cold —
but never more than `microcompactDeferCalls` calls past its due point, so the trigger fires.

Clearing reaches into the latest turns too (never the `keep_recent` newest calls): a single
agentic turn can hold hundreds of results, and without this nothing could make it fit. The
same old calls also lose the long strings of their inputs (`microcompactClearInputs`, as the
API's `clear_tool_inputs`): a file an agent wrote is often its biggest part, and the call keeps
its shape and small arguments.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import attrs

from ..blocks import has_long_strings
from ..graph import Graph, Path
from ..policy import CLEARED_PLACEHOLDER, Policy, is_compactable
from ..projection import CLEAR, Projection, visible_bounds
from ..render.conversation import TOOL_CALLS, TOOL_RESULTS
from ..render.request import Rendered, RequestSpec, ServerEdit
from ..superseded import Use, superseded
from .base import Run, TierEvent, cache_cold, growth, server_path

TIER = "microcompact"

CONTEXT_MANAGEMENT_BETA = "context-management-2025-06-27"
CLEAR_EDIT = "clear_tool_uses_20250919"


@attrs.frozen
class Candidates:
    calls: int  # tool calls on the thread
    clearable: list[str]  # tool node ids whose results may be cleared, oldest first
    last_pass_at: int | None  # tool-call count at the last count-triggered pass
    inputs: list[str] = attrs.field(factory=list)  # tool node ids whose long inputs may go
    # tool node id -> why: results a newer one made stale (`superseded`), cleared client-side
    # on either path, the newest calls kept whole included
    superseded: dict[str, str] = attrs.field(factory=dict)

    @property
    def any(self) -> bool:
        return bool(self.clearable or self.inputs or self.superseded)

    @property
    def count(self) -> int:
        return len(set(self.clearable) | set(self.inputs) | set(self.superseded))


def tool_calls(graph: Graph, path: Path) -> list[str]:
    """Every tool node on the thread, in call order."""
    out: list[str] = []
    nodes = graph.nodes
    for node_id in path.ids:
        for call_id in nodes[node_id].calls:
            if nodes[call_id].kind == "tool":
                out.append(call_id)
    return out


def candidates(
    graph: Graph,
    path: Path,
    proj: Projection,
    policy: Policy,
    *,
    server: bool = False,
    sizes: Mapping[str, int] | None = None,
    budget: int | None = None,
    superseded_too: bool = True,
) -> Candidates:
    """What one pass may clear. `server`: the provider will clear them, and it clears every
    result of a compactable tool older than the `keep` newest — so the pass takes them all
    (short ones, kept evidence, ones without a result too), and measure matches what it sees.
    With `sizes` (tokens each call costs in the request) and `budget`, the newest calls kept
    whole are those that fit the budget (`kept_recent`). `superseded_too`: superseded results
    go in this pass, the newest kept calls' included (`superseded`).

    Only the turns the context shows are walked (calls in summarized, collapsed or snipped
    turns are out of it already); the count of every call comes from the line's memo."""
    nodes = graph.nodes
    ids = path.line.ids
    compactable = []
    for _index, start, end in visible_bounds(proj, path):
        for node_id in ids[start:end]:
            for c in nodes[node_id].calls:
                call = nodes[c]
                if (
                    call.kind == "tool"
                    and (server or call.answered)
                    and call.function is None
                    and is_compactable(policy, call.name)
                ):
                    compactable.append(c)
    stale = _superseded(graph, compactable, proj, policy) if superseded_too else {}
    keep = kept_recent(
        [c for c in compactable if c not in stale], policy, sizes, budget, newest_step(graph, path)
    )
    clearable = [
        c
        for c in compactable
        if c not in keep
        and c not in stale
        and c not in proj.cleared
        and c not in proj.cache_cleared
        and (server or (c not in proj.evidence and larger_than_placeholder(graph.nodes[c].result)))
    ]
    inputs = []
    if policy.microcompact_clear_inputs:
        inputs = [
            c
            for c in compactable
            if c not in keep
            and c not in proj.cleared_inputs
            and c not in proj.cache_cleared_inputs
            and has_long_strings(graph.nodes[c].input, policy.microcompact_input_chars)
        ]
    last = None
    for rec in proj.applied:
        if rec.kind == CLEAR and rec.data.get("trigger") == "count":
            at = rec.data.get("atCalls")
            if isinstance(at, int) and (last is None or at > last):
                last = at
    return Candidates(path.tool_count(nodes), clearable, last, inputs, stale)


def _superseded(
    graph: Graph, compactable: list[str], proj: Projection, policy: Policy
) -> dict[str, str]:
    """The answered compactable calls whose results a newer visible one made stale and that
    are still shown in full (`clearSuperseded`)."""
    if not policy.microcompact_clear_superseded:
        return {}
    nodes = graph.nodes
    hidden = proj.cleared.keys() | proj.cache_cleared.keys()
    uses = [
        Use(c, nodes[c].name, nodes[c].input, c not in hidden, bool(nodes[c].is_error))
        for c in compactable
        if nodes[c].answered
    ]
    return {
        c: why
        for c, why in superseded(uses).items()
        if c not in hidden and c not in proj.evidence and larger_than_placeholder(nodes[c].result)
    }


def kept_recent(
    compactable: list[str],
    policy: Policy,
    sizes: Mapping[str, int] | None = None,
    budget: int | None = None,
    unseen: frozenset[str] = frozenset(),
) -> set[str]:
    """The newest calls a pass keeps whole: `microcompactKeepRecent` (5) of them — fewer when
    they do not fit `budget` tokens (`microcompactKeepRecentShare` of the limit: at a small
    window five big writes are a third of it, and a summary cannot take them either, for they
    are the newest steps) — and always the `unseen` ones, the calls of the newest step, whose
    results the model has not read yet (not even the last resort clears those)."""
    wanted = policy.microcompact_keep_recent
    kept = [c for c in compactable if c in unseen]
    newest = compactable[-wanted:] if wanted else []
    if sizes is None or budget is None:
        return set(newest) | set(kept)
    used = sum(sizes.get(c, 0) for c in kept)
    for call in reversed(newest):
        if call in unseen:
            continue
        size = sizes.get(call, 0)
        if used + size > budget:
            break
        kept.append(call)
        used += size
    return set(kept)


def newest_step(graph: Graph, path: Path) -> frozenset[str]:
    """The calls of the thread's last assistant message: the model has not read their
    results yet (they are what the next request brings it)."""
    nodes = graph.nodes
    for node_id in reversed(path.ids):
        node = nodes[node_id]
        if node.kind == "assistant":
            return frozenset(node.calls)
    return frozenset()


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


def due_at(c: Candidates, policy: Policy) -> int:
    """The call count at which the count trigger is due: first at `microcompact_first_at`
    calls, then every `…_every` more after the last count-triggered pass."""
    if c.last_pass_at is None:
        return policy.microcompact_first_at
    return c.last_pass_at + policy.microcompact_every


def count_due(c: Candidates, policy: Policy) -> bool:
    """The count trigger: first at `microcompact_first_at` calls, then every `…_every` more."""
    return c.calls >= due_at(c, policy)


def deferred_until(c: Candidates, policy: Policy) -> int:
    """The call count past which a count-triggered clear is not deferred any longer, however
    warm the cache: the due point plus `microcompactDeferCalls`."""
    return due_at(c, policy) + policy.microcompact_defer_calls


def clear_record(
    c: Candidates, trigger: str, thread: str | None, mode: str = "time"
) -> dict[str, Any]:
    """The `clear` record of one pass, per tool id: `results` get the fixed placeholder,
    `inputs` lose their long strings; `covers` lists every call touched. `mode: "cache"`: the
    provider does it server-side and the messages sent keep them."""
    results, inputs = list(c.clearable), list(c.inputs)
    taken = set(results)  # once: rebuilding it per element made a large first pass quadratic
    covers = results + [i for i in inputs if i not in taken]
    taken.update(inputs)
    covers += [i for i in c.superseded if i not in taken]
    data: dict[str, Any] = {
        "mode": mode,
        "trigger": trigger,
        "atCalls": c.calls,
        "results": results,
        "inputs": inputs,
    }
    if c.superseded:
        data["superseded"] = dict(c.superseded)
    return {"kind": CLEAR, "covers": covers, "data": data, "thread": thread}


@attrs.frozen
class ServerPlan:
    """What the provider will clear for one request (by its rule: the oldest uses of tools not
    excluded, all but `keep`), as tool node ids, and the edit that says so."""

    results: frozenset[str]
    inputs: frozenset[str]
    edit: dict[str, Any]


def server_plan(sent: Rendered, policy: Policy, spec: RequestSpec) -> ServerPlan | None:
    """The edit that makes the provider clear every recorded server-side clear in the request
    (and, by its rule, every older use of a compactable tool); None when none is in it."""
    uses = [
        (part.block, part.node)
        for message in sent.conversation.messages
        for part in message.parts
        if part.block.get("type") == "tool_use" and part.node is not None
    ]
    names = {t.get("name") for t in spec.tools or [] if isinstance(t, dict)}
    names.update(block.get("name") for block, _ in uses)
    exclude = sorted(n for n in names if isinstance(n, str) and not is_compactable(policy, n))
    eligible = [(block, node) for block, node in uses if block.get("name") not in exclude]
    proj = sent.projection
    # membership, not a set of every cleared call: the session may have cleared tens of
    # thousands more, long summarized or snipped away
    results, inputs = proj.cache_cleared, proj.cache_cleared_inputs
    last = max(
        (i for i, (_, node) in enumerate(eligible) if node in results or node in inputs),
        default=None,
    )
    if last is None:
        return None
    cleared = eligible[: last + 1]
    long_inputs = sorted(
        {str(block.get("name")) for block, node in cleared if node in proj.cache_cleared_inputs}
    )
    edit: dict[str, Any] = {
        "type": CLEAR_EDIT,
        "keep": {"type": "tool_uses", "value": len(eligible) - last - 1},
    }
    if exclude:
        edit["exclude_tools"] = exclude
    if long_inputs:
        edit["clear_tool_inputs"] = long_inputs
    return ServerPlan(
        results=frozenset(node for _, node in cleared),
        inputs=frozenset(node for block, node in cleared if block.get("name") in long_inputs),
        edit=edit,
    )


def server_edit(sent: Rendered, seen: Rendered, plan: ServerPlan, policy: Policy) -> Rendered:
    """`seen` (rendered with the plan's clears applied) carrying the request as sent plus the
    context edit; the request as sent when the clear would free nothing."""
    freed = sent.tally.prompt - seen.tally.prompt
    if freed <= 0:
        return sent
    # the provider counts more tokens than our estimate (Claude ~1.3x), so it clears at least
    # this much whenever it clears what we counted; under it, the clear is not made at all
    at_least = max(1, min(policy.microcompact_cache_clear_at_least, freed * 4 // 5))
    edit = {
        "type": CLEAR_EDIT,
        "trigger": {"type": "input_tokens", "value": at_least},
        **{k: v for k, v in plan.edit.items() if k != "type"},
        "clear_at_least": {"type": "input_tokens", "value": at_least},
    }
    seen.server = ServerEdit(
        build_seen=seen.request_builder(),
        sent=sent,
        sent_estimate=sent.tally.prompt,
        headers={"anthropic-beta": CONTEXT_MANAGEMENT_BETA},
    )
    seen.request = {**sent.request, "context_management": {"edits": [edit]}}
    return seen


# ---- the tier ---------------------------------------------------------------------------------


def _candidates(run: Run, keep_recent: int | None = None) -> Candidates:
    """Candidates on the run's current render (memoized until it changes)."""
    policy = run.policy
    if keep_recent is not None:
        policy = attrs.evolve(policy, microcompact_keep_recent=keep_recent)
    server = server_path(policy, run.spec)
    # on the server path the provider keeps the messages, so a superseded result cleared by
    # compactd re-writes the cache from it: only when the window forces a change anyway
    superseded_too = not server or run.total > run.threshold
    key = (TIER, policy.microcompact_keep_recent, server, superseded_too)
    found = run.memo.get(key)
    if found is None:
        found = run.memo[key] = candidates(
            run.graph,
            run.path,
            run.rendered.projection,
            policy,
            server=server,
            sizes=call_sizes(run.rendered),
            budget=int(policy.microcompact_keep_recent_share * run.limit),
            superseded_too=superseded_too,
        )
    return found


def call_sizes(rendered: Rendered) -> dict[str, int]:
    """Tokens each tool call costs in the request (its call and its result, calibrated)."""
    out: dict[str, int] = {}
    for message in rendered.conversation.messages:
        for part in message.parts:
            if part.node is not None and part.category in (TOOL_CALLS, TOOL_RESULTS):
                out[part.node] = out.get(part.node, 0) + part.tokens
    ratio = rendered.ratio
    return {node: round(tokens * ratio) for node, tokens in out.items()}


def due(run: Run) -> bool:
    """The count trigger (50 calls, then every 25), or a request over its threshold (a forced
    change: old results go before whole turns). The same on both paths."""
    policy = run.policy
    over = run.total > run.threshold
    return count_due(_candidates(run), policy) or (over and policy.microcompact_when_over)


def apply(run: Run) -> None:
    policy = run.policy
    cands = _candidates(run)
    mode = _mode(run)
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
    bound = deferred_until(cands, policy)
    # the window forces a change within the horizon anyway: that change clears these too, so
    # the bound does not fire a clear of its own a few requests before it
    near = requests_left(run) < policy.microcompact_horizon
    if count and not over and policy.microcompact_warm != "apply" and (cands.calls < bound or near):
        pays, saved, rewritten = clear_pays(run, cands, mode)
        if not pays:
            when = (
                f"it fires with the change the window forces (in about {requests_left(run)} "
                "requests)"
                if near
                else f"it fires at {bound} tool calls at the latest (sooner when the window "
                "forces a change)"
            )
            run.note(
                TIER,
                f"deferred: the cache is warm and the request is under its threshold; "
                f"clearing would save {saved:,} tokens per request but re-write {rewritten:,} "
                f"cached tokens; {when}",
                calls=cands.calls,
                clearable=cands.count,
                firesAt=bound,
            )
            return
    trigger = "count" if count else "forced"
    warm_count = count and not over
    why = (
        f"{cands.calls} tool calls"
        + (" (deferred as far as it may be)" if warm_count and cands.calls >= bound else "")
        + (
            " (the provider's cache has expired: the clear re-writes nothing)"
            if warm_count and cands.calls < bound and cache_cold(run)
            else ""
        )
        if count
        else "over threshold (the window forces a change; old results go before whole turns)"
    )
    where = " (server-side: the messages sent stay as they are)" if mode == "cache" else ""
    event = clear_event(
        cands,
        trigger,
        f"{why}: cleared {len(cands.clearable)} old tool results"
        + (f" and {len(cands.superseded)} superseded ones" if cands.superseded else "")
        + f" and shortened {len(cands.inputs)} old tool inputs (kept the "
        f"{policy.microcompact_keep_recent} most recent calls){where}",
        mode,
    )
    run.propose(clear_record(cands, trigger, run.thread, mode), event)
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


def headroom_only(run: Run) -> bool:
    """After the other tiers: a forced clear is the run's only change and the request would
    fit its limit without it — it buys headroom, the window does not force it. Under the
    `economic` rule such a clear must pay like a warm one (a result or two cleared per
    request, each re-writing the cache, is the thrash the rule is for)."""
    if run.policy.microcompact_warm != "economic" or len(run.pending) != 1:
        return False
    if run.forced_calibration is not None:
        return False  # Tier 5: the provider refused the request as it was; what frees is needed
    record, _event = run.pending[0]
    return record["kind"] == CLEAR and record["data"].get("trigger") == "forced"


def keep_if_paid(run: Run) -> None:
    """Withdraw the headroom-only clear unless the request needs it to fit or DESIGN §4's
    warm rule says it pays; then it is proposed again, as it was."""
    record, event = run.pending[0]
    run.withdraw(CLEAR)
    cands = _candidates(run)
    if run.total <= run.limit and cands.any:
        pays, saved, rewritten = clear_pays(run, cands, _mode(run), whole=False)
        if not pays:
            run.note(
                TIER,
                f"not worth it: the request fits its limit without it, and a clear would save "
                f"{saved:,} tokens per request but re-write {rewritten:,} cached tokens; the "
                "cache is kept",
                calls=cands.calls,
            )
            return
    run.propose(record, event)


def _mode(run: Run) -> str:
    return "cache" if server_path(run.policy, run.spec) else "time"


def clear_pays(
    run: Run, cands: Candidates, mode: str = "time", whole: bool = True
) -> tuple[bool, int, int]:
    """DESIGN §4's rule for a change made only to save tokens while the cache is warm: it pays
    when 0.1 × tokens saved × requests still to come > 1.25 × tokens re-written.
    `microcompactWarm: "defer"` never pays; `"economic"` expects `microcompactHorizon` more
    requests — fewer when the window will force a change sooner (`requests_left`): that
    change clears these results anyway, so the clear saves only the reads until then. What is
    re-written is the whole request, system prompt and tools included: the price the project
    measures by (economy.md) reads back only an earlier request that is a prefix of the new
    one, and once a session has changed its prefix (a clear, a snip, a summary) no request
    since ends before the old results a clear changes. (The API also reads back at the
    system prompt's breakpoint; counting that made warm clears look cheaper than they were
    — see docs/decisions.md.) `whole` False counts from the last breakpoint instead
    (`rewritten_after`): a forced clear that only buys headroom (`keep_if_paid`), whose
    alternative is a summary, not the cache kept."""
    if run.policy.microcompact_warm == "defer":
        return False, 0, 0
    before = run.rendered
    record = clear_record(cands, "count", run.thread, mode)
    trial = run.graph.draft_record("clear", record["covers"], record["data"], run.thread)
    after = run.render([trial])
    saved = before.total - after.total
    if cache_cold(run):  # the request is written whole anyway: the clear re-writes nothing
        return saved > 0, saved, 0
    rewritten = after.total if whole else rewritten_after(before, after)
    horizon = run.policy.microcompact_horizon
    if before.total <= run.threshold:  # a warm clear: the window's own change comes sooner
        horizon = min(horizon, requests_left(run))
    return 0.1 * saved * horizon > 1.25 * rewritten, saved, rewritten


def requests_left(run: Run) -> int:
    """Requests before this one's growth takes the thread over its threshold (and the window
    forces a change)."""
    return max(0, run.threshold - run.total) // growth(run)


def rewritten_after(before: Rendered, after: Rendered) -> int:
    """Tokens of `after` the provider writes to its cache again when it follows `before`: from
    the last breakpoint a request before it could have cached ahead of the first message that
    changed — the summary marker, or the previous request's last, third-to-last or
    fifth-to-last message (where the renderer put its breakpoints; a request is a step, two
    messages, past the one before it); before any of them, the whole conversation (the system
    prompt and tools stay read)."""
    old, new = before.conversation.messages, after.conversation.messages
    first = next(
        (
            i
            for i, (a, b) in enumerate(zip(old, new, strict=False))
            if len(a.parts) != len(b.parts)
            or any(p is not q for p, q in zip(a.parts, b.parts, strict=True))
        ),
        min(len(old), len(new)),
    )
    n = len(old)
    readable = [i for i in (n - 3, n - 5, n - 7) if 0 <= i < first]
    readable += [i for i, m in enumerate(new[:first]) if m.kind == "summary"]
    kept = max(readable, default=-1)  # the last message read back whole
    return sum(m.tokens for m in new[kept + 1 :])


def last_resort_due(run: Run) -> bool:
    """Before answering "cannot fit" (when `microcompactKeepLast` keeps fewer than
    `microcompactKeepRecent`): old results are the only thing left that can go."""
    policy = run.policy
    return (
        run.total > run.limit
        and policy.microcompact_keep_last < policy.microcompact_keep_recent
        and _candidates(run, policy.microcompact_keep_last).any
    )


def last_resort(run: Run) -> None:
    """One more Tier 1 pass that keeps only the newest results (`microcompactKeepLast`). What
    is left is whole turns no tier may take — better than a request that cannot be sent."""
    keep = run.policy.microcompact_keep_last
    cands = _candidates(run, keep)
    mode = _mode(run)
    run.propose(
        clear_record(cands, "last-resort", run.thread, mode),
        clear_event(
            cands,
            "last-resort",
            f"still over the limit after every tier: cleared {len(cands.clearable)} "
            f"more old tool results and shortened {len(cands.inputs)} inputs, keeping only the "
            f"{keep} newest",
            mode,
        ),
    )


def newest_inputs_due(run: Run) -> bool:
    """Still over the limit with every other result cleared: the newest step's own long
    inputs (a file the model just wrote) are the last thing Tier 1 may shorten."""
    return run.total > run.limit and bool(_newest_inputs(run))


def _newest_inputs(run: Run) -> list[str]:
    proj, nodes = run.rendered.projection, run.graph.nodes
    return [
        c
        for c in sorted(newest_step(run.graph, run.path))
        if nodes[c].kind == "tool"
        and c not in proj.cleared_inputs
        and c not in proj.cache_cleared_inputs
        and has_long_strings(nodes[c].input, run.policy.microcompact_input_chars)
    ]


def shorten_newest_inputs(run: Run) -> None:
    """Shorten the long inputs of the newest step's calls, compactd itself on either path (the
    provider clears a call's input only with its result, and those results the model has not
    read yet: they stay whole). Better than a request that cannot be sent: what the model
    wrote is in its files and in the session graph."""
    ids = _newest_inputs(run)
    record = {
        "kind": CLEAR,
        "covers": ids,
        "data": {
            "mode": "time",
            "trigger": "last-resort",
            "atCalls": run.path.tool_count(run.graph.nodes),
            "results": [],
            "inputs": ids,
        },
        "thread": run.thread,
    }
    run.propose(
        record,
        TierEvent(
            TIER,
            f"still over the limit with every other result cleared: shortened the long inputs "
            f"of the newest step's {len(ids)} call(s); their results, which the model has not "
            "read yet, stay whole",
            details={"trigger": "last-resort", "cleared": 0, "inputs": len(ids), "mode": "time"},
        ),
    )


def clear_event(cands: Candidates, trigger: str, reason: str, mode: str = "time") -> TierEvent:
    details: dict[str, Any] = {
        "trigger": trigger,
        "cleared": len(cands.clearable),
        "inputs": len(cands.inputs),
    }
    if cands.superseded:
        details["superseded"] = len(cands.superseded)
    if trigger != "idle":
        details["calls"] = cands.calls
    details["mode"] = mode
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
