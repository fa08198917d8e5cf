"""Tier 4 — the rolling summary (spec "Current rolling-summary constraints", DESIGN §5).

- The replaceable range is a prefix of whole top-level turns, priced with its visible
  subcalls. The latest `summary_keep_turns` (2) complete turns and the active turn stay; if
  that still leaves the request over budget, only the latest turn stays. A turn holding a
  running function is never replaced; a collapse segment is never split.
- The input starts at the range's first message and holds the prior summary that applies to
  this branch, every original user request (also of snipped turns) and every visible tool
  result as rendered. The record's `covers` and the input describe the same range.
- A range longer than one summarizer call is summarized in budgeted chunks that fold a
  rolling summary; a provider overflow retries with smaller chunks; calls are bounded.
- After generation the replacement is tried in memory and kept only if the request gets
  strictly smaller; otherwise (or on failure, cancellation, an empty summary) nothing is
  written. One rolling summary is in force per branch: the newest applicable one, which folds
  the previous one in. HEAD never moves.
- The marker keeps every user request of the range verbatim and the latest assistant text
  (the checkpoint rules), whatever the provider wrote.
"""

from __future__ import annotations

import hashlib
from collections.abc import Generator
from typing import TYPE_CHECKING, Any

import attrs
import orjson

from .graph import Graph, Path
from .projection import SUMMARY, Projection
from .render.conversation import Conversation
from .summarize import SummaryFailure, SummaryRequest, SummaryResult
from .tokens import Counter
from .tool_aging.truncate import middle_truncate
from .turns import Turn, plan_cuts, turn_node_ids, turns_of

if TYPE_CHECKING:
    from .cascade import Run, SummaryNeeded

TIER = "summary"
MIN_CHUNK_TOKENS = 2000
LINE_PIECE_TOKENS = MIN_CHUNK_TOKENS * 3 // 4  # a chunk of the smallest size takes any piece
TOOL_INPUT_CHARS = 2000  # tool inputs in summarizer input are middle-truncated like results

CHECKPOINT_PROMPT = """\
You write the handoff checkpoint of a long-running coding-agent session. The agent will \
continue from your checkpoint alone, with no access to the messages it replaces, so anything \
you leave out is lost. Write plain text under these headings:

Goal — what the user wants overall, in their words where possible.
User constraints and preferences — every instruction, rule and preference the user gave, \
each one; never generalize them away.
Decisions — what was decided and why.
Files — every file read, created or changed, with its current state.
Errors — errors met, and how each was resolved (or that it was not).
Done — what has been completed.
Remaining — what is left, and the very next step.

If a previous checkpoint is given, fold it in: keep everything in it that is still true. Do \
not call tools. Do not address the user."""

CHUNK_NOTE = (
    "This is part {part} of {parts} of the conversation being replaced; fold it into the "
    "previous checkpoint and write the updated checkpoint."
)


@attrs.frozen
class Range:
    turns: list[Turn]  # every turn replaced, oldest first
    new_turns: list[Turn]  # those not already under the prior summary
    covers: list[str]


@attrs.frozen
class SummaryInput:
    lines: list[str]
    line_tokens: list[int]
    items: list[dict[str, Any]]
    user_requests: list[str]
    last_assistant: str | None
    prior_text: str | None
    digest: str  # hash of the whole input (the source prefix)
    continued: list[bool] = attrs.field(factory=list)  # a piece of the line before it

    @property
    def tokens(self) -> int:
        return sum(self.line_tokens)

    def text(self, lo: int = 0, hi: int | None = None) -> str:
        """Lines `lo`..`hi` as one text (pieces of a split line join back seamlessly)."""
        hi = len(self.lines) if hi is None else hi
        out: list[str] = []
        for i in range(lo, hi):
            if out and not (self.continued and self.continued[i]):
                out.append("\n")
            out.append(self.lines[i])
        return "".join(out)


