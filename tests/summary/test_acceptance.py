"""The spec's acceptance list for the rolling summary, through the daemon (`compactd serve
--summary-provider anthropic`) and the fake Messages API it reaches with the real SDK.

"Nothing written" is checked on the session log's bytes, on the records `session/get` shows
(no summary record: the compaction count is unchanged) and on `context/measure`."""

from __future__ import annotations

import asyncio
import shutil
import tempfile
from pathlib import Path
from typing import Any

import pytest
from compactd.clients.client import CompactdClient, RpcError
from compactd.context.engine import Engine, RenderParams
from compactd.context.render.request import RequestSpec
from compactd.context.stores.files import FileStore
from compactd.context.summarizer.driver import drive
from compactd.context.summarizer.types import SummaryResult
from compactd.protocol.errors import CODE_BY_KIND, REQUEST_CANCELLED

from tests.cascade.helpers import user
from tests.summary.helpers import (
    WINDOW,
    agree,
    big_result,
    log_bytes,
    open_session,
    prompts,
    records,
    sixteen,
    systems,
    turn,
    wait_until,
    wire_blocks,
)
from tests.support.fake_anthropic import FakeAnthropic, Reply

MARKER = "[compactd: summary of the earlier conversation"


def turns_of(nodes: list[dict[str, Any]]) -> list[list[str]]:
    """Node ids per turn (thread nodes and their calls) from `session/get`'s path."""
    out: list[list[str]] = []
    for node in nodes:
        if (node["kind"] == "user" and not node.get("meta")) or not out:
            out.append([])
        out[-1].append(node["id"])
        out[-1].extend(call["id"] for call in node.get("calls", []))
    return out


async def state(client: CompactdClient, sid: str, data_dir: Path) -> tuple[bytes, int, int]:
    """What must not change when nothing is written: log bytes, summaries, measured total."""
    measure = await client.measure(sid, window=WINDOW)
    return log_bytes(data_dir, sid), len(await records(client, sid, "summary")), measure.total


async def sixteen_session(client: CompactdClient, prefix: str) -> str:
    sid = await open_session(client)
    await client.append(sid, sixteen(prefix))
    return sid


# ---- coverage, input, retained turns ------------------------------------------------------------


async def test_sixteen_messages_compact_whole_older_turns_and_shrink(
    daemon: CompactdClient, fake: FakeAnthropic
) -> None:
    sid = await sixteen_session(daemon, "a")
    before_request = await agree(daemon, sid)
    before = await daemon.measure(sid, window=WINDOW)
    result = await daemon.compact(sid, window=WINDOW)
    assert result.applied and result.provider == "anthropic"
    assert result.covered_turns == 2  # the latest two complete turns stay
    assert result.tokens_before == before.total
    assert result.tokens_after < result.tokens_before
    after_request = await agree(daemon, sid)
    assert (await daemon.measure(sid, window=WINDOW)).total == result.tokens_after
    assert len(fake.messages_requests()) == 1

    got = await daemon.get(sid)
    turns = turns_of(got["nodes"])
    assert len(turns) == 4
    (summary,) = [r for r in got["records"] if r["kind"] == "summary"]
    assert sorted(summary["covers"]) == sorted(turns[0] + turns[1])  # whole turns, calls too
    assert summary["data"]["turns"] == [turns[0][0], turns[1][0]]
    assert summary["data"]["text"] == Reply.answer().text
    assert got["head"] == got["nodes"][-1]["id"]  # HEAD did not move

    # the input: every replaced request and every visible result, nothing of the kept turns
    (prompt,) = prompts(fake)
    for tag in ("a0", "a1"):
        assert f"Request {tag}: inspect module {tag}" in prompt
        full = big_result(tag)
        assert f"TOOL RESULT (toolu_{tag}): {full[:2400]}" in prompt  # Budget Reduction's head
        assert full[-1600:] in prompt  # and tail
        assert f"Module {tag} parses" in prompt
    for tag in ("a2", "a3"):
        assert tag not in prompt
    assert prompt.startswith("USER: Request a0")  # from the first message of the range

    # the kept turns render byte for byte as before; in front of them, one marker
    old, new = wire_blocks(before_request), wire_blocks(after_request)
    start = next(i for i, (_, b) in enumerate(old) if b.get("text", "").startswith("Request a2"))
    kept = old[start:]
    assert new[-len(kept) :] == kept
    (marker,) = new[: -len(kept)]
    assert marker[0] == "user" and marker[1]["text"].startswith(MARKER + " (2 turns replaced")
    assert Reply.answer().text in marker[1]["text"]
    # the model still sees what the user asked, verbatim
    assert "Request a0: inspect module a0 and report what it does." in marker[1]["text"]


