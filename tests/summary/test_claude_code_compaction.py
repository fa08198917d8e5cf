"""Our rolling summary against Claude Code's own, on the shared session 64da7265 whose real
compaction call is recorded.

The importer keeps that call as a `claude_code_compaction_call` note (its `parentUuid` names
the last message of the conversation it summarized) just before the `compact_boundary` note.
We relive the session up to that point, every request sent whole as Claude Code did, and
compact there. What the call received is read from the raw JSONL
independently of the importer: every main-thread line before the boundary.
"""

from __future__ import annotations

import functools
from typing import Any

import orjson
import pytest
from compactd.context.engine import Engine, RenderParams
from compactd.context.importers.apply import OpApplier, session_meta, steps
from compactd.context.importers.plan import Note
from compactd.context.render.request import RequestSpec
from compactd.context.stores.files import FileStore
from compactd.context.summarizer.driver import drive
from compactd.context.visibility import ViewOptions

from tests.cascade.helpers import Recorder, blocks, texts
from tests.cascade.replay import LARGEST, imported

pytestmark = pytest.mark.slow
SPILLED = LARGEST.with_suffix("") / "tool-results"


def text_of(content: Any) -> str:
    """A result's text as our summarizer input shows it (`summary._text_of`'s rule)."""
    if isinstance(content, str):
        return content
    parts = []
    for block in content:
        kind = block.get("type")
        parts.append(block["text"] if kind == "text" else f"[{kind}]")
    return "\n".join(parts)


@functools.cache
def received() -> tuple[list[str], dict[str, str], int]:
    """The user requests and tool results Claude Code's compaction call received, and the
    prompt size it reported (preTokens)."""
    note = next(
        op
        for op in imported(LARGEST).ops
        if isinstance(op, Note) and op.kind == "claude_code_compaction_call"
    )
    boundary = next(
        op
        for op in imported(LARGEST).ops
        if isinstance(op, Note) and op.kind == "claude_code_compact_boundary"
    )
    lines = [orjson.loads(raw) for raw in LARGEST.read_bytes().splitlines() if raw.strip()]
    end = next(
        i
        for i, line in enumerate(lines)
        if line.get("type") == "system" and line.get("subtype") == "compact_boundary"
    )
    # the main thread as Claude Code held it when it compacted: every line before the
    # boundary (parallel tool results hang off different parents, so a walk up `parentUuid`
    # from the call's parent would miss some); the call's parent is among them
    chain = [line for line in lines[:end] if not line.get("isSidechain")]
    assert note.data["parentUuid"] in {line.get("uuid") for line in chain}
    requests: list[str] = []
    results: dict[str, str] = {}
    for line in chain:
        if line["type"] != "user" or line.get("isMeta") or line.get("isCompactSummary"):
            continue
        content = line["message"]["content"]
        if isinstance(content, str):
            requests.append(content)
            continue
        for block in content:
            if block.get("type") == "tool_result":
                text = text_of(block.get("content", ""))
                if "<persisted-output>" in text:
                    # Claude Code showed a preview and kept the output next to the session;
                    # the importer (and so our summary) uses that full output
                    spilled = SPILLED / f"{block['tool_use_id']}.txt"
                    text = spilled.read_bytes().decode("utf-8", errors="replace")
                results[block["tool_use_id"]] = text
            elif block.get("type") == "text":
                requests.append(block["text"])
    return requests, results, boundary.data["compactMetadata"]["preTokens"]


Compacted = tuple[str, dict[str, Any], list[dict[str, Any]]]


@pytest.fixture(scope="module")
def compacted(tmp_path_factory: pytest.TempPathFactory) -> Compacted:
    """Our summary input, the request after our compaction, and the summary's events."""
    source = imported(LARGEST)
    note = next(
        op for op in source.ops if isinstance(op, Note) and op.kind == "claude_code_compaction_call"
    )
    engine = Engine(FileStore(tmp_path_factory.mktemp("cc")), summary_provider="digest")
    session, _ = engine.open(None, meta=session_meta(source))
    applier = OpApplier(session)
    p = RenderParams(view=ViewOptions(), spec=RequestSpec(model=source.model, window=200_000))
    last: tuple[Any, int] | None = None
    for step in steps(source):
        if note in step.ops:
            for op in step.ops[: step.ops.index(note)]:
                applier.apply(op)
            break
        for op in step.ops:
            applier.apply(op)
        if step.call is not None and step.call.thread is None:
            # as Claude Code did up to here: every request sent whole, nothing compacted
            last = (step.call, engine.render(session.id, p).estimate)
    assert last is not None
    # the client reports what the provider counted for its last request (Claude Code's
    # system prompt and tools are not in our request, so the ratio is large: clamped at 2.5)
    engine.record_usage(session.id, source.model or "", last[0].usage, estimated=last[1])
    calibrated = engine.render(session.id, p).total
    # a window our request fills as much as Claude Code's filled its 200K when it compacted
    _, _, pre_tokens = received()
    window = int(calibrated / (pre_tokens / 200_000))
    at_share = RenderParams(view=ViewOptions(), spec=RequestSpec(model=source.model, window=window))
    recorder = Recorder()
    out = drive(engine.cascade(session.id, at_share, manual=True), recorder)
    prompt = "\n".join(need.request.prompt for need in recorder.needs)
    return prompt, out.rendered.request, out.events


def test_the_recorded_call_is_where_the_boundary_is() -> None:
    requests, results, pre_tokens = received()
    assert pre_tokens == 165_763
    assert len(requests) == 3 and len(results) == 91
    assert requests[0].startswith("Implement the following plan:")


def test_our_summary_input_carries_every_request_and_result_that_call_received(
    compacted: Compacted,
) -> None:
    requests, results, _ = received()
    prompt, final, events = compacted
    (summary,) = [e for e in events if e.tier == "summary"]
    assert summary.applied
    final_texts = texts(final)
    final_results = {b["tool_use_id"]: b for b in blocks(final) if b.get("type") == "tool_result"}

    # every request: replaced ones are in our input; the latest complete turn's and the
    # active turn's stay verbatim
    in_input = [r for r in requests if f"USER: {r}" in prompt]
    kept = [r for r in requests if r in final_texts]
    assert in_input == requests[:1] and kept == requests[1:]

    # every result: in our input (Budget Reduction keeps its head and tail) or still shown
    summarized, retained = set(), set()
    for use_id, text in results.items():
        if f"TOOL RESULT ({use_id})" in prompt:
            summarized.add(use_id)
            if len(text) > 4000:
                assert text[:2400] in prompt and text[-1600:] in prompt, use_id
            else:
                assert f"TOOL RESULT ({use_id}): {text}" in prompt or (
                    f"TOOL RESULT ({use_id}) [error]: {text}" in prompt
                ), use_id
        else:
            assert use_id in final_results, f"{use_id} was neither summarized nor kept"
            retained.add(use_id)
    assert len(summarized) >= 20 and len(retained) >= 20
    # and nothing we summarized or kept is something that call did not receive
    ours = {
        line.split(")", 1)[0].removeprefix("TOOL RESULT (")
        for line in prompt.splitlines()
        if line.startswith("TOOL RESULT (")
    }
    assert ours == summarized
    assert set(final_results) == retained
