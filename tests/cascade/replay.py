"""Replaying a shared transcript step by step under the cascade, checking every render.

A step applies the ops the agent produced up to its next main-thread model call; then the
cascade runs (with the offline `digest` provider, or none) exactly as a client would ask before
that call, and the request it hands back is checked on the wire: it fits, pairing holds, no turn
is split, the active turn's user message is there verbatim, the latest complete turn is whole
unless the rolling summary took it, every record written has its event, and a plain render
afterwards is the same request. Used by the cascade and the summary tests alike.
"""

from __future__ import annotations

import collections
import functools
import tempfile
import time
from pathlib import Path
from typing import Any

import attrs
import orjson
from compactd.context.engine import Engine, RenderParams
from compactd.context.importers import load_transcript
from compactd.context.importers.apply import OpApplier, session_meta, steps
from compactd.context.importers.plan import ImportedSession
from compactd.context.render.request import Rendered, RequestSpec
from compactd.context.stores.files import FileStore
from compactd.context.summarizer.driver import digest_answer, drive
from compactd.context.tokens import MESSAGE_OVERHEAD, Counter
from compactd.context.turns import plan_cuts, turns_of
from compactd.context.visibility import ViewOptions

from tests.cascade.helpers import blocks, check_no_split_turn
from tests.support.invariants import check_anthropic_pairing, server_view

TRANSCRIPTS = Path(__file__).resolve().parents[1] / "data" / "transcripts" / "claude-code"
LARGEST = TRANSCRIPTS / "64da7265-8f07-4967-b79f-0ae374c13330.jsonl"
SMALLER = TRANSCRIPTS / "fe5e1c67-53e7-4862-81ae-d0e013e3270b.jsonl"
CODEX = sorted((TRANSCRIPTS.parent / "more" / "codex").glob("*.jsonl"))  # codex-tui 0.140, 0.142
ALL = [*sorted(TRANSCRIPTS.glob("*.jsonl")), *CODEX]


def short(path: Path) -> str:
    """A transcript's test id: its session id's first eight characters."""
    return (
        path.name.removeprefix("rollout-")[20:28]
        if path.name.startswith("rollout-")
        else path.name[:8]
    )


TIERS = ("reactive", "microcompact", "snip", "collapse", "summary")


@functools.cache
def imported(path: Path) -> ImportedSession:
    (session,) = load_transcript(path)
    return session


@attrs.define
class Stats:
    """What the cascade did over the steps of one thread kind (main thread or sub-agents)."""

    steps: int = 0
    fired: collections.Counter[str] = attrs.Factory(collections.Counter)
    summaries_per_step: list[int] = attrs.Factory(list)
    peak: int = 0

    def fired_text(self) -> str:
        return ", ".join(f"{t} {self.fired[t]}" for t in TIERS if self.fired[t]) or "nothing"


@attrs.define
class ReplayReport(Stats):
    path: Path = Path()
    window: int = 0
    provider: str | None = None
    functions: Stats = attrs.Factory(Stats)
    limit: int = 0
    turns: int = 0
    seconds: float = 0.0

    def line(self) -> str:
        return (
            f"{short(self.path)} window {self.window:,} provider {self.provider}: main "
            f"{self.steps} steps, fired {self.fired_text()}, peak {self.peak:,} of "
            f"{self.limit:,}; sub-agents {self.functions.steps} steps, fired "
            f"{self.functions.fired_text()}, peak {self.functions.peak:,} ({self.seconds:.1f} s)"
        )


class Recount:
    """The request's tokens from its bytes alone, memoized per block (replays resend them)."""

    def __init__(self) -> None:
        self.counter = Counter()
        self.memo: dict[bytes, int] = {}

    def __call__(self, request: dict[str, Any]) -> int:
        assert "system" not in request and "tools" not in request
        total = 0
        for msg in request["messages"]:
            total += MESSAGE_OVERHEAD
            for block in msg["content"]:
                block = {k: v for k, v in block.items() if k != "cache_control"}
                key = orjson.dumps(block)
                hit = self.memo.get(key)
                if hit is None:
                    hit = self.memo[key] = self.counter.block(block)
                total += hit
        return total


