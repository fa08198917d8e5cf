"""Tier 4 — the rolling summary (spec "Current rolling-summary constraints", DESIGN §5).

- The replaceable range is a prefix of the thread, priced with its visible subcalls. The
  latest `summary_keep_turns` (2) complete turns and the active turn stay; if that still
  leaves the request over its target, only the latest complete turn stays; if even that is
  too much — one request, a hundred tool calls — the range ends inside a turn (the latest
  complete one, else the active one): at an assistant-message boundary, never between a call
  and its result, never through a running function, the turn's request kept verbatim before
  the summary and its newest exchanges after it. A collapse segment is never split.
- The input starts at the range's first message and holds the prior summary that applies to
  this branch, every original user request (also of snipped turns) and every visible tool
  result as rendered. The record's `covers` and the input describe the same range.
- A range longer than one summarizer call is summarized in budgeted chunks that fold a
  rolling summary (`compactd.context.summarizer`).
- After generation the replacement is tried in memory and kept only if the request gets
  strictly smaller; otherwise (or on failure, cancellation, an empty summary) nothing is
  written. One rolling summary is in force per branch: the newest applicable one, which folds
  the previous one in. HEAD never moves.
- The marker keeps every user request of the range verbatim and the latest assistant text
  (the checkpoint rules), whatever the provider wrote.
- Tool evidence first (the spec's stage 2): long text-only tool results of the range are
  condensed into `evidence` records (id, tool, error flag, what the result showed) and the
  checkpoint is written from those. Images and documents of the range stay in the request
  after the marker; only when the limit cannot hold them are they named instead.
- A summary prepared in the background is used only for the same range, model and
  instructions; one time bound (`summaryTimeBoundSeconds`) covers a whole summary.
"""

from __future__ import annotations

import bisect
from typing import Any

import attrs

from ..graph import Graph, Path
from ..projection import EVIDENCE, SUMMARY, Projection, thread_index
from ..render.conversation import SYSTEM, TOOL_RESULTS, TOOLS, last_assistant_kept
from ..summarizer.evidence import (
    EvidenceSource,
    batches,
    evidence_marker,
    evidence_request,
    parse_evidence,
    source_text,
    source_tokens,
)
from ..summarizer.fork import describe, first_parts, kept_tail
from ..summarizer.generate import Limits, generate
from ..summarizer.input import Range, SummaryInput, user_request_texts
from ..summarizer.instructions import checkpoint_system, fork_instruction
from ..summarizer.types import Fork, Steps, SummaryFailure, SummaryNeeded
from ..tokens import MESSAGE_OVERHEAD
from ..turns import Turn, has_running, is_complete, plan_cuts, turn_node_ids, turns_of
from .base import Run, TierEvent, cache_cold, growth, llm_bar

TIER = "summary"


# ---- choosing the range ---------------------------------------------------------------------


def select_replaceable_range(
    graph: Graph, path: Path, proj: Projection, keep_complete: int
) -> Range | None:
    """The prefix of whole turns a summary may replace, keeping the active turn and the
    latest `keep_complete` complete turns (and anything after a running function)."""
    turns = turns_of(path)
    if not turns:
        return None
    plan = plan_cuts(graph, path, keep_first_turn=False, keep_complete=keep_complete, turns=turns)
    boundary = min(plan.protected) if plan.protected else len(turns)
    return _whole_turns(graph, path, proj, turns, _unsplit(proj, turns, boundary))


def _unsplit(proj: Projection, turns: list[Turn], boundary: int) -> int:
    """`boundary` moved back so that it splits no collapse segment."""
    for rec in {id(r): r for r in proj.collapsed.values()}.values():
        indexes = [t.index for t in turns if t.start_id in rec.data.get("turns", [])]
        if indexes and min(indexes) < boundary <= max(indexes):
            boundary = min(indexes)
    return boundary


def _whole_turns(
    graph: Graph, path: Path, proj: Projection, turns: list[Turn], boundary: int
) -> Range | None:
    chosen = turns[:boundary]
    if not chosen:
        return None
    new = [t for t in chosen if t.start_id not in proj.summary_turns]
    covers: list[str] = []
    for turn in chosen:
        covers.extend(turn_node_ids(graph, path, turn))
    return Range(chosen, new, covers)


def cut_points(graph: Graph, path: Path, turn: Turn, after: int) -> list[int]:
    """Where a summary may end inside `turn` (path indices of the last node it replaces):
    after an assistant message whose calls all have their results, before the turn's last
    assistant message, never past a pending call or a running function; only after `after`
    (what an earlier summary already replaced)."""
    ids = path.line.ids
    assistants = [i for i in range(turn.start, turn.end) if graph.nodes[ids[i]].kind == "assistant"]
    out: list[int] = []
    for i in assistants[:-1]:  # the latest assistant message always stays
        if any(graph.nodes[c].pending for c in graph.nodes[ids[i]].calls):
            break  # nothing at or after a call still waiting may be replaced
        if i > after:
            out.append(i)
    return out


