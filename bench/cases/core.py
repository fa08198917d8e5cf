"""The engine core's ratios (issue "Engine core"): cold load, warm render, append scaling."""

from __future__ import annotations

import itertools
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from compactd.context.decompose import from_anthropic
from compactd.context.engine import Engine, RenderParams
from compactd.context.importers import load_transcript
from compactd.context.importers.apply import import_session
from compactd.context.render.request import RequestSpec
from compactd.context.session import Library
from compactd.context.store import Store
from compactd.context.turns import turn_node_ids, turns_of
from registry import MEMORY_DIR, TRANSCRIPTS, Context, Measurement, case

BIG = TRANSCRIPTS / "claude-code" / "64da7265-8f07-4967-b79f-0ae374c13330.jsonl"
ANTHROPIC = RenderParams(spec=RequestSpec(format="anthropic"))


def transcript_files() -> list[Path]:
    """The main session file and the sub-agent files its import reads."""
    return [BIG, *sorted((BIG.parent / BIG.stem / "subagents").glob("*.jsonl"))]


@case("cold_load_ratio", target=3.0)
def cold_load_ratio(ctx: Context) -> Measurement:
    """load_transcript + import_session + Library.load of the largest transcript (with its
    sub-agents), against json.loads of every line of the same files."""
    files = transcript_files()
    with ctx.scratch() as root:
        fresh = itertools.count()

        def ours() -> None:
            store = Store(root / f"s{next(fresh)}")
            (imported,) = load_transcript(BIG)
            session = import_session(Library(store), imported)
            Library(Store(store.root)).load(session.id)

        def baseline() -> None:
            for path in files:
                for line in path.read_bytes().splitlines():
                    if line.strip():
                        json.loads(line)

        t = ctx.medians({"import + load": ours, "json.loads of every line": baseline})
    size = sum(p.stat().st_size for p in files)
    return Measurement(
        t["import + load"] / t["json.loads of every line"],
        t,
        f"{len(files)} files, {size / 1e6:.1f} MB",
    )


@case("warm_render_ratio", target=2.0)
def warm_render_ratio(ctx: Context) -> Measurement:
    """rendering the largest transcript's full context again (warm), against json.dumps of the
    rendered request."""
    with ctx.scratch() as root:
        engine = Engine(Store(root))
        (imported,) = load_transcript(BIG)
        sid = import_session(engine.library, imported).id
        request = engine.render(sid, ANTHROPIC).request  # cold: fills the per-node caches
        t = ctx.medians(
            {
                "warm render": lambda: engine.render(sid, ANTHROPIC),
                "json.dumps(request)": lambda: json.dumps(request),
            }
        )
    return Measurement(
        t["warm render"] / t["json.dumps(request)"],
        t,
        f"{len(request['messages'])} messages, {len(json.dumps(request)) / 1e6:.2f} MB of JSON",
    )


@case("append_render_scaling", target=1.5)
def append_render_scaling(ctx: Context) -> Measurement:
    """append one message + render on a 2,000-turn session, against the same on a 200-turn one;
    both show their last 100 turns (a snip hides the rest)."""
    steps = {}
    # the append's fsync costs the same at any length; on tmpfs it does not blur the ratio
    with ctx.scratch(memory=True) as root:
        for turns in (200, 2000):
            engine = Engine(Store(root / str(turns)))
            sid = synthetic(engine, turns, shown=100)
            engine.render(sid, ANTHROPIC)
            steps[f"{turns} turns: append + render"] = _stepper(engine, sid)
        t = ctx.medians(steps)
    note = "data dir on tmpfs (fsync excluded)" if str(root).startswith(MEMORY_DIR) else ""
    return Measurement(t["2000 turns: append + render"] / t["200 turns: append + render"], t, note)


def _turn(k: int) -> list[dict[str, Any]]:
    """One synthetic turn: a request, a tool call with its result, a reply."""
    return [
        {"role": "user", "content": f"request {k}: " + "please look into this " * 8},
        {
            "role": "assistant",
            "content": [
                {"type": "text", "text": f"checking {k} " + "reading the code " * 6},
                {"type": "tool_use", "id": f"t{k}", "name": "Bash", "input": {"cmd": f"ls {k}"}},
            ],
        },
        {
            "role": "user",
            "content": [{"type": "tool_result", "tool_use_id": f"t{k}", "content": "out " * 120}],
        },
        {"role": "assistant", "content": f"done {k} " + "it works now " * 10},
    ]


def synthetic(engine: Engine, turns: int, shown: int) -> str:
    """A new session of `turns` turns whose older ones a snip hides, so `shown` are rendered."""
    session, _created = engine.open(None)
    with session.buffered():
        for k in range(turns):
            session.append(from_anthropic(_turn(k)))
    g = session.graph
    path = g.branch_path()
    old = turns_of(path)[: turns - shown]
    covers = [i for t in old for i in turn_node_ids(g, path, t)]
    session.add_records(
        [{"kind": "snip", "covers": covers, "data": {"turns": [t.start_id for t in old]}}]
    )
    return session.id


def _stepper(engine: Engine, sid: str) -> Callable[[], None]:
    """Append one message (user and assistant by turns), then render."""
    counter = itertools.count()

    def step() -> None:
        k = next(counter)
        msg = {"role": "user" if k % 2 else "assistant", "content": f"more {k}"}
        engine.append(sid, messages=[msg])
        engine.render(sid, ANTHROPIC)

    return step
