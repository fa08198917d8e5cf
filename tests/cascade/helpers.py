"""Builders and checks shared by the cascade tests (and the summary tests' engine-level parts).

Sessions are built from plain Anthropic messages, the way an agent sends them, so every test
goes through the same decomposition as a real client. The checks read the wire request (what a
provider would get) and the session log, never a tier's internals, so they judge what a user
of compactd would see.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import orjson
from compactd.context.engine import Engine, RenderParams
from compactd.context.graph import Path, Record
from compactd.context.render.request import Rendered, RequestSpec
from compactd.context.summarizer.driver import digest_answer, drive
from compactd.context.summarizer.types import SummaryFailure, SummaryNeeded, SummaryResult
from compactd.context.tiers.base import Outcome
from compactd.context.tokens import Counter
from compactd.context.turns import turns_of
from compactd.context.visibility import ViewOptions

from tests.engine.helpers import assistant, texts, user  # noqa: F401 (texts re-exported)
from tests.support.invariants import (
    check_anthropic_pairing,
    recount_anthropic,
    server_view,
    strip_cache_control,
)
from tests.support.logs import log_bytes  # noqa: F401 (re-exported)

WINDOW = 32_000  # output reserve 8,000 -> limit 24,000, cascade threshold 21,600, target 12,000
LIMIT = 24_000
THRESHOLD = 21_600
TARGET = 12_000
MODEL = "test-model"  # no family prior: the scenarios are sized in estimated tokens
CONTEXT_KINDS = ("summary", "collapse", "snip", "clear", "reactive")

Answer = Callable[[SummaryNeeded], SummaryResult | SummaryFailure]


# ---- messages --------------------------------------------------------------------------------


def tool_use(use_id: str, name: str = "Read", **inp: Any) -> dict[str, Any]:
    return {"type": "tool_use", "id": use_id, "name": name, "input": inp or {"file_path": use_id}}


def tool_result(use_id: str, content: Any, *, is_error: bool = False) -> dict[str, Any]:
    block: dict[str, Any] = {"type": "tool_result", "tool_use_id": use_id, "content": content}
    if is_error:
        block["is_error"] = True
    return block


def results(*blocks: dict[str, Any]) -> dict[str, Any]:
    return {"role": "user", "content": list(blocks)}


def filler(tag: str, words: int) -> str:
    """Deterministic text, distinct per `tag`: about one token per word."""
    return f"[{tag}] " + " ".join(f"{tag}w{i % 97}" for i in range(words))


def exchange(
    tag: str, calls: Iterable[tuple[str, str]], *, ask: str | None = None, answer: str = "done"
) -> list[dict[str, Any]]:
    """One complete user turn: a request, one assistant message per call (each answered),
    then a closing assistant text. `calls` are (tool name, result text) pairs."""
    msgs = [user(ask if ask is not None else f"request {tag}: please do step {tag}")]
    for i, (name, content) in enumerate(calls):
        use_id = f"toolu_{tag}_{i}"
        msgs.append(assistant(f"calling {name} for {tag}", tool_use(use_id, name)))
        msgs.append(results(tool_result(use_id, content)))
    msgs.append(assistant(f"{answer} {tag}"))
    return msgs


# ---- engine ------------------------------------------------------------------------------------


def params(window: int = WINDOW, **spec: Any) -> RenderParams:
    view_keys = {"branch", "viewer", "callers", "subcalls", "expose"}
    view = ViewOptions(**{k: v for k, v in spec.items() if k in view_keys})
    spec = {k: v for k, v in spec.items() if k not in view_keys}
    spec.setdefault("model", MODEL)
    return RenderParams(view=view, spec=RequestSpec(window=window, **spec))


def open_session(engine: Engine, config: dict[str, Any] | None = None) -> str:
    session, _ = engine.open(None, config)
    return str(session.id)


def cascade(
    engine: Engine,
    sid: str,
    p: RenderParams,
    answer: Answer = digest_answer,
    **kw: Any,
) -> Outcome:
    return drive(engine.cascade(sid, p, **kw), answer)


class Recorder:
    """A summary provider for engine tests: answers with `make(need)` and keeps every request."""

    def __init__(self, make: Answer = digest_answer) -> None:
        self.make = make
        self.needs: list[SummaryNeeded] = []

    def __call__(self, need: SummaryNeeded) -> SummaryResult | SummaryFailure:
        self.needs.append(need)
        return self.make(need)


def records(engine: Engine, sid: str, kind: str | None = None) -> list[Record]:
    return [r for r in engine.session(sid).graph.records if kind is None or r.kind == kind]


def record_by_id(engine: Engine, sid: str, rid: str) -> Record:
    return next(r for r in engine.session(sid).graph.records if r.id == rid)


# ---- wire checks -------------------------------------------------------------------------------


def wire(request: dict[str, Any]) -> bytes:
    """The request's bytes without its cache breakpoints."""
    return orjson.dumps(strip_cache_control(request))