def check_step(engine: Engine, sid: str, rendered: Rendered) -> None:
    """The wire checks of one render of the path it was rendered for."""
    g = engine.session(sid).graph
    path = rendered.view.own
    request = rendered.request
    check_anthropic_pairing(request)
    inside = rendered.projection.summary_through
    shown = check_no_split_turn(engine, sid, rendered, path)
    wire_blocks = {orjson.dumps(b) for b in blocks(request)}
    turns = turns_of(path)
    calls = [any(g.nodes[n].calls for n in path.line.ids[t.start : t.end]) for t in turns]
    active = turns[-1]
    first = g.nodes[active.start_id]
    if first.kind == "user" and not first.meta:
        for block in first.content:
            assert orjson.dumps(block) in wire_blocks, "the active turn's request is not verbatim"
    assert shown[-1] or not calls[-1], "the active turn lost its calls"
    taken = rendered.projection.summary_turns | ({inside[0]} if inside else set())
    plan = plan_cuts(g, path, keep_first_turn=False)
    for index, why in plan.reasons.items():
        if why == "latest complete turn" and turns[index].start_id not in taken:
            assert shown[index] or not calls[index], "the latest complete turn lost its calls"


def replay(
    path: Path,
    window: int,
    provider: str | None = "digest",
    *,
    functions: bool = True,
    config: dict[str, Any] | None = None,
) -> ReplayReport:
    """Relive the transcript; before each model call (the main thread's, and with `functions`
    each sub-agent's, rendered for that function as its viewer) run the cascade and check."""
    source = imported(path)
    report = ReplayReport(path=path, window=window, provider=provider)
    started = time.perf_counter()
    recount = Recount()
    with tempfile.TemporaryDirectory(prefix="compactd-replay-test-") as scratch:
        engine = Engine(FileStore(scratch), summary_provider=provider)
        session, _ = engine.open(None, config, meta=session_meta(source))
        applier = OpApplier(session)
        spec = RequestSpec(model=source.model, window=window)
        for step in steps(source):
            with session.buffered():  # one fsync per step, as an agent's appends would come
                for op in step.ops:
                    applier.apply(op)
            if step.call is None:
                continue
            if step.call.thread is None:
                p = RenderParams(view=ViewOptions(), spec=spec)
                stats = report
            elif functions:
                viewer = applier.functions[step.call.thread]
                p = RenderParams(view=ViewOptions(viewer=viewer), spec=spec)
                stats = report.functions
            else:
                continue
            stats.steps += 1
            known = {r.id for r in session.graph.records}
            out = drive(engine.cascade(session.id, p), digest_answer)
            rendered = out.rendered
            # it fits
            assert rendered.total <= rendered.budget.limit, (stats.steps, rendered.total)
            report.limit = rendered.budget.limit
            stats.peak = max(stats.peak, rendered.total)
            # every record written has its applied event, and every applied event its record
            new = {r.id for r in session.graph.records if r.id not in known}
            applied = [e for e in out.events if e.applied]
            assert sorted(new) == sorted(i for e in applied for i in e.record_ids)
            for event in applied:
                assert event.tokens_after <= event.tokens_before or event.tier == "reactive"
                stats.fired[event.tier] += 1
            stats.summaries_per_step.append(sum(1 for e in applied if e.tier == "summary"))
            # nothing changes silently: a plain render is the cascade's request
            again = engine.render(session.id, p)
            assert orjson.dumps(again.request) == orjson.dumps(rendered.request)
            check_step(engine, session.id, rendered)
            if applied:
                assert rendered.estimate == recount(server_view(rendered.request))
        final = engine.render(session.id, RenderParams(view=ViewOptions(), spec=spec))
        assert final.estimate == recount(server_view(final.request))
        report.turns = len(turns_of(session.graph.branch_path()))
    report.seconds = time.perf_counter() - started
    return report


@functools.cache
def replayed(path: Path, window: int, provider: str | None = "digest") -> ReplayReport:
    """One replay per (transcript, window, provider) per test run, shared by the test files."""
    return replay(path, window, provider)
