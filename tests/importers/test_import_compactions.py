"""A compaction the agent recorded is honoured on import: the session renders as the agent last
saw it — its own summary (and the files Claude Code re-read after it) in place of what it had
let go of, the originals kept — and compactd carries on from there.

The measure is compared with what the agent really sent, in the provider's units as a replay
fits them (recorded prompt ≈ overhead + ratio × compactd's estimate, on the calls before the
first compaction), rendered as the agent sent it (no Budget Reduction: the recorded prompts
held whole results)."""

from __future__ import annotations

from pathlib import Path

import pytest
from compactd.context.engine import Engine, RenderParams
from compactd.context.importers import load_transcript
from compactd.context.importers.apply import OpApplier, import_session, steps
from compactd.context.importers.compaction import IMPORTED
from compactd.context.importers.plan import Compaction, ImportedSession, Messages
from compactd.context.projection import SUMMARY
from compactd.context.replay import ReplayOptions
from compactd.context.replay.driver import NO_MANAGEMENT, recorded_prompt, recorded_units
from compactd.context.stores import FileStore

from tests.support.invariants import check_anthropic_pairing

TRANSCRIPTS = Path(__file__).resolve().parents[1] / "data" / "transcripts"
WITH_COMPACTION = [TRANSCRIPTS / "claude-code/64da7265-8f07-4967-b79f-0ae374c13330.jsonl"]
TOLERANCE = 0.10


def at_last_recorded_call(engine: Engine, imported: ImportedSession, *, honour: bool) -> float:
    """The imported session as it stood when the agent made its last recorded call, measured
    in the provider's units; and that call's recorded prompt size."""
    units = recorded_units(engine, imported, ReplayOptions())
    session = engine.library.create(config=dict(NO_MANAGEMENT))
    engine.sessions[session.id] = session
    applier = OpApplier(session, imported.sent, compactions=honour)
    measured = wanted = 0.0
    for step in steps(imported):
        for op in step.ops:
            applier.apply(op)
        call = step.call
        if call is not None and call.thread is None and call.usage:
            estimate = engine.render_session(session, RenderParams()).estimate
            measured = units.overhead["main"] + units.ratio * estimate
            wanted = recorded_prompt(call.usage)
    return measured / wanted - 1


@pytest.mark.parametrize("path", WITH_COMPACTION, ids=lambda p: p.name[:8])
def test_the_imported_session_measures_what_the_agent_last_sent(tmp_path: Path, path: Path):
    [imported] = load_transcript(path)
    engine = Engine(FileStore(tmp_path))
    off = at_last_recorded_call(engine, imported, honour=True)
    assert abs(off) <= TOLERANCE, f"{off:+.1%} of the last recorded prompt"
    ignored = at_last_recorded_call(engine, imported, honour=False)
    assert ignored > 1.0  # as if no compaction had happened: more than twice what it sent


def test_a_claude_code_compaction_becomes_a_summary_record_inside_its_turn(tmp_path: Path):
    [imported] = load_transcript(WITH_COMPACTION[0])
    [compaction] = [op for op in imported.ops if isinstance(op, Compaction)]
    assert compaction.summary.startswith("This session is being continued")
    assert (
        1 <= len(compaction.restored) <= 5
        and "re-read after the compaction" in compaction.restored[0]
    )
    engine = Engine(FileStore(tmp_path))
    session = import_session(engine.library, imported)
    engine.sessions[session.id] = session
    [record] = [r for r in session.graph.records if r.kind == SUMMARY]
    assert record.data["provider"] == IMPORTED and record.data["imported"] == "claude-code"
    # compacted mid-task: the record ends inside the turn that was going on
    turn_request = session.graph.nodes[record.data["partialTurn"]]
    assert "Conversation flow diagrams" in str(turn_request.content)
    assert set(record.covers) <= set(session.graph.nodes)  # the originals are all kept
    sent = sum(len(op.messages) for op in imported.ops if isinstance(op, Messages))
    assert len(record.covers) < len(session.graph.nodes) <= sent * 40
    rendered = engine.render_session(session, RenderParams())
    check_anthropic_pairing(rendered.request)
    text = str(rendered.request["messages"])
    assert "This session is being continued" in text
    # the request of the turn in progress comes first, verbatim; the turns before it are
    # behind the summary
    assert "Conversation flow diagrams" in str(rendered.request["messages"][0]["content"])


def test_compactd_carries_on_from_the_imported_summary(tmp_path: Path):
    """A later summary folds the agent's in as its prior: the cascade at a small window
    summarizes with the digest, and the request fits with pairing intact."""
    from compactd.context.render.request import RequestSpec
    from compactd.context.summarizer.driver import digest_answer, drive

    [imported] = load_transcript(WITH_COMPACTION[0])
    engine = Engine(FileStore(tmp_path), summary_provider="digest")
    session = import_session(engine.library, imported)
    engine.sessions[session.id] = session
    params = RenderParams(spec=RequestSpec(window=48_000))
    outcome = drive(engine.cascade(session.id, params), digest_answer)
    assert outcome.rendered.total <= outcome.rendered.budget.limit
    check_anthropic_pairing(outcome.rendered.request)


def test_a_codex_compaction_keeps_its_summary_and_the_users_messages(tmp_path: Path):
    """No public rollout with a `compacted` record was found, so the real one is cut in code:
    half-way through its tool calls Codex compacts, as its local compaction writes it (the
    summary, and a replacement history of the user's messages followed by the summary)."""
    import orjson

    rollout = next((TRANSCRIPTS / "codex").glob("rollout-*.jsonl"))
    lines = [orjson.loads(raw) for raw in rollout.read_bytes().splitlines() if raw.strip()]
    outputs = [
        i
        for i, line in enumerate(lines)
        if line["type"] == "response_item" and line["payload"].get("type") == "function_call_output"
    ]
    cut = outputs[len(outputs) // 2] + 1
    users = [
        line["payload"]
        for line in lines[:cut]
        if line["type"] == "response_item"
        and line["payload"].get("type") == "message"
        and line["payload"].get("role") == "user"
        and not line["payload"]["content"][0]["text"].startswith("<")
    ]
    summary = "Summary so far: the agent read the parser of the viewer and ran its tests."
    handoff = {"type": "input_text", "text": f"Another model worked on this.\n{summary}"}
    compacted = {
        "timestamp": lines[cut - 1]["timestamp"],
        "type": "compacted",
        "payload": {
            "message": summary,
            "replacement_history": [
                *users,
                {"type": "message", "role": "user", "content": [handoff]},
            ],
        },
    }
    cut_file = tmp_path / rollout.name
    cut_file.write_bytes(
        b"\n".join(orjson.dumps(line) for line in [*lines[:cut], compacted, *lines[cut:]])
    )
    [imported] = load_transcript(cut_file)
    [compaction] = [op for op in imported.ops if isinstance(op, Compaction)]
    asked = [b["text"] for u in users for b in u["content"]]
    assert compaction.summary == summary and compaction.user_requests == asked
    engine = Engine(FileStore(tmp_path / "store"))
    session = import_session(engine.library, imported)
    engine.sessions[session.id] = session
    [record] = [r for r in session.graph.records if r.kind == SUMMARY]
    assert record.data["imported"] == "codex"
    rendered = engine.render_session(session, RenderParams())
    check_anthropic_pairing(rendered.request)
    text = str(rendered.request["messages"])
    assert summary in text and all(request[:60] in text for request in asked)
    [plain] = load_transcript(rollout)
    whole = import_session(engine.library, plain)
    engine.sessions[whole.id] = whole
    assert rendered.total < engine.render_session(whole, RenderParams()).total