def messages_bytes(request: dict[str, Any]) -> bytes:
    return orjson.dumps(strip_cache_control(request)["messages"])


def common_prefix(a: bytes, b: bytes) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


def blocks(request: dict[str, Any]) -> list[dict[str, Any]]:
    """Every content block of the request, in order, without cache breakpoints."""
    out: list[dict[str, Any]] = []
    for msg in request["messages"]:
        content = msg["content"]
        if isinstance(content, str):
            out.append({"type": "text", "text": content})
            continue
        for block in content:
            out.append({k: v for k, v in block.items() if k != "cache_control"})
    return out


def use_ids(request: dict[str, Any]) -> list[str]:
    return [b["id"] for b in blocks(request) if b.get("type") == "tool_use"]


def result_blocks(request: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {b["tool_use_id"]: b for b in blocks(request) if b.get("type") == "tool_result"}


def check_wire(rendered: Rendered) -> None:
    """Pairing, and the measure is the recount of the bytes the model sees (after the
    provider's server-side clear, by its documented rule, when the request carries one)."""
    check_anthropic_pairing(rendered.request)
    assert rendered.estimate == recount_anthropic(server_view(rendered.request), Counter())
    assert rendered.sent_estimate == recount_anthropic(rendered.request, Counter())


def turn_calls(
    engine: Engine, sid: str, path: Path | None = None, after: str | None = None
) -> list[list[str]]:
    """For each turn of the path (default: the current branch), the tool_use ids its calls
    show on the wire (in the turn holding node `after`, only the calls after it)."""
    g = engine.session(sid).graph
    path = path if path is not None else g.branch_path()
    cut = path.index(after) if after is not None and after in path else -1
    out = []
    for turn in turns_of(path):
        ids = []
        for i in range(turn.start, turn.end):
            if turn.start <= cut < turn.end and i <= cut:
                continue
            for call in g.calls_of(g.nodes[path.line.ids[i]]):
                ids.append(call.tool_use_id if call.kind == "tool" else f"fn_{call.id}")
        out.append(ids)
    return out


def check_no_split_turn(
    engine: Engine, sid: str, rendered: Rendered, path: Path | None = None
) -> list[bool]:
    """Every turn is on the wire whole (all its calls) or not at all — but for the turn a
    rolling summary ends in, whose calls after the cut are all there and none before it;
    says which are shown."""
    inside = rendered.projection.summary_through
    through = inside[1] if inside else None
    path = path if path is not None else rendered.view.own
    shown = set(use_ids(rendered.request))
    out = []
    whole = turn_calls(engine, sid, path)
    for i, calls in enumerate(turn_calls(engine, sid, path, through)):
        present = [c in shown for c in calls]
        assert all(present) or not any(present), f"turn {i} is split: {calls} vs shown"
        hidden = [c for c in whole[i] if c not in calls]
        assert not any(c in shown for c in hidden), f"turn {i} shows calls a summary replaced"
        out.append(bool(calls) and all(present))
    return out


def covered_use_ids(engine: Engine, sid: str, record: Record) -> set[str]:
    """The tool_use ids of the tool nodes a record covers."""
    g = engine.session(sid).graph
    out: set[str] = set()
    for node_id in record.covers:
        node = g.nodes[node_id]
        if node.kind == "tool" and node.tool_use_id:
            out.add(node.tool_use_id)
    return out
