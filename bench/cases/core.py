"""The engine core's ratios (issue "Engine core"): cold load, warm render, append scaling."""

from __future__ import annotations

import itertools
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson
from compactd.context.decompose import from_anthropic
from compactd.context.engine import Engine, RenderParams
from compactd.context.importers import load_transcript
from compactd.context.importers.apply import import_session
from compactd.context.render.request import RequestSpec
from compactd.context.session import Library
from compactd.context.stores.files import FileStore
from compactd.context.summarizer.driver import digest_answer, drive
from compactd.context.tokens import Counter, encoding
from compactd.context.turns import turn_node_ids, turns_of
from registry import MEMORY_DIR, TRANSCRIPTS, Context, Measurement, case

BIG = TRANSCRIPTS / "claude-code" / "64da7265-8f07-4967-b79f-0ae374c13330.jsonl"
ANTHROPIC = RenderParams(spec=RequestSpec(format="anthropic"))
COMPACTED = RenderParams(spec=RequestSpec(format="anthropic", window=64_000))


def transcript_files() -> list[Path]:
    """The main session file and the sub-agent files its import reads."""
    return [BIG, *sorted((BIG.parent / BIG.stem / "subagents").glob("*.jsonl"))]


@case("cold_load_ratio", target=3.0)
def cold_load_ratio(ctx: Context) -> Measurement:
    """load_transcript + import_session + Library.load of the largest transcript (with its
    sub-agents) + its first render (tokenizing what is shown, with a fresh token memo),
    against orjson.loads of every line of the same files."""
    files = transcript_files()
    encoding()  # the vocabulary loads once per process, before either
    with ctx.scratch() as root:
        fresh = itertools.count()

        def ours() -> None:
            store = FileStore(root / f"s{next(fresh)}")
            (imported,) = load_transcript(BIG)
            session = import_session(Library(store), imported)
            engine = Engine(FileStore(store.root), counter=Counter())
            engine.render(session.id, ANTHROPIC)

        def baseline() -> None:
            for path in files:
                for line in path.read_bytes().splitlines():
                    if line.strip():
                        orjson.loads(line)

        label = "import + load + first render"
        t = ctx.medians({label: ours, "orjson.loads of every line": baseline})
    size = sum(p.stat().st_size for p in files)
    return Measurement(
        t[label] / t["orjson.loads of every line"],
        t,
        f"{len(files)} files, {size / 1e6:.1f} MB",
    )


@case("warm_render_ratio", target=5.0)
def warm_render_ratio(ctx: Context) -> Measurement:
    """rendering the largest transcript's compacted context again (warm; the cascade ran once
    at a 64K window), against orjson.dumps of the rendered request (what the daemon encodes
    it with)."""
    with ctx.scratch() as root:
        engine = Engine(FileStore(root))
        (imported,) = load_transcript(BIG)
        sid = import_session(engine.library, imported).id
        drive(engine.cascade(sid, COMPACTED), digest_answer)  # compacted, as it is sent
        request = engine.render(sid, COMPACTED).request  # fills the per-node caches
        t = ctx.medians(
            {
                "warm render": lambda: engine.render(sid, COMPACTED),
                "orjson.dumps(request)": lambda: orjson.dumps(request),
            }
        )
    return Measurement(
        t["warm render"] / t["orjson.dumps(request)"],
        t,
        f"{len(request['messages'])} messages, {len(orjson.dumps(request)) / 1e6:.2f} MB of JSON",
    )


@case("append_render_scaling", target=1.5)
def append_render_scaling(ctx: Context) -> Measurement:
    """append one message + render on a 2,000-turn session, against the same on a 200-turn one;
    both show their last 100 turns (a snip hides the rest)."""
    steps = {}
    # the append's fsync costs the same at any length; on tmpfs it does not blur the ratio
    with ctx.scratch(memory=True) as root:
        for turns in (200, 2000):
            engine = Engine(FileStore(root / str(turns)))
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