async def test_short_history_never_calls_the_provider(
    daemon: CompactdClient, fake: FakeAnthropic, daemon_dir: Path
) -> None:
    sid = await open_session(daemon)
    await daemon.append(sid, turn("s0") + turn("s1"))
    before = await state(daemon, sid, daemon_dir)
    result = await daemon.compact(sid, window=WINDOW)
    assert not result.applied
    assert "short history" in (result.reason or "")
    assert fake.messages_requests() == []
    assert await state(daemon, sid, daemon_dir) == before
    # with the active turn after them, still nothing before the kept turns
    await daemon.append(sid, [user("and now?")])
    result = await daemon.compact(sid, window=WINDOW)
    assert not result.applied and fake.messages_requests() == []


async def test_compact_instructions_reach_the_summarizer(
    daemon: CompactdClient, fake: FakeAnthropic
) -> None:
    sid = await sixteen_session(daemon, "i")
    instructions = "retain the database-migration discussion"
    result = await daemon.compact(sid, instructions=instructions, window=WINDOW)
    assert result.applied
    (system,) = systems(fake)
    assert system.startswith("You write the handoff checkpoint")
    assert system.rstrip().endswith(instructions)
    (summary,) = await records(daemon, sid, "summary")
    assert summary["data"]["instructions"] == instructions
    assert instructions not in prompts(fake)[0]  # instructions are not conversation


# ---- nothing written ---------------------------------------------------------------------------


def probe_equal_text(data_dir: Path, sid: str) -> str:
    """A summary whose marker costs exactly the tokens it would save: found on a copy of the
    session's log with an in-process engine (the same code the daemon runs)."""

    def trial(text: str) -> tuple[bool, int]:
        with tempfile.TemporaryDirectory() as scratch:
            store = FileStore(scratch)
            store.ensure_dirs()
            shutil.copyfile(FileStore(data_dir).log_path(sid), store.log_path(sid))
            engine = Engine(store, summary_provider="anthropic")
            p = RenderParams(spec=RequestSpec(window=WINDOW))
            before = engine.render(sid, p).total
            out = drive(
                engine.cascade(sid, p, manual=True),
                lambda need: SummaryResult(text=text, model="probe"),
            )
            (event,) = [e for e in out.events if e.tier == "summary"]
            return event.applied, (event.tokens_after if event.applied else before)

    applied, after_short = trial("S")
    assert applied
    with tempfile.TemporaryDirectory() as scratch:
        store = FileStore(scratch)
        store.ensure_dirs()
        shutil.copyfile(FileStore(data_dir).log_path(sid), store.log_path(sid))
        before = Engine(store).render(sid, RenderParams(spec=RequestSpec(window=WINDOW))).total
    text = "S" + " the" * (before - after_short)  # one token per " the"
    applied, _ = trial(text)
    assert not applied
    shorter = "S" + " the" * (before - after_short - 1)
    applied, after = trial(shorter)
    assert applied and after == before - 1  # so `text` is exactly as long as the range
    return text


@pytest.mark.parametrize("length", ["equal", "longer"])
async def test_a_summary_that_is_not_shorter_is_not_written(
    daemon: CompactdClient, fake: FakeAnthropic, daemon_dir: Path, length: str
) -> None:
    sid = await sixteen_session(daemon, f"n{length[0]}")
    before = await state(daemon, sid, daemon_dir)
    if length == "equal":
        fake.push(Reply.answer(probe_equal_text(daemon_dir, sid)))
    else:
        fake.push(Reply.long_text(chars=40_000))
    result = await daemon.compact(sid, window=WINDOW)
    assert not result.applied
    assert (result.reason or "").startswith("no gain")
    assert result.tokens_after == result.tokens_before == before[2]
    assert len(fake.messages_requests()) == 1
    assert await state(daemon, sid, daemon_dir) == before
    await agree(daemon, sid)


@pytest.mark.parametrize("reply", [Reply.blank(), Reply.blank(" \n\t "), Reply.empty()])
async def test_an_empty_summary_is_not_written(
    daemon: CompactdClient, fake: FakeAnthropic, daemon_dir: Path, reply: Reply
) -> None:
    sid = await sixteen_session(daemon, "e")
    before = await state(daemon, sid, daemon_dir)
    fake.push(reply)
    result = await daemon.compact(sid, window=WINDOW)
    assert result.applied is False and result.failure == "empty"
    assert "empty" in (result.reason or "")
    assert await state(daemon, sid, daemon_dir) == before


