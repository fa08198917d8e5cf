"""Real agent transcripts, imported and rendered: the DESIGN §3 invariants on real data.

Every transcript in `tests/data/transcripts/` is imported through `import_session` (one
fsync), rendered in both formats, reloaded and rendered again; every sub-agent's internals are
visible to its own viewer and nowhere else. Each transcript is also replayed op by op, the
way the agent lived it, rendering before every model call: each request must pair, measure
what it sends, and start with the previous one (prefix stability, no records involved).
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

import orjson
import pytest
from compactd.context.budget_reduction import truncate_result
from compactd.context.engine import Engine
from compactd.context.errors import PendingToolResults
from compactd.context.graph import Graph
from compactd.context.importers import load_transcript
from compactd.context.importers.apply import OpApplier, abandon_open_calls, import_session
from compactd.context.importers.plan import FunctionEnd, ImportedSession, ModelCall
from compactd.context.policy import (
    MAX_TOOL_RESULT_CHARS,
    NO_RESULT_PLACEHOLDER,
    RUNNING_FUNCTION_PLACEHOLDER,
    TRUNCATE_HEAD_CHARS,
    TRUNCATE_TAIL_CHARS,
)
from compactd.context.projection import ABANDON, SUMMARY
from compactd.context.render.request import Rendered
from compactd.context.stores.files import FileStore

from tests.engine.helpers import (
    FORMATS,
    blocks_of,
    check_rendered,
    params,
    stripped,
    texts,
    tool_results,
)
from tests.support.invariants import thinking_sequence

DATA = Path(__file__).resolve().parents[1] / "data" / "transcripts"
TRANSCRIPTS = sorted(
    [
        *(p for p in DATA.glob("*/*") if p.is_file() and p.suffix in (".jsonl", ".traj")),
        *(DATA / "more" / "codex").glob("*.jsonl"),  # the newer Codex rollouts (0.140, 0.142)
    ]
)


@functools.cache
def _imported(path: Path) -> list[ImportedSession]:
    return load_transcript(path)


def _id(path: Path) -> str:
    return f"{path.parent.name}/{path.name[:24]}"


@pytest.fixture(scope="module")
def imported_all(tmp_path_factory: pytest.TempPathFactory) -> dict[Path, tuple[Engine, list[str]]]:
    """Every transcript imported once into one store (tests below only read)."""
    root = tmp_path_factory.mktemp("transcripts")
    engine = Engine(FileStore(root))
    out = {}
    for path in TRANSCRIPTS:
        ids = []
        for imp in _imported(path):
            session = import_session(engine.library, imp)
            engine.sessions[session.id] = session
            ids.append(session.id)
        out[path] = (engine, ids)
    return out


def test_there_are_transcripts_of_every_format() -> None:
    assert {p.parent.name for p in TRANSCRIPTS} == {
        "claude-code",
        "codex",
        "openhands",
        "swe-agent",
    }
    assert len(TRANSCRIPTS) >= 5


def _thread_calls(g: Graph) -> list[str]:
    return [n.id for n in g.nodes.values() if n.kind == "tool"]


@pytest.mark.parametrize("path", TRANSCRIPTS, ids=_id)
def test_every_call_is_paired(
    path: Path, imported_all: dict[Path, tuple[Engine, list[str]]]
) -> None:
    engine, ids = imported_all[path]
    assert ids, "the transcript imported no session"
    for sid in ids:
        g = engine.session(sid).graph
        abandoned = {i for r in g.records if r.kind == ABANDON for i in r.covers}
        uses = [g.nodes[i].tool_use_id for i in _thread_calls(g)]
        assert len(uses) == len(set(uses)), "a tool_use id twice"
        for node_id in _thread_calls(g):
            tool = g.nodes[node_id]
            fn = g.nodes[tool.function] if tool.function else None
            assert tool.answered or node_id in abandoned or (fn and fn.status == "running"), (
                f"{tool.tool_use_id} has no result, no function and was not abandoned"
            )
        # a render never waits on an imported session
        for fmt in FORMATS:
            engine.render(sid, params(fmt))


@pytest.mark.parametrize("path", TRANSCRIPTS, ids=_id)
@pytest.mark.parametrize("fmt", FORMATS)
def test_renders_with_every_invariant(
    path: Path, fmt: str, imported_all: dict[Path, tuple[Engine, list[str]]]
) -> None:
    engine, ids = imported_all[path]
    for sid in ids:
        g = engine.session(sid).graph
        rendered = engine.render(sid, params(fmt))
        check_rendered(rendered, fmt)
        request = rendered.request
        # deterministic, in this engine and in a fresh one reading the log
        assert orjson.dumps(engine.render(sid, params(fmt)).request) == orjson.dumps(request)
        fresh = Engine(FileStore(engine.store.root))
        assert orjson.dumps(fresh.render(sid, params(fmt)).request) == orjson.dumps(request)
        assert fresh.session(sid).report.clean
        # what the agent itself compacted away stands behind its summary; nothing else of the
        # top-level thread is dropped: every user text is there, in order
        compacted = {i for r in g.records if r.kind == SUMMARY for i in r.covers}
        path_ids = [i for i in g.branch_path().ids if i not in compacted]
        user_texts = [
            b["text"]
            for i in path_ids
            if g.nodes[i].kind == "user"
            for b in g.nodes[i].content
            if b["type"] == "text"
        ]
        sent = texts(request)
        it = iter(sent)
        assert all(any(t == s for s in it) for t in user_texts), "a user text is missing"
        if fmt == "anthropic":
            _check_results(g, path_ids, request)
            expected = [
                orjson.dumps(b).decode()
                for i in path_ids
                if g.nodes[i].kind == "assistant"
                for b in g.nodes[i].content
                if b["type"] in ("thinking", "redacted_thinking")
            ]
            assert thinking_sequence(request) == expected
        else:
            assert b'"thinking"' not in orjson.dumps(request)


def _check_results(g: Graph, path_ids: list[str], request: dict[str, Any]) -> None:
    """Every call of the thread is answered by its own result, Budget-Reduced and nothing
    else: the recorded result, a function's output, or the no-result placeholder."""
    got = tool_results(request)
    abandoned = {i for r in g.records if r.kind == ABANDON for i in r.covers}
    trunc = (MAX_TOOL_RESULT_CHARS, TRUNCATE_HEAD_CHARS, TRUNCATE_TAIL_CHARS)
    for i in path_ids:
        for call in g.calls_of(g.nodes[i]):
            fn = g.nodes[call.function] if call.function else call
            use = call.tool_use_id if call.kind == "tool" else f"fn_{call.id}"
            block = got.pop(use)
            if fn.kind == "function" and fn.status == "running":
                assert block["content"] == RUNNING_FUNCTION_PLACEHOLDER
            elif fn.kind == "function":
                assert block["content"] == truncate_result(fn.result, *trunc)
                assert block.get("is_error", False) == (fn.status == "error")
            elif call.id in abandoned or not call.answered:
                assert block["content"] == NO_RESULT_PLACEHOLDER and block["is_error"] is True
            else:
                assert block["content"] == truncate_result(call.result, *trunc)
                assert block.get("is_error", False) == call.is_error
    assert not got, f"results without a call: {sorted(got)}"