class SummaryFailed(Exception):
    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


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
    # never split a collapse segment
    for rec in {id(r): r for r in proj.collapsed.values()}.values():
        indexes = [t.index for t in turns if t.start_id in rec.data.get("turns", [])]
        if indexes and min(indexes) < boundary <= max(indexes):
            boundary = min(indexes)
    chosen = turns[:boundary]
    if not chosen:
        return None
    new = [t for t in chosen if t.start_id not in proj.summary_turns]
    covers: list[str] = []
    for turn in chosen:
        covers.extend(turn_node_ids(graph, path, turn))
    return Range(chosen, new, covers)


def range_cost(conv: Conversation, rng: Range, proj: Projection) -> int:
    """Tokens the range costs in the current request (its turns, markers and prior summary)."""
    indexes = {t.index for t in rng.turns}
    return sum(m.tokens for m in conv.messages if m.turn in indexes)


# ---- the input ------------------------------------------------------------------------------


def _text_of(content: Any) -> str:
    if isinstance(content, str):
        return content
    out = []
    for block in content or []:
        if block.get("type") == "text":
            out.append(block["text"])
        else:
            out.append(f"[{block.get('type', 'content')}]")
    return "\n".join(out)


def user_request_texts(graph: Graph, path: Path, turn: Turn) -> list[str]:
    """The human's own words in a turn (meta content excluded)."""
    out = []
    for node_id in path.line.ids[turn.start : turn.end]:
        node = graph.nodes[node_id]
        if node.kind == "user" and not node.meta:
            text = _text_of(node.content).strip()
            if text:
                out.append(text)
    return out


def build_input(
    graph: Graph, path: Path, proj: Projection, conv: Conversation, rng: Range, counter: Counter
) -> SummaryInput:
    """The summarizer's input: the range from its first message, as rendered."""
    lines: list[str] = []
    items: list[dict[str, Any]] = []
    requests: list[str] = []
    last_assistant: str | None = None
    prior_text: str | None = None
    if proj.summary is not None and any(t.start_id in proj.summary_turns for t in rng.turns):
        prior_text = proj.summary.data.get("text", "")
        requests.extend(proj.summary.data.get("userRequests", []))
        lines.append(f"<previous_checkpoint>\n{prior_text}\n</previous_checkpoint>")
        items.append({"type": "summary", "text": prior_text})
    by_turn: dict[int, list[Any]] = {}
    for msg in conv.messages:
        if msg.turn >= 0:
            by_turn.setdefault(msg.turn, []).append(msg)
    shown_collapses: set[str] = set()
    for turn in rng.new_turns:
        asked = user_request_texts(graph, path, turn)
        requests.extend(asked)
        collapse = proj.collapsed.get(turn.start_id)
        if turn.start_id in proj.snipped:
            for text in asked:
                lines.append(f"USER: {text}")
                items.append({"type": "user", "text": text})
            lines.append("[the work of this turn was removed earlier to fit the window]")
            continue
        if collapse is not None:
            for text in asked:
                lines.append(f"USER: {text}")
                items.append({"type": "user", "text": text})
            if collapse.id not in shown_collapses:
                shown_collapses.add(collapse.id)
                text = collapse.data.get("text", "")
                lines.append(f"<segment_summary>\n{text}\n</segment_summary>")
                items.append({"type": "summary", "text": text})
            continue
        for msg in by_turn.get(turn.index, []):
            if msg.kind != "turn":
                continue
            for part in msg.parts:
                last_assistant = _describe(
                    graph, msg.role, part.block, lines, items, last_assistant
                )
    digest = hashlib.sha256("\n".join(lines).encode()).hexdigest()
    pieces = [(i > 0, p) for line in lines for i, p in enumerate(_split_line(line, counter))]
    return SummaryInput(
        [p for _, (p, _) in pieces],
        [t for _, (_, t) in pieces],
        items,
        requests,
        last_assistant,
        prior_text,
        digest,
        [cont for cont, _ in pieces],
    )