PROVIDER_ERRORS = {
    "413": (Reply.too_large(), "too_large"),
    "429": (Reply.rate_limited(), "rate_limited"),
    "529": (Reply.overloaded(), "overloaded"),
    "stream-error": (Reply.stream_error(), "overloaded"),
    "400-prompt-too-long": (Reply.prompt_too_long(9_000, 1_000), "prompt_too_long"),
}


@pytest.mark.parametrize("name", list(PROVIDER_ERRORS))
async def test_a_provider_error_writes_nothing(
    daemon: CompactdClient, fake: FakeAnthropic, daemon_dir: Path, name: str
) -> None:
    sid = await sixteen_session(daemon, "p")
    before = await state(daemon, sid, daemon_dir)
    reply, kind = PROVIDER_ERRORS[name]
    fake.default = reply  # every attempt fails, retries and smaller chunks included
    # a summary of over 4,096 tokens is streamed (a mid-stream error needs a stream); the
    # summary may take a twentieth of the limit, so that needs a window of 128K
    window = 128_000 if name == "stream-error" else WINDOW
    result = await daemon.compact(sid, window=window)
    assert result.applied is False and result.failure == kind
    assert kind in (result.reason or "")
    assert await state(daemon, sid, daemon_dir) == before
    sent = fake.messages_requests()
    if name in ("429", "529"):
        assert len(sent) == 3  # the SDK's own retries, then it gives up
    elif name == "400-prompt-too-long":
        sizes = [len(p) for p in prompts(fake)]
        assert 2 <= len(sizes) <= 8 and sizes[1] < sizes[0]  # smaller chunks, bounded
    elif name == "413":
        assert 2 <= len(sent) <= 8
    else:
        assert len(sent) == 1 and sent[0].body["stream"] is True


async def test_prompt_too_long_is_retried_with_smaller_chunks(
    daemon: CompactdClient, fake: FakeAnthropic
) -> None:
    sid = await sixteen_session(daemon, "r")
    fake.push(Reply.prompt_too_long(9_000, 2_000))
    for n in range(1, 9):
        fake.push(Reply.answer(f"PART-{n} checkpoint"))
    result = await daemon.compact(sid, window=WINDOW)
    assert result.applied
    first, *rest = prompts(fake)
    assert len(rest) >= 2
    assert all(len(p) < len(first) for p in rest)
    for n, prompt in enumerate(rest, start=1):
        assert prompt.startswith(f"This is part {n} of {len(rest)}")
        if n > 1:
            assert f"<previous_checkpoint>\nPART-{n - 1} checkpoint\n</previous_checkpoint>" in (
                prompt
            )
    (summary,) = await records(daemon, sid, "summary")
    assert summary["data"]["text"] == f"PART-{len(rest)} checkpoint"
    assert summary["data"]["usage"]["calls"] == 1 + len(rest)
    # every request and result of the range reached the summarizer in one chunk or another
    joined = "\n".join(rest)
    for tag in ("r0", "r1"):
        assert f"Request {tag}:" in joined and f"TOOL RESULT (toolu_{tag})" in joined


async def test_cancelling_compact_writes_nothing(
    daemon: CompactdClient, fake: FakeAnthropic, daemon_dir: Path
) -> None:
    sid = await sixteen_session(daemon, "c")
    before = await state(daemon, sid, daemon_dir)
    fake.push(Reply.stall(30))
    msg_id, answer = daemon.send_request("context/compact", {"sessionId": sid, "window": WINDOW})
    await wait_until(lambda: len(fake.messages_requests()) == 1)
    daemon.cancel(msg_id)
    with pytest.raises(RpcError) as caught:
        await asyncio.wait_for(answer, 60)
    assert caught.value.code == REQUEST_CANCELLED
    assert await state(daemon, sid, daemon_dir) == before
    # the daemon is fine afterwards and the session compacts normally
    assert (await daemon.compact(sid, window=WINDOW)).applied


