"""Long calls: `context/compact` with the `client` summary provider reports `$/progress` for a
client-chosen token, can be cancelled with `$/cancelRequest` (−32800, nothing written), and
when the client's model answers, the summary is applied and `context/compacted` arrives
before the response."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
from compactd.clients.client import CompactdClient, RpcError
from compactd.protocol import types as t

from tests.support.logs import log_bytes

from .conftest import running
from .convo import all_text, tool_turns, user
from .wire import RawDaemon

pytestmark = pytest.mark.asyncio(loop_scope="module")
WAIT = 60.0  # a hang detector: a busy machine answers well inside it
TRANSCRIPTS = Path(__file__).resolve().parents[1] / "data/transcripts"


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("cancel") / "data"


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def client(data_dir: Path) -> AsyncIterator[CompactdClient]:
    async with running(data_dir, "--summary-provider", "client") as c:
        yield c


async def session(client: CompactdClient, sid: str) -> str:
    await client.open_session(sid)
    await client.append(sid, tool_turns(sid, 6, 1500, "Deploy"))
    return sid


async def progress_of(client: CompactdClient, token: str, kind: str) -> dict[str, Any]:
    """The next `$/progress` of `kind` for `token` (others are skipped)."""
    while True:
        params = await client.next_notification("$/progress", timeout=WAIT)
        if params["token"] == token and params["value"]["kind"] == kind:
            return params


async def test_cancel_a_stalled_compact_writes_nothing(
    client: CompactdClient, data_dir: Path
) -> None:
    sid = await session(client, "cx-stall")
    asked: list[t.SummarizeParams] = []
    release = asyncio.Event()

    async def stall(params: t.SummarizeParams) -> t.SummarizeResult:
        asked.append(params)
        await release.wait()  # the client's model never comes back (until the test ends)
        return t.SummarizeResult(text="too late")

    client.on_summarize(stall)
    records_before = len((await client.get(sid))["records"])
    log_before = log_bytes(data_dir, sid)

    msg_id, answer = client.send_request(
        "context/compact", {"sessionId": sid, "workDoneToken": "cx-token"}
    )
    begin = await progress_of(client, "cx-token", "begin")
    assert begin["value"]["cancellable"] is True and begin["value"]["title"]
    for _ in range(100):  # the daemon is now waiting inside our summarizer
        if asked:
            break
        await asyncio.sleep(0.05)
    assert asked and asked[0].session_id == sid
    client.cancel(msg_id)
    with pytest.raises(RpcError) as caught:
        await asyncio.wait_for(answer, WAIT)
    assert caught.value.code == -32800
    end = await progress_of(client, "cx-token", "end")
    assert end["value"]["kind"] == "end"

    release.set()  # the late answer goes to a request the daemon no longer waits for
    await asyncio.sleep(0.2)
    assert len((await client.get(sid))["records"]) == records_before
    assert log_bytes(data_dir, sid) == log_before
    assert (await client.status()).summary_provider == "client"  # still serving


async def test_compact_with_the_clients_model(client: CompactdClient) -> None:
    sid = await session(client, "cx-done")
    asked: list[t.SummarizeParams] = []

    def summarize(params: t.SummarizeParams) -> t.SummarizeResult:
        asked.append(params)
        return t.SummarizeResult(
            text="SUMMARY-FROM-CLIENT: six deploys were requested and done.",
            model="client-model-1",
            input_tokens=1234,
            output_tokens=12,
        )

    client.on_summarize(summarize)
    compacted: list[dict[str, Any]] = []
    client.on_notification("context/compacted", compacted.append)
    result = await client.compact(sid, "mention every deploy", work_done_token="cx-done-token")
    assert compacted, "context/compacted must arrive before the compact's response"
    assert result.applied is True and result.provider == "client"
    assert result.tokens_after < result.tokens_before
    (note,) = [n for n in compacted if n["sessionId"] == sid]
    assert note["tier"] == "summary" and note["applied"] is True
    assert note["tokensBefore"] == result.tokens_before
    assert note["tokensAfter"] == result.tokens_after
    (request,) = asked
    assert request.session_id == sid and request.purpose == "rolling"
    assert "task cx-done-0" in request.prompt  # every original user request is in the input
    assert "mention every deploy" in request.system
    seen = all_text((await client.render(sid)).request)
    assert "SUMMARY-FROM-CLIENT" in seen


async def test_a_failing_client_summarizer_writes_nothing(
    client: CompactdClient, data_dir: Path
) -> None:
    sid = await session(client, "cx-fail")

    def broken(params: t.SummarizeParams) -> t.SummarizeResult:
        raise RuntimeError("the client's model is down")

    client.on_summarize(broken)
    before = log_bytes(data_dir, sid)
    failed = await client.compact(sid)  # a result that says so, not an error
    assert failed.applied is False and failed.failure is not None
    assert "model is down" in (failed.reason or "")
    client.on_summarize(lambda params: t.SummarizeResult(text="   "))
    empty = await client.compact(sid)
    assert empty.applied is False and empty.failure == "empty"
    assert log_bytes(data_dir, sid) == before


async def test_an_append_during_the_summary_wins(client: CompactdClient, data_dir: Path) -> None:
    """DESIGN §5: a change to the session while its summary is generated writes nothing."""
    sid = await session(client, "cx-race")
    appended: list[str] = []

    async def append_meanwhile(params: t.SummarizeParams) -> t.SummarizeResult:
        result = await client.append(sid, [user("a new request while you summarize")])
        appended.extend(result.node_ids)
        return t.SummarizeResult(text="a summary of the old state")

    client.on_summarize(append_meanwhile)
    with pytest.raises(RpcError) as caught:
        await client.compact(sid)
    assert caught.value.code == 4030
    view = await client.get(sid)
    assert view["head"] == appended[-1]  # the append went through …
    assert [r for r in view["records"] if r["kind"] == "summary"] == []  # … the summary did not
    assert "a new request while you summarize" in all_text((await client.render(sid)).request)


async def test_a_late_answer_after_cancel_is_dropped(tmp_path: Path) -> None:
    """Byte level, whatever a client library does on cancel: the answer to a `context/summarize`
    the daemon stopped waiting for must not disturb it (it used to end the daemon)."""
    data = tmp_path / "data"
    raw = await RawDaemon.spawn(data, "--summary-provider", "client", log_path=tmp_path / "log")
    try:
        await raw.call("session/open", {"sessionId": "cx-late"})
        await raw.call(
            "session/append", {"sessionId": "cx-late", "messages": tool_turns("late", 6, 1500)}
        )
        before = log_bytes(data, "cx-late")
        compact = raw.send_request("context/compact", {"sessionId": "cx-late"})
        ask = await raw.wait_for(lambda m: m.get("method") == "context/summarize")
        raw.notify("$/cancelRequest", {"id": compact})
        assert (await raw.response(compact))["error"]["code"] == -32800
        raw.send({"jsonrpc": "2.0", "id": ask["id"], "result": {"text": "a late summary"}})
        raw.send({"jsonrpc": "2.0", "id": ask["id"], "error": {"code": -1, "message": "twice"}})
        status = await raw.call("daemon/status", {})
        assert status["loadedSessions"] == ["cx-late"]
        assert log_bytes(data, "cx-late") == before
        assert await raw.shutdown_and_exit() == 0
    finally:
        await raw.kill()
    assert raw.violations == []


async def stalled(client: CompactdClient) -> tuple[list[t.SummarizeParams], asyncio.Event]:
    asked: list[t.SummarizeParams] = []
    release = asyncio.Event()

    async def stall(params: t.SummarizeParams) -> t.SummarizeResult:
        asked.append(params)
        await release.wait()
        return t.SummarizeResult(text="too late")

    client.on_summarize(stall)
    return asked, release


async def wait_asked(asked: list[t.SummarizeParams]) -> None:
    for _ in range(200):  # polling for an event, not timing it
        if asked:
            return
        await asyncio.sleep(0.05)
    raise AssertionError("the daemon never asked for the summary")


async def test_cancelling_the_task_of_a_typed_call_cancels_it_in_the_daemon(
    client: CompactdClient, data_dir: Path
) -> None:
    sid = await session(client, "cx-task")
    asked, release = await stalled(client)
    log_before = log_bytes(data_dir, sid)
    task = asyncio.ensure_future(client.compact(sid, work_done_token="cx-task-token"))
    await wait_asked(asked)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    # only a `$/cancelRequest` ends the daemon's work (the summary is still stalled)
    assert (await progress_of(client, "cx-task-token", "end"))["value"]["kind"] == "end"
    release.set()
    assert log_bytes(data_dir, sid) == log_before


async def test_a_timeout_cancels_the_call_in_the_daemon(
    client: CompactdClient, data_dir: Path
) -> None:
    sid = await session(client, "cx-timeout")
    asked, release = await stalled(client)
    log_before = log_bytes(data_dir, sid)
    with pytest.raises(TimeoutError):
        # the summary never answers: only the timeout ends the call (5 s: time enough to
        # reach the summary on a busy machine, so the daemon is inside it when the client gives up)
        await client.compact(sid, work_done_token="cx-timeout-token", timeout=5.0)
    assert asked  # the daemon was inside the summary when the client gave up
    assert (await progress_of(client, "cx-timeout-token", "end"))["value"]["kind"] == "end"
    release.set()
    assert log_bytes(data_dir, sid) == log_before


async def test_an_import_cancelled_at_once_keeps_nothing(client: CompactdClient) -> None:
    """The cancel arrives in the same read as the request (Ctrl-C right away): it is still
    answered, cancelled, and nothing of the transcript is kept — a later import is new."""
    path = str(TRANSCRIPTS / "openhands/multi_swe_bench_output.jsonl")
    before = {s.session_id for s in (await client.list_sessions()).sessions}
    msg_id, answer = client.send_request("session/import", {"path": path})
    client.cancel(msg_id)
    with pytest.raises(RpcError) as caught:
        await asyncio.wait_for(answer, WAIT)
    assert caught.value.code == -32800
    assert {s.session_id for s in (await client.list_sessions()).sessions} == before
    again = await client.import_transcript(path)
    assert len(again.session_ids) == 3 and again.existing == []


async def test_a_replay_stops_when_cancelled(client: CompactdClient) -> None:
    """`session/replay` runs off the loop and hears `$/cancelRequest`: cancelled once it has
    begun, it is answered as cancelled (it used to run to its end and answer the report)."""
    path = str(TRANSCRIPTS / "claude-code/64da7265-8f07-4967-b79f-0ae374c13330.jsonl")
    params = {"path": path, "window": 64000, "summaryProvider": "digest", "workDoneToken": "rp"}
    msg_id, answer = client.send_request("session/replay", params)
    await progress_of(client, "rp", "begin")
    assert (await client.status()).version  # the loop answers while the replay runs
    client.cancel(msg_id)
    with pytest.raises(RpcError) as caught:
        await asyncio.wait_for(answer, 120)
    assert caught.value.code == -32800