def _split_line(line: str, counter: Counter) -> list[tuple[str, int]]:
    """A line longer than `LINE_PIECE_TOKENS` (one huge message) in pieces, so chunking —
    and a retry with smaller chunks — can always make progress."""
    tokens = counter.text(line)
    if tokens <= LINE_PIECE_TOKENS:
        return [(line, tokens)]
    parts = -(-tokens // LINE_PIECE_TOKENS)
    size = -(-len(line) // parts)
    return [
        (line[i : i + size], counter.text(line[i : i + size])) for i in range(0, len(line), size)
    ]


def _describe(
    graph: Graph,
    role: str,
    block: dict[str, Any],
    lines: list[str],
    items: list[dict[str, Any]],
    last_assistant: str | None,
) -> str | None:
    kind = block.get("type")
    if kind == "text":
        text = block["text"]
        if role == "user":
            lines.append(f"USER: {text}")
            items.append({"type": "user", "text": text})
        else:
            lines.append(f"ASSISTANT: {text}")
            items.append({"type": "assistant", "text": text})
            return text
    elif kind == "tool_use":
        args = middle_truncate(
            orjson.dumps(block["input"]).decode(),
            TOOL_INPUT_CHARS,
            TOOL_INPUT_CHARS * 6 // 10,
            TOOL_INPUT_CHARS * 4 // 10,
        )
        lines.append(f"TOOL CALL {block['name']} ({block['id']}): {args}")
        items.append(
            {"type": "tool", "id": block["id"], "name": block["name"], "input": block["input"]}
        )
    elif kind == "tool_result":
        flag = " [error]" if block.get("is_error") else ""
        text = _text_of(block.get("content"))
        lines.append(f"TOOL RESULT ({block['tool_use_id']}){flag}: {text}")
        for item in reversed(items):
            if item.get("type") == "tool" and item.get("id") == block["tool_use_id"]:
                item["isError"] = bool(block.get("is_error"))
                item["resultChars"] = len(text)
                break
    elif kind in ("image", "document"):
        lines.append(f"{role.upper()}: [{kind}]")
    return last_assistant


def chunk_lines(inp: SummaryInput, budget: int, start: int = 0) -> list[tuple[int, int]]:
    """Half-open line ranges of at most `budget` tokens each (a longer line goes alone)."""
    chunks: list[tuple[int, int]] = []
    i = start
    n = len(inp.lines)
    while i < n:
        j, used = i, 0
        while j < n and (j == i or used + inp.line_tokens[j] <= budget):
            used += inp.line_tokens[j]
            j += 1
        chunks.append((i, j))
        i = j
    return chunks


def summary_budget(run: Run) -> int:
    """How long the summary may be: `summaryMaxTokens` (the spec's 2,000–5,000), but never
    more than a tenth of what the request may hold — a 5K summary would crowd a 32K window."""
    return max(500, min(run.policy.summary_max_tokens, run.limit // 10))


def system_prompt(instructions: str | None) -> str:
    if instructions:
        return (
            CHECKPOINT_PROMPT + "\n\nThe user asked for this compaction with these "
            f"instructions — follow them:\n{instructions}"
        )
    return CHECKPOINT_PROMPT


# ---- generation -----------------------------------------------------------------------------


def generate(
    run: Run,
    inp: SummaryInput,
    *,
    purpose: str,
    system: str,
    max_output: int,
    model: str | None,
) -> Generator[SummaryNeeded, SummaryResult | SummaryFailure, tuple[str, dict[str, Any]]]:
    """Summarize `inp` in budgeted chunks folding a rolling summary; a provider overflow
    retries with smaller chunks. Raises `SummaryFailed` (nothing is written then)."""
    from .cascade import SummaryNeeded

    policy = run.policy
    budget = max(MIN_CHUNK_TOKENS, policy.summary_input_max_tokens)
    rolling: str | None = None
    calls = 0
    usage = {"calls": 0, "inputTokens": 0, "outputTokens": 0, "model": model}
    position = 0
    chunks = chunk_lines(inp, budget)
    while position < len(inp.lines):
        lo, hi = next(c for c in chunks if c[0] == position)
        if calls >= policy.summary_max_calls:
            raise SummaryFailed(f"the summary needed more than {policy.summary_max_calls} calls")
        parts_total = max(1, len(chunks))
        body = inp.text(lo, hi)
        prompt = body
        if rolling is not None:
            prompt = f"<previous_checkpoint>\n{rolling}\n</previous_checkpoint>\n\n{body}"
        if parts_total > 1:
            prompt = (
                CHUNK_NOTE.format(part=chunks.index((lo, hi)) + 1, parts=parts_total)
                + "\n\n"
                + prompt
            )
        whole = lo == 0 and hi == len(inp.lines)
        request = SummaryRequest(
            purpose=purpose,
            system=system,
            prompt=prompt,
            max_output_tokens=max_output,
            model=model,
            input_tokens_estimate=sum(inp.line_tokens[lo:hi]),
            items=tuple(inp.items) if whole else (),
            input_hash=inp.digest,
        )
        if not whole:
            request = attrs.evolve(request, items=tuple(_chunk_items(inp, lo, hi, rolling)))
        answer = yield SummaryNeeded(purpose, request)
        calls += 1
        usage["calls"] = calls
        if isinstance(answer, SummaryFailure):
            sent = sum(inp.line_tokens[lo:hi])
            if (
                answer.kind in ("prompt_too_long", "too_large")
                and min(budget, sent) > MIN_CHUNK_TOKENS
            ):
                # halve what was actually sent: halving a budget the chunk did not fill would
                # send the very same prompt again
                budget = max(MIN_CHUNK_TOKENS, min(budget, sent) // 2)
                chunks = chunks[: chunks.index((lo, hi))] + chunk_lines(inp, budget, lo)
                continue
            raise SummaryFailed(f"the {purpose} summary failed: {answer}")
        if not answer.text.strip():
            raise SummaryFailed("the provider returned an empty summary")
        usage["inputTokens"] += answer.input_tokens
        usage["outputTokens"] += answer.output_tokens
        usage["model"] = answer.model
        rolling = answer.text.strip()
        position = hi
    return rolling or "", usage


def _chunk_items(inp: SummaryInput, lo: int, hi: int, rolling: str | None) -> list[dict[str, Any]]:
    """Items of one chunk, for the digest provider (approximate: by proportion)."""
    n = max(1, len(inp.lines))
    a, b = lo * len(inp.items) // n, hi * len(inp.items) // n
    out = list(inp.items[a:b])
    if rolling is not None:
        out.insert(0, {"type": "summary", "text": rolling})
    return out


# ---- the tier ---------------------------------------------------------------------------------


def generate_checkpoint(
    run: Run, inp: SummaryInput, instructions: str | None
) -> Generator[SummaryNeeded, SummaryResult | SummaryFailure, tuple[str, dict[str, Any]]]:
    """The rolling summary of `inp`, written the one way Tier 4 and background preparation
    both use (same prompt, budget and model, so a prepared one is what Tier 4 would write)."""
    return (
        yield from generate(
            run,
            inp,
            purpose="rolling",
            system=system_prompt(instructions),
            max_output=summary_budget(run),
            model=run.policy.summary_model or None,
        )
    )


def choose_range(run: Run) -> Range | None:
    """The range Tier 4 replaces: before the latest `summaryKeepTurns` complete turns; when
    that still leaves the request over its threshold, before the latest complete turn only
    (the spec's "retain the latest turn" — the latest complete user turn is always kept). With
    nothing to summarize, short history under the threshold is left alone."""
    policy, proj = run.policy, run.rendered.projection
    rng = select_replaceable_range(run.graph, run.path, proj, policy.summary_keep_turns)
    cost = range_cost(run.rendered.conversation, rng, proj) if rng and rng.new_turns else 0
    cost = round(cost * run.rendered.ratio)  # calibrated, like run.total
    estimate = run.total - cost + min(policy.summary_max_tokens, max(1, cost // 4))
    if estimate > run.threshold:
        wider = select_replaceable_range(run.graph, run.path, proj, 1)
        if (
            wider is not None
            and wider.new_turns
            and (rng is None or len(wider.turns) > len(rng.turns))
        ):
            rng = wider
    return rng if rng is not None and rng.new_turns else None


def run(
    run: Run, *, manual: bool, instructions: str | None
) -> Generator[SummaryNeeded, SummaryResult | SummaryFailure, None]:
    policy = run.policy
    if run.provider is None:
        run.note(
            TIER,
            "no summary provider is configured (COMPACTD_SUMMARY_PROVIDER or the "
            "session's summaryProvider); the LLM tiers were skipped",
        )
        return
    proj = run.rendered.projection
    rng = choose_range(run)
    if rng is None:
        run.note(
            TIER,
            "short history: nothing before the retained turns to summarize; the "
            "provider was not called",
        )
        return
    inp = build_input(run.graph, run.path, proj, run.rendered.conversation, rng, run.engine.counter)
    model = policy.summary_model or None
    prepared = run.engine.prepared_summary(run.session.id, inp.digest, model)
    try:
        if prepared is not None:
            text, usage = prepared.text, {"calls": 0, "reused": True, "model": prepared.model}
        else:
            text, usage = yield from generate_checkpoint(run, inp, instructions)
    except SummaryFailed as failed:
        run.note(TIER, f"{failed.reason}; nothing was written", failed=True)
        return
    data: dict[str, Any] = {
        "text": text,
        "turns": [t.start_id for t in rng.turns],
        "userRequests": inp.user_requests,
        "lastAssistant": inp.last_assistant,
        "provider": run.provider,
        "inputHash": inp.digest,
        "inputTokens": inp.tokens,
        "usage": usage,
    }
    if proj.summary is not None:
        data["prior"] = proj.summary.id
    if instructions:
        data["instructions"] = instructions
    before = run.total
    run.propose(
        {"kind": SUMMARY, "covers": rng.covers, "data": data, "thread": run.thread},
        {
            "tier": TIER,
            "reason": ("/compact" if manual else "over threshold after the cheaper tiers")
            + f": summarized {len(rng.turns)} turn(s)",
            "recordIds": [],
            "details": {
                "coveredTurns": len(rng.turns),
                "provider": run.provider,
                "calls": usage.get("calls", 0),
                "inputTokens": usage.get("inputTokens", 0),
                "outputTokens": usage.get("outputTokens", 0),
                "reused": prepared is not None,
                "manual": manual,
            },
        },
    )
    after = run.total
    if after >= before:
        run.retract()
        run.note(
            TIER,
            f"no gain: with the summary the request would need {after:,} tokens, "
            f"not fewer than {before:,}; nothing was written",
        )


def prepare(run: Run) -> Generator[SummaryNeeded, SummaryResult | SummaryFailure, bool]:
    """Background preparation: summarize the range the next Tier 4 would replace and keep the
    result in memory (`Engine.keep_prepared`); nothing is written."""
    policy = run.policy
    proj = run.rendered.projection
    rng = choose_range(run)  # the very range the next Tier 4 would take
    if rng is None:
        return False
    inp = build_input(run.graph, run.path, proj, run.rendered.conversation, rng, run.engine.counter)
    model = policy.summary_model or None
    if run.engine.has_prepared(run.session.id, inp.digest, model):
        return False  # already prepared for this very range (a stale one is replaced below)
    try:
        text, usage = yield from generate_checkpoint(run, inp, None)
    except SummaryFailed:
        return False
    run.engine.keep_prepared(
        run.session.id,
        inp.digest,
        model,
        SummaryResult(text=text, model=str(usage.get("model") or "")),
    )
    return True