async def test_an_append_during_generation_writes_no_summary(
    daemon: CompactdClient, fake: FakeAnthropic, daemon_dir: Path
) -> None:
    sid = await sixteen_session(daemon, "d")
    gate = fake.hold()  # the summary is answered only once the append is in
    fake.push(Reply.answer("LATE checkpoint"))
    _, answer = daemon.send_request("context/compact", {"sessionId": sid, "window": WINDOW})
    await asyncio.to_thread(gate.arrived.wait, 60)
    appended = await daemon.append(sid, [user("one more thing while you summarize")])
    gate.release()
    with pytest.raises(RpcError) as caught:
        await asyncio.wait_for(answer, 60)
    assert caught.value.code == CODE_BY_KIND["head_conflict"]
    assert "changed while compacting" in caught.value.message
    assert await records(daemon, sid, "summary") == []
    got = await daemon.get(sid)
    assert got["head"] == appended.head  # the append stands; nothing else was written
    assert "LATE checkpoint" not in log_bytes(daemon_dir, sid).decode()
    await agree(daemon, sid)


async def test_a_usage_report_during_generation_does_not_undo_the_summary(
    daemon: CompactdClient, fake: FakeAnthropic
) -> None:
    sid = await sixteen_session(daemon, "g")
    gate = fake.hold()  # the summary is answered only once the report is in
    fake.push(Reply.answer("KEPT checkpoint"))
    _, answer = daemon.send_request("context/compact", {"sessionId": sid, "window": WINDOW})
    await asyncio.to_thread(gate.arrived.wait, 60)
    await daemon.report_usage(sid, "claude-opus-4-8", usage={"input_tokens": 4000})
    gate.release()
    result = await asyncio.wait_for(answer, 60)
    assert result["applied"]
    (summary,) = await records(daemon, sid, "summary")
    assert summary["data"]["text"] == "KEPT checkpoint"
    assert [r["kind"] for r in await records(daemon, sid)] == ["usage", "summary"]


async def test_a_stall_past_the_timeout_writes_nothing(
    daemon: CompactdClient, fake: FakeAnthropic, daemon_dir: Path
) -> None:
    sid = await open_session(daemon, {"summaryTimeBoundSeconds": 1})
    await daemon.append(sid, sixteen("t"))
    before = await state(daemon, sid, daemon_dir)
    gate = fake.hold()  # never released before the bound: only the bound can end the call
    result = await daemon.compact(sid, window=WINDOW)
    gate.release()
    assert result.applied is False and result.failure == "timeout"
    assert await state(daemon, sid, daemon_dir) == before


# ---- repeated compaction, branches, measure ------------------------------------------------------


async def test_repeated_compaction_folds_the_previous_summary_in(
    daemon: CompactdClient, fake: FakeAnthropic
) -> None:
    sid = await sixteen_session(daemon, "f")
    fake.push(Reply.answer("FIRST-CHECKPOINT alpha"))
    assert (await daemon.compact(sid, window=WINDOW)).applied
    await agree(daemon, sid)
    await daemon.append(sid, turn("f4") + turn("f5"))
    await agree(daemon, sid)
    fake.push(Reply.answer("SECOND-CHECKPOINT beta"))
    second = await daemon.compact(sid, window=WINDOW)
    assert second.applied and second.covered_turns == 4
    first_prompt, second_prompt = prompts(fake)
    assert "FIRST-CHECKPOINT" not in first_prompt
    assert second_prompt.startswith(
        "<previous_checkpoint>\nFIRST-CHECKPOINT alpha\n</previous_checkpoint>"
    )
    for tag in ("f2", "f3"):  # the turns new to this summary, as they were
        assert f"Request {tag}:" in second_prompt and f"TOOL RESULT (toolu_{tag})" in second_prompt
    for tag in ("f0", "f1"):  # already inside the first checkpoint: not sent again
        assert f"TOOL RESULT (toolu_{tag})" not in second_prompt
    request = await agree(daemon, sid)
    markers = [b["text"] for _, b in wire_blocks(request) if b.get("text", "").startswith(MARKER)]
    assert len(markers) == 1  # one rolling summary in force
    assert "SECOND-CHECKPOINT beta" in markers[0] and "FIRST-CHECKPOINT" not in markers[0]
    for tag in ("f0", "f1", "f2", "f3"):  # every replaced request survives, verbatim
        assert f"Request {tag}: inspect module {tag} and report what it does." in markers[0]
    summaries = await records(daemon, sid, "summary")
    assert len(summaries) == 2  # the old one stays in the log
    assert summaries[1]["data"]["prior"] == summaries[0]["id"]