def in_turn_range(
    graph: Graph, path: Path, proj: Projection, turns: list[Turn], turn: Turn, cut: int
) -> Range:
    """Every turn before `turn` whole, and `turn` through path index `cut`."""
    whole = turns[: turn.index]
    new = [t for t in whole if t.start_id not in proj.summary_turns]
    covers: list[str] = []
    for t in whole:
        covers.extend(turn_node_ids(graph, path, t))
    ids = path.line.ids
    for i in range(turn.start, cut + 1):
        covers.append(ids[i])
        for call in graph.calls_of(graph.nodes[ids[i]]):
            covers.append(call.id)
            if call.function is not None:
                covers.append(call.function)
    return Range(whole, new, covers, turn, cut)


@attrs.frozen
class Costs:
    """What each part of the current request costs (calibrated): every thread node of the
    path with its calls and results, and the markers standing before or in each turn."""

    nodes: dict[int, int]  # path index -> tokens
    markers: dict[int, int]  # turn index -> tokens of summary, snip and collapse markers

    @classmethod
    def of(cls, run: Run) -> Costs:
        graph, path, ratio = run.graph, run.path, run.rendered.ratio
        nodes: dict[int, int] = {}
        markers: dict[int, int] = {}
        for msg in run.rendered.conversation.messages:
            if msg.turn < 0:
                continue  # the caller's prefix of a function's view
            if msg.kind != "turn":
                markers[msg.turn] = markers.get(msg.turn, 0) + round(msg.tokens * ratio)
                continue
            overhead = MESSAGE_OVERHEAD
            for part in msg.parts:
                at = thread_index(graph, part.node, path) if part.node else None
                if at is not None:
                    nodes[at] = nodes.get(at, 0) + round((part.tokens + overhead) * ratio)
                    overhead = 0
        return cls(nodes, markers)

    def of_range(self, rng: Range) -> int:
        """Tokens the range's content costs now (a kept request excluded)."""
        total = sum(self.markers.get(t.index, 0) for t in rng.turns)
        total += sum(self.nodes.get(i, 0) for t in rng.turns for i in range(t.start, t.end))
        if rng.partial is not None and rng.through is not None:
            total += self.markers.get(rng.partial.index, 0)
            total += sum(
                self.nodes.get(i, 0) for i in range(rng.partial.start + 1, rng.through + 1)
            )
        return total


