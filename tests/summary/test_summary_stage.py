"""The summary stage of the spec's final table, through the daemon and the fake Messages server:
tool evidence before the checkpoint, images kept after it, instructions honoured by a prepared
summary, preparation that never blocks, one time bound, a size floor, fallback models, and
Snip leaving a running function's turns alone."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
from compactd.clients.client import CompactdClient
from compactd.context.engine import Engine
from compactd.context.stores.files import FileStore
from compactd.context.summarizer.driver import digest_answer, drive
from compactd.context.summarizer.types import SummaryFailure, SummaryNeeded, SummaryResult

from tests.cascade.helpers import (
    Recorder,
    assistant,
    cascade,
    filler,
    params,
    results,
    tool_result,
    tool_use,
    user,
)
from tests.cascade.helpers import open_session as open_engine_session
from tests.cascade.helpers import records as engine_records
from tests.summary.conftest import spawn_daemon
from tests.summary.helpers import (
    WINDOW,
    agree,
    big_result,
    open_session,
    prompts,
    records,
    sixteen,
    systems,
    turn,
)
from tests.summary.test_prepare import IDLE, prepared_session
from tests.support.fake_anthropic import DEFAULT_ANSWER, FakeAnthropic, Reply

# tool evidence as its own stage (it rides in the checkpoint's call when the range fits one)
EVIDENCE = {"evidenceEnabled": True, "evidenceFold": False}
PNG = {"type": "base64", "media_type": "image/png", "data": "iVBORw0KGgoAAAANSUhEUg=="}


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def patient(
    fake_server: FakeAnthropic, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[CompactdClient]:
    """A daemon whose provider waits for the fake as long as it takes: a held summary stays
    in flight until the test releases it. A call that blocks behind one fails by the client's
    60 s timeout, never by a timed assertion."""
    data: Path = tmp_path_factory.mktemp("patient-daemon")
    client = await spawn_daemon(fake_server, data, summarize_timeout=120, timeout=60)
    yield client
    await client.close()


async def arrived(gate: Any) -> None:
    assert await asyncio.to_thread(gate.arrived.wait, 20), "the summary request never came"


# ---- tool evidence ---------------------------------------------------------------------------


def failing_turn(tag: str) -> list[dict[str, Any]]:
    """A turn whose long tool result is an error."""
    use_id = f"toolu_{tag}"
    return [
        user(f"Request {tag}: run the test suite of module {tag}."),
        assistant(f"Running the tests of {tag}.", tool_use(use_id, "Bash", command="pytest")),
        results(tool_result(use_id, big_result(f"{tag} FAILED", 6000), is_error=True)),
        assistant(f"The tests of {tag} fail."),
    ]


async def test_long_tool_results_become_evidence_with_their_ids_and_error_flags(
    daemon: CompactdClient, fake: FakeAnthropic
) -> None:
    sid = await open_session(daemon, EVIDENCE)
    await daemon.append(sid, [*turn("ev0"), *failing_turn("ev1"), *turn("ev2"), *turn("ev3")])
    fake.push(
        Reply.answer(
            "toolu_ev0: module ev0 read, 178 lines of records, every status ok\n"
            "toolu_ev1: pytest failed in every one of 178 cases of module ev1"
        ),
        Reply.answer("CHECKPOINT from evidence"),
    )
    result = await daemon.compact(sid, window=WINDOW)
    assert result.applied and result.covered_turns == 2
    evidence_prompt, checkpoint_prompt = prompts(fake)
    assert '<result id="toolu_ev0" tool="Read" error="false">' in evidence_prompt
    assert '<result id="toolu_ev1" tool="Bash" error="true">' in evidence_prompt
    assert "ev0 line 0100" in evidence_prompt  # the evidence reads the original, whole
    assert "<id>: what the result showed" in systems(fake)[0]
    # the checkpoint works from the evidence, not the raw output
    assert "[tool evidence] module ev0 read, 178 lines" in checkpoint_prompt
    assert "[tool evidence] pytest failed in every one" in checkpoint_prompt
    assert "ev0 line 0" not in checkpoint_prompt and "ev1 FAILED line" not in checkpoint_prompt

    evidence = await records(daemon, sid, "evidence")
    by_id = {r["data"]["toolUseId"]: r for r in evidence}
    assert set(by_id) == {"toolu_ev0", "toolu_ev1"}
    assert by_id["toolu_ev0"]["data"]["isError"] is False
    assert by_id["toolu_ev1"]["data"]["isError"] is True
    assert by_id["toolu_ev1"]["data"]["tool"] == "Bash"
    (summary,) = await records(daemon, sid, "summary")
    for rec in evidence:  # reversible: the record covers the call; its original is kept
        (node_id,) = rec["covers"]
        assert node_id in summary["covers"]
        got = await daemon.get(sid, node_id)
        assert got["node"]["tool_use_id"] == rec["data"]["toolUseId"]
        assert "line 0100" in got["node"]["result"]
        assert got["node"]["isError"] == rec["data"]["isError"]
    await agree(daemon, sid)


async def test_evidence_rides_in_the_checkpoints_call_when_the_range_fits_one(
    daemon: CompactdClient, fake: FakeAnthropic
) -> None:
    """The same long results, a range that fits one summarizer call: one call, the checkpoint
    reading each result as the tool returned it (not what Budget Reduction left of it), and
    no evidence records. Past one call, the stage runs first, as above."""
    sid = await open_session(daemon, {"evidenceEnabled": True})
    await daemon.append(sid, [*turn("fo0"), *failing_turn("fo1"), *turn("fo2"), *turn("fo3")])
    fake.push(Reply.answer("CHECKPOINT from the results whole"))
    result = await daemon.compact(sid, window=WINDOW)
    assert result.applied and result.covered_turns == 2
    (checkpoint_prompt,) = prompts(fake)
    assert "fo0 line 0100" in checkpoint_prompt  # past the 4,000 characters a render keeps
    assert "fo1 FAILED line" in checkpoint_prompt
    assert "[tool evidence]" not in checkpoint_prompt
    assert await records(daemon, sid, "evidence") == []
    (summary,) = await records(daemon, sid, "summary")
    assert summary["data"]["usage"]["evidenceCalls"] == 0
    await agree(daemon, sid)

    sid = await open_session(daemon, {"evidenceEnabled": True, "summaryInputMaxTokens": 2000})
    await daemon.append(sid, [*turn("fx0"), *failing_turn("fx1"), *turn("fx2"), *turn("fx3")])
    fake.push(Reply.answer("toolu_fx0: module fx0 read"))
    assert (await daemon.compact(sid, window=WINDOW)).applied
    assert '<result id="toolu_fx0" tool="Read"' in prompts(fake)[1]  # the stage ran first
    assert await records(daemon, sid, "evidence")


async def test_a_result_the_evidence_skipped_reaches_the_checkpoint_raw(
    daemon: CompactdClient, fake: FakeAnthropic
) -> None:
    sid = await open_session(daemon, EVIDENCE)
    await daemon.append(sid, [m for k in range(4) for m in turn(f"sk{k}")])
    fake.push(Reply.answer("toolu_sk0: module sk0 read"), Reply.answer("CHECKPOINT"))
    assert (await daemon.compact(sid, window=WINDOW)).applied
    checkpoint_prompt = prompts(fake)[1]
    assert "[tool evidence] module sk0 read" in checkpoint_prompt
    assert "sk1 line 0000" in checkpoint_prompt  # no line for it: kept as rendered
    assert [r["data"]["toolUseId"] for r in await records(daemon, sid, "evidence")] == ["toolu_sk0"]


async def test_a_failed_summary_writes_no_evidence_either(
    daemon: CompactdClient, fake: FakeAnthropic
) -> None:
    sid = await open_session(daemon, EVIDENCE)
    await daemon.append(sid, [m for k in range(4) for m in turn(f"nf{k}")])
    fake.push(Reply.answer("toolu_nf0: module nf0 read"), Reply.blank())
    failed = await daemon.compact(sid, window=WINDOW)
    assert failed.applied is False and failed.failure == "empty"
    assert len(fake.messages_requests()) == 2
    assert await records(daemon, sid) == []


# ---- images and documents --------------------------------------------------------------------


def image(tag: str) -> dict[str, Any]:
    return {"type": "image", "source": {**PNG, "data": PNG["data"] + tag}}


def document(tag: str) -> dict[str, Any]:
    source = {"type": "base64", "media_type": "application/pdf", "data": "JVBERi0xLjQK" + tag}
    return {"type": "document", "source": source}


def pictured_turn(tag: str) -> list[dict[str, Any]]:
    """A request with a screenshot, and a tool that returns one too."""
    use_id = f"toolu_{tag}"
    return [
        {
            "role": "user",
            "content": [
                {"type": "text", "text": f"Request {tag}: fix this layout."},
                image(tag),
                document(tag),
            ],
        },
        assistant(f"Taking a screenshot for {tag}.", tool_use(use_id, "Screenshot")),
        results(
            tool_result(
                use_id, [{"type": "text", "text": f"screenshot of {tag}"}, image(tag + "shot")]
            )
        ),
        assistant(f"The layout of {tag} is fixed."),
    ]


def images_in(request: dict[str, Any]) -> list[str]:
    out = []
    for message in request["messages"]:
        content = message["content"]
        for block in content if isinstance(content, list) else []:
            if block.get("type") in ("image", "document"):
                out.append(block["source"]["data"])
            if block.get("type") == "tool_result" and isinstance(block.get("content"), list):
                out.extend(b["source"]["data"] for b in block["content"] if b["type"] == "image")
    return out


async def test_images_of_the_replaced_range_stay_in_the_request(
    daemon: CompactdClient, fake: FakeAnthropic
) -> None:
    sid = await open_session(daemon)
    await daemon.append(sid, [*pictured_turn("im0"), *turn("im1"), *turn("im2"), *turn("im3")])
    before = images_in((await daemon.render(sid, window=WINDOW)).request)
    assert len(before) == 3  # the request's image and document, the tool's screenshot
    fake.push(Reply.answer("CHECKPOINT of the layout work"))
    result = await daemon.compact(sid, window=WINDOW)
    assert result.applied and result.covered_turns == 2
    (summary,) = await records(daemon, sid, "summary")
    assert "Request im0" in " ".join(summary["data"]["userRequests"])
    request = await agree(daemon, sid)
    assert images_in(request) == before  # all three, after the summary, in their order
    # the summarizer was told they stay, by name: never a bare "[image]"
    (prompt,) = prompts(fake)
    assert "[image]" not in prompt
    assert "[image #1: kept in the request after the checkpoint]" in prompt
    assert "[document #2: kept in the request after the checkpoint]" in prompt
    assert "[image #3: kept in the request after the checkpoint]" in prompt
    assert "stay in the agent's context" in systems(fake)[0]
    marker = next(
        b["text"]
        for m in request["messages"]
        for b in (m["content"] if isinstance(m["content"], list) else [])
        if b.get("type") == "text" and "CHECKPOINT of the layout work" in b["text"]
    )
    named = (
        "image #1 (from the user), document #2 (from the user), image #3 (returned by toolu_im0)"
    )
    assert named in marker


async def test_a_second_summary_keeps_the_images_of_the_first(
    daemon: CompactdClient, fake: FakeAnthropic
) -> None:
    sid = await open_session(daemon)
    await daemon.append(sid, [*pictured_turn("ik0"), *turn("ik1"), *turn("ik2"), *turn("ik3")])
    assert (await daemon.compact(sid, window=WINDOW)).applied
    await daemon.append(sid, [*turn("ik4"), *turn("ik5")])
    assert (await daemon.compact(sid, window=WINDOW)).applied
    request = await agree(daemon, sid)
    assert len(images_in(request)) == 3
    assert len(await records(daemon, sid, "summary")) == 2


# ---- prepared summaries, instructions, preparation without the lock -------------------------


async def test_compact_with_instructions_after_a_prepared_summary_asks_again(
    daemon: CompactdClient, fake: FakeAnthropic
) -> None:
    sid = await prepared_session(daemon, fake, "pi")
    fake.push(Reply.answer("FOLLOWED the instructions"))
    result = await daemon.compact(sid, "keep the database-migration discussion", window=WINDOW)
    assert result.applied
    assert len(fake.messages_requests()) == 2  # the prepared one was made without them
    assert "keep the database-migration discussion" in systems(fake)[1]
    assert "keep the database-migration discussion" not in systems(fake)[0]
    (summary,) = await records(daemon, sid, "summary")
    assert summary["data"]["text"] == "FOLLOWED the instructions"
    assert summary["data"]["instructions"] == "keep the database-migration discussion"
    assert "reused" not in summary["data"]["usage"]


async def test_a_render_returns_while_a_background_summary_is_generated(
    patient: CompactdClient, fake: FakeAnthropic
) -> None:
    sid = await open_session(patient, IDLE)
    await patient.append(sid, sixteen("bg"))
    gate = fake.hold()
    fake.push(Reply.answer("STALE checkpoint"))
    await patient.render(sid, window=WINDOW)  # the params the preparation will use
    await arrived(gate)
    # the summary is in flight and held: each of these would wait for it behind a lock
    rendered = await patient.render(sid, window=WINDOW, cascade=True)
    assert rendered.tokens.total > 0
    await patient.append(sid, turn("bg4"))  # the range the preparation took is now stale
    assert (await patient.measure(sid, window=WINDOW)).total > rendered.tokens.total
    assert not gate.released.is_set() and len(fake.messages_requests()) == 1
    # once it is let go, the next range is prepared (the idle loop had to wait for the first)
    second = fake.hold()
    fake.push(Reply.answer("CURRENT checkpoint"))
    gate.release()
    await arrived(second)
    second.release()
    assert "Request bg2" in prompts(fake)[1] and "Request bg2" not in prompts(fake)[0]
    result = await patient.compact(sid, window=WINDOW)
    assert result.applied and result.covered_turns == 3
    (summary,) = await records(patient, sid, "summary")
    # the current preparation if its answer is in, else a fresh call — never the stale one
    assert summary["data"]["text"] in ("CURRENT checkpoint", DEFAULT_ANSWER)


async def test_a_compaction_proceeds_while_a_preparation_is_held(
    patient: CompactdClient, fake: FakeAnthropic
) -> None:
    sid = await open_session(patient, IDLE)
    await patient.append(sid, sixteen("bh"))
    gate = fake.hold()
    await patient.render(sid, window=WINDOW)
    await arrived(gate)
    fake.push(Reply.answer("FOREGROUND checkpoint"))
    result = await patient.compact(sid, window=WINDOW)
    assert result.applied
    gate.release()
    (summary,) = await records(patient, sid, "summary")
    assert summary["data"]["text"] == "FOREGROUND checkpoint"


async def test_the_time_bound_ends_a_summary_and_writes_nothing(
    patient: CompactdClient, fake: FakeAnthropic
) -> None:
    sid = await open_session(patient, {"summaryTimeBoundSeconds": 0.5})
    await patient.append(sid, sixteen("tb"))
    gate = fake.hold()  # never released before the bound: only the bound can end the call
    failed = await patient.compact(sid, window=WINDOW)
    assert failed.applied is False and failed.failure == "timeout"
    assert "time bound" in (failed.reason or "")
    assert not gate.released.is_set()
    gate.release()
    assert await records(patient, sid) == []


# ---- the size floor and fallback models -------------------------------------------------------


async def test_the_summary_may_use_at_least_the_size_floor(
    daemon: CompactdClient, fake: FakeAnthropic
) -> None:
    sid = await open_session(daemon)
    await daemon.append(sid, sixteen("sf"))
    # a 16K window: a tenth of its 12,000-token limit would be 1,200 tokens
    assert (await daemon.compact(sid, window=16_000)).applied
    (request,) = fake.messages_requests()
    assert request.body["max_tokens"] == 2000
    assert "at least 2000 tokens" in systems(fake)[0]


async def test_a_render_fits_the_smallest_of_its_fallback_models(
    daemon: CompactdClient, fake: FakeAnthropic
) -> None:
    sid = await open_session(daemon)
    await daemon.append(sid, sixteen("fb"))
    plain = await daemon.render(sid, model="claude-sonnet-4-5")
    assert plain.tokens.models is None and plain.tokens.limit == 180_000
    both = await daemon.render(sid, model="claude-sonnet-4-5", fallback_models=["gpt-4"])
    assert both.tokens.models is not None
    models = {m.model: m for m in both.tokens.models}
    assert models["claude-sonnet-4-5"].limit == 180_000
    assert models["gpt-4"].limit == 8192 - 2048 and models["gpt-4"].binding
    assert both.tokens.limit == 6144 and both.request["max_tokens"] == 20_000
    assert both.tokens.total > 0.9 * 6144  # over gpt-4's threshold, far under Claude's
    out = await daemon.render(
        sid, model="claude-sonnet-4-5", fallback_models=["gpt-4"], cascade=True
    )
    assert any(e.applied for e in out.events)
    for budget in out.tokens.models or []:
        assert budget.total <= budget.limit
    assert out.tokens.models
    assert out.request["model"] == "claude-sonnet-4-5"


# ---- Snip and a running function ----------------------------------------------------------


async def test_snip_leaves_the_turns_of_a_running_function_in_its_own_view(
    daemon: CompactdClient, fake: FakeAnthropic
) -> None:
    fake.default = Reply.server_error()  # no summary: only Snip could make room
    sid = await open_session(daemon, {"summaryMaxCalls": 1})
    await daemon.append(
        sid, [user("Research the codebase."), assistant("On it.", tool_use("toolu_r", "Task"))]
    )
    fid = (await daemon.function_start(sid, "Task", {"q": "x"}, tool_use_id="toolu_r")).function_id
    inside = [
        m
        for k in range(6)
        for m in (user(f"step {k}: read part {k}"), assistant(filler(f"part{k}", 930)))
    ]
    await daemon.append(sid, inside, function_id=fid)
    measured = await daemon.measure(sid, window=WINDOW, viewer=fid)
    assert measured.threshold < measured.total <= measured.limit
    out = await daemon.render(sid, window=WINDOW, viewer=fid, cascade=True)
    assert await records(daemon, sid, "snip") == []
    snip = next(e for e in out.events if e.tier == "snip")
    assert not snip.applied
    shown = " ".join(
        b.get("text", "")
        for m in out.request["messages"]
        for b in (m["content"] if isinstance(m["content"], list) else [])
    )
    for k in range(6):
        assert f"step {k}: read part {k}" in shown


# ---- the engine's side: deterministic clocks and budgets ---------------------------------------


def test_the_time_bound_covers_every_call_of_a_summary(store: FileStore) -> None:
    now = [1000.0]
    engine = Engine(store, clock=lambda: now[0], summary_provider="digest")
    # the plain prompt, chunk by chunk (a fork of the cached request is one call)
    config = {"summaryInputMaxTokens": 2000, "evidenceEnabled": False, "summaryFork": False}
    unbounded = open_engine_session(engine, config)
    engine.append(unbounded, messages=sixteen("ub"))
    calls = Recorder()
    cascade(engine, unbounded, params(), answer=calls, manual=True)
    assert len(calls.needs) >= 2  # the range takes several chunks

    sid = open_engine_session(engine, {**config, "summaryTimeBoundSeconds": 150})

    def slow(need: SummaryNeeded) -> SummaryResult | SummaryFailure:
        now[0] += 200  # each call takes longer than the whole bound
        return digest_answer(need)

    recorder = Recorder(slow)
    engine.append(sid, messages=sixteen("tb"))
    out = cascade(engine, sid, params(), answer=recorder, manual=True)
    assert len(recorder.needs) == 1  # the second chunk is never asked for
    assert recorder.needs[0].request.deadline == 1000.0 + 150  # one bound for the whole
    event = next(e for e in out.events if e.tier == "summary")
    assert not event.applied and "time bound" in event.reason
    assert engine_records(engine, sid) == []


def test_a_range_is_prepared_at_most_once_even_when_it_failed(store: FileStore) -> None:
    engine = Engine(store, summary_provider="digest")
    config = {"prepareOccupancy": 0.1, "evidenceEnabled": False, "summaryMinGain": 0.001}
    sid = open_engine_session(engine, config)
    engine.append(sid, messages=sixteen("once"))
    failing = Recorder(lambda need: SummaryFailure("overloaded", "busy"))
    steps = engine.prepare(sid, params())
    assert steps is not None and drive(steps, failing) is False
    assert len(failing.needs) == 1
    for _ in range(3):  # every idle pause after it: nothing asked
        again = Recorder()
        steps = engine.prepare(sid, params())
        assert steps is not None and drive(steps, again) is False
        assert again.needs == []
    engine.append(sid, messages=turn("once4"))  # a new range is prepared once
    fresh = Recorder()
    steps = engine.prepare(sid, params())
    assert steps is not None and drive(steps, fresh) is True
    assert len(fresh.needs) == 1 and engine.has_prepared(sid)


def crowded_turn(tag: str, images: int) -> list[dict[str, Any]]:
    content = [{"type": "text", "text": f"Request {tag}: compare these screenshots."}]
    content += [image(f"{tag}{i}") for i in range(images)]
    return [{"role": "user", "content": content}, assistant(f"Compared the {tag} screenshots.")]


def test_images_the_limit_cannot_hold_go_last_and_are_named(store: FileStore) -> None:
    engine = Engine(store, summary_provider="digest")
    sid = open_engine_session(engine)
    engine.append(
        sid,
        messages=[
            *crowded_turn("cr0", 3),
            *crowded_turn("cr1", 3),
            *turn("cr2", 600),
            *turn("cr3", 600),
        ],
    )
    p = params(window=12_000)  # a 9,000-token limit; six images alone are 9,600
    before = engine.render(sid, p)
    assert before.total > before.budget.limit
    out = cascade(engine, sid, p, manual=True)
    (summary,) = engine_records(engine, sid, "summary")
    assert summary.data["mediaDropped"] is True and len(summary.data["media"]) == 6
    assert out.rendered.total <= out.rendered.budget.limit
    assert images_in(out.rendered.request) == []
    marker = " ".join(
        b.get("text", "")
        for m in out.rendered.request["messages"]
        for b in (m["content"] if isinstance(m["content"], list) else [])
    )
    assert "that the window cannot hold: image #1 (from the user)" in marker
    assert "image #6 (from the user)" in marker
    assert engine.render(sid, p).request == out.rendered.request