@pytest.mark.parametrize("path", TRANSCRIPTS, ids=_id)
def test_function_internals_are_visible_to_their_viewer_only(
    path: Path, imported_all: dict[Path, tuple[Engine, list[str]]]
) -> None:
    engine, ids = imported_all[path]
    for sid in ids:
        g = engine.session(sid).graph
        functions = [n for n in g.nodes.values() if n.kind == "function"]
        top = {fmt: engine.render(sid, params(fmt)).request for fmt in FORMATS}
        for fn in functions:
            inner = [
                b["text"]
                for i in g.function_path(fn.id).ids
                for b in g.nodes[i].content
                if b["type"] == "text" and len(b["text"]) > 40
            ]
            assert g.function_path(fn.id).ids, f"function {fn.name} has no internal thread"
            output = orjson.dumps(fn.result).decode()
            for fmt in FORMATS:
                own = engine.render(sid, params(fmt, viewer=fn.id))
                check_rendered(own, fmt)
                seen = texts(own.request)
                assert inner and all(t in seen for t in inner)
                # expose=io: the caller sees the output, never the rest of the internals
                hidden = [
                    t
                    for t in inner
                    if t not in output and orjson.dumps(t).decode()[1:-1] not in output
                ]
                top_texts = set(texts(top[fmt]))
                assert not [t for t in hidden if t in top_texts]
                with_callers = engine.render(sid, params(fmt, viewer=fn.id, callers=True))
                check_rendered(with_callers, fmt)
                assert len(with_callers.request["messages"]) > len(own.request["messages"])
        if path.parent.name == "claude-code":
            assert functions, "the Claude Code transcripts hold sub-agent runs"


# ---- replay: prefix stability on real sessions -------------------------------------------------


def _prefix(prev: dict[str, Any], new: dict[str, Any]) -> None:
    old, cur = stripped(prev)["messages"], stripped(new)["messages"]
    assert len(cur) >= len(old)
    assert cur[: len(old) - 1] == old[:-1]
    if old:
        last, grown = old[-1], cur[len(old) - 1]
        assert last["role"] == grown["role"]
        assert blocks_of(grown)[: len(blocks_of(last))] == blocks_of(last)
        assert grown.get("tool_calls", [])[: len(last.get("tool_calls", []))] == last.get(
            "tool_calls", []
        )


@pytest.mark.parametrize("path", TRANSCRIPTS, ids=_id)
def test_replay_renders_before_every_model_call(path: Path, tmp_path: Path) -> None:
    engine = Engine(FileStore(tmp_path))
    checked = calls = 0
    for imp in _imported(path):
        session = engine.library.create(None, meta={"source": imp.source_format})
        engine.sessions[session.id] = session
        applier = OpApplier(session)
        prev: dict[tuple[str | None, str], Rendered] = {}
        with session.buffered():  # one fsync at the end: the renders read the graph in memory
            for op in imp.ops:
                if isinstance(op, FunctionEnd):
                    prev.clear()  # a running function's placeholder becomes its output
                if not isinstance(op, ModelCall):
                    applier.apply(op)
                    continue
                viewer = applier.thread(op.thread)
                for fmt in FORMATS:
                    try:
                        rendered = engine.render(sid := session.id, params(fmt, viewer=viewer))
                    except PendingToolResults as err:  # pragma: no cover - a failure report
                        raise AssertionError(f"model call while {err.data} wait") from err
                    calls += 1
                    check_rendered(rendered, fmt, recount=calls % 25 == 0)
                    before = prev.get((viewer, fmt))
                    if before is not None:
                        _prefix(before.request, rendered.request)
                        checked += 1
                    prev[(viewer, fmt)] = rendered
            abandon_open_calls(session)
        del sid
    if any(isinstance(op, ModelCall) for imp in _imported(path) for op in imp.ops):
        assert checked > 0