def summary_budget(run: Run) -> int:
    """How long the summary may be: `summaryMaxTokens` (5,000), but never more than
    `summaryLimitShare` (a twentieth) of what the request may hold — the marker stays in every
    request until the next compaction, and at a 48K window a 5K summary with the user's
    requests beside it would leave little room to work in — and never less than
    `summaryMinTokens` (2,000: the spec's checkpoint is 2,000–5,000 tokens), which a small
    window lowers to a fifth of its limit."""
    policy = run.policy
    floor = min(policy.summary_min_tokens, run.limit // 5)
    return max(floor, min(policy.summary_max_tokens, int(policy.summary_limit_share * run.limit)))


def size_asked(run: Run) -> tuple[int, int]:
    """The (floor, cap) in tokens the checkpoint prompt asks for."""
    cap = summary_budget(run)
    return min(run.policy.summary_min_tokens, cap), cap


PreparedKey = tuple[str, str | None, str, str | None, int]
"""What a prepared summary is reused for: the range's input hash, the summary model, the
instructions ("" without), and the request it was written for — its model and its limit (the
spec's "identical source prefix and model": the checkpoint's size and what it may leave out
follow the request's budget)."""


@attrs.frozen
class Checkpoint:
    """A written checkpoint, ready to propose: the text and its usage, and the tool evidence it
    was written from (each source with the line that stands for it)."""

    text: str
    usage: dict[str, Any]
    evidence: list[tuple[EvidenceSource, str]]


def range_key(run: Run, rng: Range, instructions: str | None) -> PreparedKey:
    """The key of `rng`'s checkpoint: the hash of its input before evidence, the summary
    model, the instructions, the request's model and its limit — a summary made for another
    of these is not this one."""
    inp = run.summary_input(rng)
    return (
        inp.digest,
        run.policy.summary_model or None,
        instructions or "",
        run.spec.model,
        run.limit,
    )


def evidence_sources(run: Run, rng: Range) -> list[EvidenceSource]:
    """The range's tool results that tool evidence condenses: shown raw in the request now,
    of a tool (not a function), text only, and at least `evidenceMinTokens` long originally."""
    policy = run.policy
    if not policy.evidence_enabled:
        return []
    covered = set(rng.covers)
    out: list[EvidenceSource] = []
    for msg in run.rendered.conversation.messages:
        if msg.kind != "turn" or msg.turn < 0:
            continue
        for part in msg.parts:
            if part.category != TOOL_RESULTS or part.block.get("type") != "tool_result":
                continue
            node = run.graph.nodes.get(part.node or "")
            if node is None or node.kind != "tool" or node.function or node.id not in covered:
                continue
            text = _text_only(node.result) if node.answered else None
            if text is None:
                continue
            tokens = run.engine.counter.text(text)
            if tokens >= policy.evidence_min_tokens:
                out.append(
                    EvidenceSource(
                        node.id,
                        node.tool_use_id or node.id,
                        node.name or "tool",
                        bool(node.is_error),
                        text,
                        tokens,
                    )
                )
    return out


def _text_only(result: Any) -> str | None:
    """A result's text, or None when it holds anything but text (an image stays as it is)."""
    if isinstance(result, str):
        return result
    if isinstance(result, list) and all(
        isinstance(b, dict) and b.get("type") == "text" for b in result
    ):
        return "\n".join(b.get("text", "") for b in result)
    return None


def condense(
    run: Run, sources: list[EvidenceSource], limits: Limits
) -> Steps[list[tuple[EvidenceSource, str]]]:
    """Tool evidence for `sources`, a batch per call. A result the model gave no line for, or
    whose batch failed, reaches the checkpoint raw; running out of time fails the summary."""
    policy = run.policy
    out: list[tuple[EvidenceSource, str]] = []
    for batch in batches(sources, policy.summary_input_max_tokens):
        limits.check_time("the tool evidence")
        request = evidence_request(
            batch,
            tokens_each=policy.evidence_summary_tokens,
            model=policy.summary_model or None,
            deadline=limits.deadline,
            counter=run.engine.counter,
        )
        answer = yield SummaryNeeded(EVIDENCE, request)
        if isinstance(answer, SummaryFailure):
            if answer.kind in ("timeout", "cancelled"):
                raise SummaryFailure(answer.kind, f"the tool evidence failed: {answer}")
            continue
        lines = parse_evidence(answer.text, [s.tool_use_id for s in batch])
        out.extend((s, lines[s.tool_use_id]) for s in batch if s.tool_use_id in lines)
    return out


def evidence_folds(run: Run, inp: SummaryInput, sources: list[EvidenceSource]) -> bool:
    """Tool evidence rides in the checkpoint's own call (`evidenceFold`) when the range with
    its long results whole fits one summarizer call: a separate call would read the same
    results and add its own output and a call to the compaction. Past one call, evidence
    condenses them first, as the spec's stage does."""
    if not run.policy.evidence_fold:
        return False
    whole = inp.tokens + sum(source_tokens(src) for src in sources)
    return whole <= run.policy.summary_input_max_tokens


def write_checkpoint(
    run: Run, rng: Range, instructions: str | None, limits: Limits
) -> Steps[tuple[Checkpoint, SummaryInput]]:
    """The checkpoint of `rng`, written the one way Tier 4 and background preparation both use
    (evidence first, then the same prompt, budget and model), with the input it was written
    from. Where the summary may be a fork of the cached request (`fork_of`), that is offered
    first, in one call that reads what the model saw; a provider that cannot send it answers
    the plain prompt (with the long results folded in where they fit one call, without
    condensed evidence otherwise: the fork is the one call there was to be)."""
    inp = run.summary_input(rng)
    sources = evidence_sources(run, rng)
    if sources and evidence_folds(run, inp, sources):
        # one call: the checkpoint reads the results whole instead of their evidence
        inp = run.summary_input(rng, originals={src.node: source_text(src) for src in sources})
        sources = []
    fork = fork_of(run, rng, instructions)
    if fork is not None:
        sources = []
    evidence = (yield from condense(run, sources, limits)) if sources else []
    if evidence:  # (the input without it was what the fold was weighed on)
        inp = run.summary_input(rng, {src.node: line for src, line in evidence})
    text, usage = yield from generate(
        inp,
        purpose="rolling",
        system=checkpoint_system(instructions, size_asked(run), media=bool(inp.media)),
        max_output=summary_budget(run),
        model=run.policy.summary_model or None,
        limits=limits,
        fork=fork,
        ratio=run.rendered.ratio,
    )
    usage["evidenceCalls"] = len(batches(sources, run.policy.summary_input_max_tokens))
    return Checkpoint(text, usage, evidence), inp


def forks(run: Run) -> bool:
    """Whether the summary is asked as a fork of the request this run started from
    (`summaryFork`): the provider caches it (the Anthropic format with breakpoints), the
    summary is the request's own model's (the cache is the model's: the request names it, and
    no other summary model is named), one model only, and the provider did not refuse that
    very request (Tier 5)."""
    policy, spec = run.policy, run.spec
    return (
        policy.summary_fork
        and spec.format == "anthropic"
        and spec.cache
        and bool(spec.model)
        and not spec.fallback_models
        and policy.summary_model in ("", spec.model or "")
        and run.forced_calibration is None
    )


def fork_of(run: Run, rng: Range, instructions: str | None) -> Fork | None:
    """The summary of `rng` asked as a fork of the run's starting request, or None where it
    cannot be one (`forks`), where nothing of the thread would follow the range, or where the
    request with the instruction and the summary's output would not fit the window."""
    if not forks(run):
        return None
    start = run.start
    tail = kept_tail(start.conversation, set(rng.covers))
    if tail is None:
        return None
    kept, first = tail
    request = None
    if rng.partial is not None:
        asked = user_request_texts(run.graph, run.path, rng.partial)
        request = "\n".join(asked) if asked else None
    hidden = [
        text
        for turn in rng.new_turns
        if turn.start_id in start.projection.snipped or turn.start_id in start.projection.collapsed
        for text in user_request_texts(run.graph, run.path, turn)
    ]
    instruction = fork_instruction(
        checkpoint_system(instructions, size_asked(run)),
        kept,
        describe(first_parts(start.conversation, first)),
        request=request if rng.partial is not None else None,
        hidden_requests=hidden,
    )
    tokens = run.engine.counter.request_text(instruction)
    window = start.budget.window
    if start.total + round(tokens * start.ratio) + summary_budget(run) > window:
        return None
    return Fork(
        format=run.spec.format,
        request=start.request,
        instruction=instruction,
        headers=start.headers,
        input_tokens_estimate=start.estimate + tokens,
        rendered=start,
    )


def evidence_record(run: Run, evidence: list[tuple[EvidenceSource, str]]) -> list[dict[str, Any]]:
    """One `evidence` record per condensed result: the call's id, tool and error flag, the
    line, and the marker that stands in the result's place (the original stays in the
    graph)."""
    starts = [t.start for t in turns_of(run.path)]
    ids = run.path.line.ids

    def turn_of(node: str) -> list[str]:
        at = thread_index(run.graph, node, run.path)
        return [] if at is None else [ids[starts[bisect.bisect_right(starts, at) - 1]]]

    return [
        {
            "kind": EVIDENCE,
            "covers": [src.node],
            "thread": run.thread,
            "data": {
                "turns": turn_of(src.node),  # not in force where that turn is protected
                "toolUseId": src.tool_use_id,
                "tool": src.tool,
                "isError": src.is_error,
                "evidence": line,
                "resultTokens": src.tokens,
                "text": evidence_marker(src, line),
            },
        }
        for src, line in evidence
    ]


# ---- the tier ---------------------------------------------------------------------------------


class MarkerBound:
    """An upper bound of the marker a summary of a range puts in the request: the checkpoint
    (at most the summary budget), every user request it replaces, verbatim, and — for whole
    turns — the last assistant text before its end (the marker quotes what the checkpoint
    does not; inside a turn, the latest assistant message stays after the marker)."""

    HEADER = 40
    NOTE = 60  # the recall note in a cut last assistant text

    def __init__(self, run: Run) -> None:
        self.run = run
        summary = run.rendered.projection.summary
        self.prior = list(summary.data.get("userRequests", [])) if summary else []
        self.requests: dict[str, int] = {}  # turn start id -> tokens of its requests

    def of(self, rng: Range) -> int:
        run, counter = self.run, self.run.engine.counter
        # the budget is the provider's tokens (a model's max_tokens); the rest is counted here
        budget = summary_budget(run) / run.rendered.ratio
        tokens = budget + self.HEADER + sum(map(counter.request_text, self.prior))
        for turn in rng.new_turns:
            if turn.start_id not in self.requests:
                texts = user_request_texts(run.graph, run.path, turn)
                self.requests[turn.start_id] = sum(map(counter.request_text, texts))
            tokens += self.requests[turn.start_id]
        last = _last_assistant_text(run.graph, run.path, rng) if rng.partial is None else None
        if last:  # as the marker keeps it (its ends, past the bound; the note's ~50 tokens)
            kept = last_assistant_kept(last, run.policy.summary_last_assistant_chars)
            tokens += counter.request_text(kept) + (self.NOTE if kept != last else 0)
        tokens += _media_tokens(run, rng)  # images and documents stay
        return round(tokens * run.rendered.ratio)


def _media_tokens(run: Run, rng: Range) -> int:
    """What the images and documents the summary of `rng` keeps cost (an upper bound: every
    one in its new turns and, as the prior summary's, those already kept)."""
    summary = run.rendered.projection.summary
    graph, counter = run.graph, run.engine.counter
    blocks: list[dict[str, Any]] = []
    for ref in (summary.data.get("media") or []) if summary is not None else []:
        node = graph.nodes.get(ref.get("node") or "")
        source = (node.result if node.kind == "tool" else node.content) if node else None
        index = ref.get("block", -1)
        if isinstance(source, list) and 0 <= index < len(source):
            blocks.append(source[index])
    for node_id in rng.covers:
        node = graph.nodes.get(node_id)
        if node is None:
            continue
        source = node.result if node.kind == "tool" else node.content
        if isinstance(source, list):
            blocks.extend(
                b for b in source if isinstance(b, dict) and b.get("type") in ("image", "document")
            )
    return sum(counter.block(b) for b in blocks)


def _last_assistant_text(graph: Graph, path: Path, rng: Range) -> str | None:
    if not rng.turns:
        return None
    end = rng.turns[-1].end
    ids = path.line.ids
    for i in range(end - 1, -1, -1):
        node = graph.nodes[ids[i]]
        if node.kind == "assistant":
            text = "\n".join(b["text"] for b in node.content if b.get("type") == "text")
            if text:
                return text
    return None


class Predicted:
    """The request's size with a range summarized, before any call: what the range costs
    now taken out, the most its marker may cost (`MarkerBound`) put in."""

    def __init__(self, run: Run) -> None:
        self.run = run
        self.costs = Costs.of(run)
        self.marker = MarkerBound(run)

    @classmethod
    def of(cls, run: Run) -> Predicted:
        """The run's, on its current render (choosing a range and weighing its call walk the
        request once between them)."""
        found = run.memo.get((TIER, "predicted"))
        if found is None:
            found = run.memo[(TIER, "predicted")] = cls(run)
        return found

    def __call__(self, rng: Range | None) -> int:
        if rng is None:
            return self.run.total
        return self.run.total - self.costs.of_range(rng) + self.marker.of(rng)


def worth_a_call(run: Run, rng: Range) -> tuple[bool, int]:
    """Whether an automatic summary of `rng` may pay for its call, and the least it frees
    (by the marker's bound): never when the bound says the request would not shrink, and —
    while the request fits its limit — only for `summaryMinGain` of the limit or more (a call
    and a cache rewrite for a thousand tokens is the next compaction two requests away)."""
    freed = run.total - Predicted.of(run)(rng)
    if freed <= 0:
        return False, freed
    if run.total <= run.limit and freed < run.policy.summary_min_gain * run.limit:
        return False, freed
    return True, freed


def choose_range(run: Run, *, take_latest: bool = False) -> Range | None:
    """The range Tier 4 replaces, the least that brings the request to the run's target:
    before the latest `summaryKeepTurns` complete turns; else before the latest complete turn
    (the spec's "retain the latest turn"); else inside a turn — the latest complete one, then
    the active one (a long turn of tool calls). A range that takes the latest complete turn
    (in part, or whole before a cut in the active turn) is chosen only when the request cannot
    fit otherwise — get under `summarySplitTurnAbove` (0.75) of its limit, neither as it is
    nor with whole turns summarized: the spec's rule gives way to what must be sent, never to
    the headroom target. A cut in an active turn that leaves no complete exchange behind it to
    keep may aim at the target. `take_latest`: a range that takes the latest complete turn may
    be chosen whatever the bar says (what a cached fork's economy weighs: `summary_range`).
    With nothing to summarize, short history is left alone (`/compact` then takes the spec's
    checkpoint: `_checkpoint`)."""
    policy, proj, graph, path = run.policy, run.rendered.projection, run.graph, run.path
    after = Predicted.of(run)

    best = select_replaceable_range(graph, path, proj, policy.summary_keep_turns)
    if after(best) > run.target:
        wider = select_replaceable_range(graph, path, proj, 1)
        if wider is not None and (best is None or len(wider.turns) > len(best.turns)):
            best = wider
    if after(best) > run.target:
        # taking the latest complete turn only when no whole-turn range gets it under the bar
        bar = max(run.target, min(run.threshold, int(policy.summary_split_turn_above * run.limit)))
        cannot_fit = min(run.total, after(best)) > bar
        may_take_latest = cannot_fit or take_latest
        best = (
            _inside_a_turn(run, after, may_take_latest=may_take_latest, target=run.target) or best
        )
    if best is None or not (best.new_turns or best.partial is not None):
        return None
    return best


def _checkpoint(run: Run, after: Predicted) -> Range | None:
    """`/compact`'s range when no whole turn before the retained ones is left to summarize —
    one long agentic turn, or every earlier turn summarized already (`/compact` asks for a
    summary now, whatever the target): the longest in-turn range (the spec's checkpoint: an
    older complete execution prefix, every user request kept verbatim in the marker) — when it
    frees at least what the summary itself may cost. A range that costs less than twice its
    marker is short history (the spec's "below the retention budget": two short turns, a turn
    of two steps), and the provider is not called for it."""
    rng = _inside_a_turn(run, after, may_take_latest=True, target=None)
    if rng is None or run.total - after(rng) < summary_budget(run):
        return None
    return rng


def _inside_a_turn(
    run: Run, after: Predicted, *, may_take_latest: bool, target: int | None
) -> Range | None:
    """The shortest in-turn range that reaches `target`, cutting in the latest complete
    turn first (the active turn stays whole), then in the active turn; if none reaches it,
    the longest one there is (always, with `target` None). Without `may_take_latest`, no
    range that takes the latest complete turn (the active one itself, once complete) that is
    still shown."""
    graph, path, proj = run.graph, run.path, run.rendered.projection
    turns = turns_of(path)
    if not turns:
        return None
    active = turns[-1]
    latest = next(
        (t for t in reversed(turns) if is_complete(graph, path, t) and t is not active), None
    )
    kept = next((t for t in reversed(turns) if _exchange(graph, path, t)), None)
    if kept is not None and kept.start_id in proj.summary_turns:
        kept = None  # replaced already: nothing of it is left to keep
    if not may_take_latest:
        if kept is not None:
            return None  # every in-turn range takes it (a cut in it, or it whole before one)
        latest = None
    done = -1  # the path index an earlier in-turn summary replaced through
    if proj.summary_through is not None and proj.summary_through[1] in path:
        done = path.index(proj.summary_through[1])
    longest: Range | None = None
    for turn in [t for t in (latest, active) if t is not None]:
        if _unsplit(proj, turns, turn.index) != turn.index or any(
            has_running(graph, path, t, pending=False) for t in turns[: turn.index]
        ):
            continue  # the turns before it must be replaceable whole
        for cut in cut_points(graph, path, turn, done):
            rng = in_turn_range(graph, path, proj, turns, turn, cut)
            longest = rng
            if target is not None and after(rng) <= target:
                return rng
    return longest


def _exchange(graph: Graph, path: Path, turn: Turn) -> bool:
    """A complete turn the assistant answered in: what "the latest complete turn" keeps. A turn
    of user content alone (an agent's environment note before the task) is not one."""
    return is_complete(graph, path, turn) and any(
        graph.nodes[n].kind == "assistant" for n in path.line.ids[turn.start : turn.end]
    )


def due(run: Run) -> bool:
    """Still over the LLM tiers' bar after the cheaper tiers (`summaryWhen`: the threshold where
    the provider holds the cache, spec §5's "advance only while over"; the target elsewhere),
    or under it after a change that buys less runway for its cost than the summary would
    (`buys_runway`). A summary costs a call — its input, its output at 5× — and a cache
    rewrite; once it runs it aims at the target (`/compact` jumps straight to `apply`)."""
    return run.total > llm_bar(run) or buys_runway(run)


def buys_runway(run: Run) -> bool:
    """A change the cheaper tiers drafted in this run moves the cached prefix — the provider
    re-writes what follows it — and leaves the request some requests before the threshold
    again. The summary runs in the same cascade, one rewrite for both, when it costs less per
    request of runway it buys: its call (its input, 5× an output of at least 2,000 tokens) and
    the rewrite of what it leaves, with the reads until the threshold, against the rewrite of
    what the cheaper tiers left and their reads. A clear that leaves the request a request or
    two from its threshold is the next rewrite already; a clear that buys many requests is not
    worth a call, and after a forced change neither is one that reached the target (the
    spec's "Snip … bringing it below threshold; Tiers 3–5 do not trigger"). After a warm
    clear, under the target too: at a large window a clear that takes a third off the request
    still leaves every later request reading what a summary would have replaced
    (docs/decisions.md, "A warm clear brings the summary that pays")."""
    if not run.pending or run.total > run.threshold:
        return False  # nothing moved; or over the threshold (the bar says)
    if run.start.total > run.threshold and run.total <= run.target:
        return False  # a forced change that reached the target
    rng = summary_range(run)
    if rng is None or not worth_a_call(run, rng)[0]:
        return False
    return per_request(run, Predicted.of(run)(rng), call_cost(run, rng)) < per_request(
        run, run.total, 0
    )


def per_request(run: Run, total: float, call: float) -> float:
    """What each request until the threshold costs when a change leaves the request at
    `total` (calibrated) for `call` (the summary's, 0 without one): the call and the rewrite
    of what the provider cannot read back (all but the system prompt and tools), spread over
    the requests it buys at the thread's growth, and the reads of those requests."""
    per_step = growth(run)
    categories = run.rendered.categories
    fixed = categories.get(SYSTEM, 0) + categories.get(TOOLS, 0)  # read back either way
    runway = max(run.threshold - total, per_step) / per_step
    return (call + 1.25 * (total - fixed)) / runway + 0.1 * (total + run.threshold) / 2


def summary_range(run: Run) -> Range | None:
    """The range an automatic Tier 4 replaces in this run: the spec's (`choose_range`) — or,
    where the summary is a cached fork, the range that takes the latest complete turn as well
    (a cut inside it, or it whole before a cut in the active turn) when that costs less per
    request of runway (`per_request`): a fork reads the request at a tenth of its price, so a
    summary that leaves the latest turn's work whole for a few requests more is dearer than
    one that buys many. Memoized on the run's render: `due` and `apply` take the same."""
    key = (TIER, "range")
    if key in run.memo:
        return run.memo[key]  # type: ignore[no-any-return]
    rng = choose_range(run)
    if forks(run):
        wider = choose_range(run, take_latest=True)
        if wider is not None and (rng is None or wider.covers != rng.covers):
            after = Predicted.of(run)
            if worth_a_call(run, wider)[0] and (
                rng is None
                or not worth_a_call(run, rng)[0]
                or per_request(run, after(wider), call_cost(run, wider))
                < per_request(run, after(rng), call_cost(run, rng))
            ):
                rng = wider
    run.memo[key] = rng
    return rng


def call_cost(run: Run, rng: Range) -> float:
    """What the summary's call costs, in calibrated input-token equivalents: 5× an output of
    at least `summaryMinTokens` (a real summary writes that much), and its input — as a fork,
    the request it continues read from the cache but for its newest step (which the previous
    request did not hold, and the fork writes), or written whole when the cache has expired
    (`cache_cold`); else the range's transcript, sent whole."""
    output = 5 * run.policy.summary_min_tokens
    if forks(run):
        total = run.start.total
        new = total if cache_cold(run) else min(total, growth(run))
        return 0.1 * (total - new) + 1.25 * new + output
    return run.summary_input(rng).tokens * run.rendered.ratio + output


def prepare_due(run: Run) -> bool:
    """Background preparation is worth a call only for the range the next compaction will
    take: the next compaction is near (over `prepareOccupancy` of the limit) and the agent
    waits for its user (the thread ends in an assistant message without calls). While the
    agent is at work, every step moves the range — a cut inside its turn above all — and a
    checkpoint prepared then was never the one used."""
    if run.total < run.policy.prepare_occupancy * run.limit:
        return False
    head = run.graph.nodes.get(run.path.head or "")
    return head is not None and head.kind == "assistant" and not head.calls


def apply(run: Run, *, manual: bool = False, instructions: str | None = None) -> Steps[None]:
    """Replace the range before the retained turns with one rolling summary — only if the
    request gets strictly smaller; otherwise (or on failure) nothing is written."""
    policy = run.policy
    if run.provider is None:
        run.note(
            TIER,
            "no summary provider is configured (--summary-provider digest|anthropic|client, "
            "COMPACTD_SUMMARY_PROVIDER, or the session's summaryProvider); the LLM tiers "
            "were skipped",
        )
        return
    proj = run.rendered.projection
    rng = summary_range(run)  # /compact's the same: a prepared checkpoint is for either
    if rng is None and manual:  # no whole turn to take: the spec's in-turn checkpoint
        rng = _checkpoint(run, Predicted.of(run))
    if rng is None:
        bar = int(policy.summary_split_turn_above * run.limit)
        if not manual and run.target < run.total <= max(bar, run.threshold):
            run.note(
                TIER,
                "the retained turns stay whole: nothing before them is left to summarize and "
                f"the request fits with them ({run.total:,} tokens); a summary inside the "
                "latest complete turn waits until it would not; the provider was not called",
            )
            return
        run.note(
            TIER,
            "short history: nothing before the retained turns to summarize; the "
            "provider was not called",
        )
        return
    why = (
        "/compact"
        if manual
        else "over threshold after the cheaper tiers"
        if run.total > llm_bar(run)
        else "the change this run made re-writes the cached prefix anyway, and a summary "
        "with it costs less per request than the change alone"
    )
    if not manual:
        worth, freed = worth_a_call(run, rng)
        if not worth:
            run.note(
                TIER,
                f"not worth a call: summarizing {_what(run, rng)} would free at most "
                f"{max(freed, 0):,} tokens of {run.total:,} (the summary and the requests it "
                "keeps verbatim cost about what the range does); the provider was not called",
            )
            return
    key = range_key(run, rng, instructions)
    prepared = run.engine.prepared_summary(run.session.id, key)
    try:
        if prepared is not None:
            checkpoint, inp = prepared
            usage = {
                "calls": 0,
                "reused": True,
                "model": checkpoint.usage.get("model"),
                "evidenceCalls": 0,
            }
        else:
            checkpoint, inp = yield from write_checkpoint(
                run, rng, instructions, Limits.of(policy, run.engine.clock)
            )
            usage = checkpoint.usage
    except SummaryFailure as failed:
        run.failed(TIER, failed)
        return
    text = checkpoint.text
    data: dict[str, Any] = {
        "text": text,
        "turns": [t.start_id for t in rng.turns],
        **_inside(run.path, rng),
        "userRequests": inp.user_requests,
        # inside a turn, the latest assistant message stays verbatim after the marker
        "lastAssistant": inp.last_assistant if rng.partial is None else None,
        "lastAssistantNode": inp.last_assistant_node if rng.partial is None else None,
        "provider": run.provider,
        "inputHash": inp.digest,
        "inputTokens": inp.tokens,
        "usage": usage,
    }
    if inp.media:
        data["media"] = inp.media
    if proj.summary is not None:
        data["prior"] = proj.summary.id
    if instructions:
        data["instructions"] = instructions
    before = run.total
    if checkpoint.evidence:
        run.propose_all(
            evidence_record(run, checkpoint.evidence),
            TierEvent(
                EVIDENCE,
                f"condensed {len(checkpoint.evidence)} long tool result(s) of the range into "
                "tool evidence before the checkpoint",
                details={"results": [src.tool_use_id for src, _ in checkpoint.evidence]},
            ),
        )
    kept = _kept(run, rng, len(inp.user_requests))
    summary_event = TierEvent(
        TIER,
        why + f": summarized {_what(run, rng)}; kept {kept}",
        details={
            "kept": kept,
            "coveredTurns": len(rng.turns),
            **_partial_details(run, rng),
            "provider": run.provider,
            "calls": usage.get("calls", 0),
            "inputTokens": usage.get("inputTokens", 0),
            "outputTokens": usage.get("outputTokens", 0),
            "reused": prepared is not None,
            "manual": manual,
            "evidence": len(checkpoint.evidence),
            "media": len(inp.media),
        },
    )
    run.propose(
        {"kind": SUMMARY, "covers": rng.covers, "data": data, "thread": run.thread},
        summary_event,
    )
    if inp.media and run.total > run.limit:
        # the images and documents are the last thing to go: named, not kept
        run.retract()
        data = {**data, "mediaDropped": True}
        summary_event.details["mediaDropped"] = True
        run.propose(
            {"kind": SUMMARY, "covers": rng.covers, "data": data, "thread": run.thread},
            summary_event,
        )
    after = run.total
    if after >= before:
        run.retract()
        run.withdraw(EVIDENCE)
        run.note(
            TIER,
            f"no gain: with the summary the request would need {after:,} tokens, "
            f"not fewer than {before:,}; nothing was written",
            attempted=True,
        )


def _partial_details(run: Run, rng: Range) -> dict[str, Any]:
    """The event's word on a cut inside a turn: which turn, and whether it was complete."""
    if rng.partial is None:
        return {}
    return {
        "partialTurn": rng.partial.start_id,
        "partialTurnComplete": is_complete(run.graph, run.path, rng.partial),
    }


def _inside(path: Path, rng: Range) -> dict[str, Any]:
    """The record's fields for a summary that ends inside a turn."""
    if rng.partial is None or rng.through is None:
        return {}
    return {"partialTurn": rng.partial.start_id, "through": path.line.ids[rng.through]}


def _what(run: Run, rng: Range) -> str:
    """What a summary replaced, in words: whole turns, and — inside a turn — which turn (the
    latest complete one or the one in progress, by its request) and how many of its steps."""
    whole = f"{len(rng.turns)} turn(s)"
    if rng.partial is None or rng.through is None:
        return whole
    path = run.path
    steps = sum(
        1
        for i in range(rng.partial.start + 1, rng.through + 1)
        if run.graph.nodes[path.line.ids[i]].kind == "assistant"
    )
    which = (
        "the latest complete turn"
        if is_complete(run.graph, path, rng.partial)
        else "the turn in progress"
    )
    asked = user_request_texts(run.graph, path, rng.partial)
    quoted = f" ({_quote(asked[0])})" if asked else ""
    return f"{whole} and the first {steps} step(s) of {which}{quoted}"


def _kept(run: Run, rng: Range, requests: int) -> str:
    """What a summary of `rng` leaves as it was, in words: the turns after it, or the steps
    of the turn it cuts in — and the user requests its marker quotes verbatim."""
    turns = turns_of(run.path)
    quoted = f"; the range's {requests} user request(s) verbatim in the marker" if requests else ""
    if rng.partial is None or rng.through is None:
        after = len(turns) - len(rng.turns)
        return f"the latest {after} turn(s) whole{quoted}, and its last assistant message"
    path, graph = run.path, run.graph
    steps = sum(
        1
        for i in range(rng.through + 1, rng.partial.end)
        if graph.nodes[path.line.ids[i]].kind == "assistant"
    )
    which = (
        "the latest complete turn"
        if is_complete(graph, path, rng.partial)
        else "the turn in progress"
    )
    later = len(turns) - rng.partial.index - 1
    rest = f", and the {later} turn(s) after it whole" if later else ""
    return f"the request of {which} and its newest {steps} step(s){rest}{quoted}"


def _quote(text: str, limit: int = 80) -> str:
    line = " ".join(text.split())
    return f"“{line if len(line) <= limit else line[: limit - 1] + '…'}”"


def prepare(run: Run) -> Steps[bool]:
    """Background preparation: write the checkpoint the next Tier 4 would write and keep it in
    memory (`Engine.keep_prepared`); nothing is written. Once per range (a failure included),
    and kept only if, when it is done, the range is still the one the next Tier 4 would take
    — the session is not locked meanwhile, so it may have moved on."""
    rng = summary_range(run)  # the very range the next Tier 4 would take
    if rng is None or not worth_a_call(run, rng)[0]:
        return False
    key = range_key(run, rng, None)
    if not run.engine.claim_preparation(run.session.id, key):
        return False  # prepared (or tried) already for this very range
    try:
        checkpoint, inp = yield from write_checkpoint(
            run, rng, None, Limits.of(run.policy, run.engine.clock)
        )
    except SummaryFailure:
        return False
    run.session.catch_up()
    now = Run(
        run.engine, run.session, run.view, run.spec, run.engine.policy(run.session), run.provider
    )
    current = summary_range(now)
    if current is None or range_key(now, current, None) != key:
        return False  # the session moved on while the summary was written
    run.engine.keep_prepared(run.session.id, key, (checkpoint, inp))
    return True