async def test_switching_branches_uses_only_that_branchs_summary(
    daemon: CompactdClient, fake: FakeAnthropic
) -> None:
    sid = await open_session(daemon)
    first = await daemon.append(sid, turn("b0"))
    await daemon.append(sid, turn("b1") + turn("b2") + turn("b3"))
    await daemon.branch(sid, "alt", from_node=first.head)
    await daemon.append(sid, turn("c1") + turn("c2") + turn("c3"), branch="alt")

    fake.push(Reply.answer("MAIN-CHECKPOINT"))
    assert (await daemon.compact(sid, window=WINDOW)).applied
    fake.push(Reply.answer("ALT-CHECKPOINT"))
    assert (await daemon.compact(sid, branch="alt", window=WINDOW)).applied
    main_prompt, alt_prompt = prompts(fake)
    assert "MAIN-CHECKPOINT" not in alt_prompt  # the prior summary of another branch
    assert "Request b0" in alt_prompt and "Request c1" in alt_prompt and "b1" not in alt_prompt

    main = await agree(daemon, sid)
    alt = await agree(daemon, sid, branch="alt")
    main_text = "\n".join(b.get("text", "") for _, b in wire_blocks(main))
    alt_text = "\n".join(b.get("text", "") for _, b in wire_blocks(alt))
    assert "MAIN-CHECKPOINT" in main_text and "ALT-CHECKPOINT" not in main_text
    assert "ALT-CHECKPOINT" in alt_text and "MAIN-CHECKPOINT" not in alt_text

    # switching the current branch changes nothing in either render
    await daemon.checkout(sid, "alt")
    assert (await daemon.render(sid, window=WINDOW)).request == alt
    await daemon.checkout(sid, "main")
    assert (await daemon.render(sid, window=WINDOW)).request == main

    # a later compaction of main folds in main's summary only
    await daemon.append(sid, turn("b4") + turn("b5"))
    fake.push(Reply.answer("MAIN-CHECKPOINT-2"))
    assert (await daemon.compact(sid, window=WINDOW)).applied
    third = prompts(fake)[-1]
    assert "MAIN-CHECKPOINT" in third and "ALT-CHECKPOINT" not in third
    assert "ALT-CHECKPOINT" in "\n".join(
        b.get("text", "") for _, b in wire_blocks(await agree(daemon, sid, branch="alt"))
    )
    assert main_prompt.startswith("USER: Request b0")


async def test_measure_advises_manual_compaction_around_60_percent(
    daemon: CompactdClient, fake: FakeAnthropic
) -> None:
    sid = await sixteen_session(daemon, "m")
    total = (await daemon.measure(sid, window=200_000)).total

    def window_for(share: float) -> int:
        # windows under 80K reserve a quarter: limit = 3/4 of the window
        return int(total / share / 0.75) + 4

    for share, advised in ((0.50, False), (0.58, False), (0.61, True), (0.75, True)):
        window = window_for(share)
        measure = await daemon.measure(sid, window=window)
        assert measure.total == total
        assert (measure.advice is not None) == advised, (share, measure.total / measure.limit)
        if advised:
            assert "/compact" in measure.advice
            assert f"{measure.total / measure.limit:.0%}" in measure.advice
    assert fake.messages_requests() == []  # advice only; nothing ran


async def test_a_range_over_the_summarizer_budget_is_chunked_with_a_rolling_summary(
    daemon: CompactdClient, fake: FakeAnthropic
) -> None:
    sid = await open_session(daemon, {"summaryInputMaxTokens": 2000})
    await daemon.append(sid, [m for k in range(8) for m in turn(f"k{k}")])
    for n in range(1, 9):
        fake.push(Reply.answer(f"ROLLING-{n} checkpoint"))
    result = await daemon.compact(sid, window=WINDOW)
    assert result.applied and result.covered_turns == 6
    sent = prompts(fake)
    parts = len(sent)
    assert parts >= 3
    for n, prompt in enumerate(sent, start=1):
        assert prompt.startswith(f"This is part {n} of {parts} of the conversation")
        if n > 1:
            assert f"<previous_checkpoint>\nROLLING-{n - 1} checkpoint\n</previous_checkpoint>" in (
                prompt
            )
    joined = "\n".join(sent)
    for k in range(6):
        assert joined.count(f"USER: Request k{k}:") == 1
        assert joined.count(f"TOOL RESULT (toolu_k{k})") == 1
    for k in (6, 7):
        assert f"Request k{k}" not in joined
    (summary,) = await records(daemon, sid, "summary")
    assert summary["data"]["text"] == f"ROLLING-{parts} checkpoint"
    assert summary["data"]["usage"]["calls"] == parts
    await agree(daemon, sid)
