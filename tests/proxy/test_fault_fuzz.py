"""Faults at every point of an answer, fuzzed, through a real proxy on every wire it speaks.

Each example scripts one answer of up to four rounds (the model calling only `compactd_recall`
before it answers, which the proxy answers itself and follows up), and breaks one round as a
network does — reset, silence past the idle bound, an event that is not JSON, a clean close
where it stands — at a random event (a stream) or byte (a whole answer), or has the upstream
refuse it (429, 500, 529), or lets the model keep recalling past the proxy's bound. Whatever
happens, the client gets its answer's end or an error in its API's own shape — never an answer
cut short — and nothing half-written reaches the session: a failed answer records no usage,
and the agent's retry of the same request is answered and adds no node.

Budget: `COMPACTD_FUZZ_EXAMPLES` (default below), derandomized unless `COMPACTD_FUZZ_RANDOM`
is set, as the daemon's fuzz suite.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from typing import Any

import httpx2
import orjson
import pytest
from hypothesis import Phase, event, given
from hypothesis import strategies as st

from tests.support.fake_anthropic import FakeAnthropic, Reply
from tests.support.fake_openai import FakeOpenAI
from tests.support.fuzz import budget
from tests.support.proxy import ProxyProcess

from .conftest import events_of, proxy_before

KEY = "sk-ant-fault-fuzz-0123456789"
IDLE = 1
# an example takes up to seconds (a silence waits out the idle bound): no shrinking
FUZZ = budget(60, phases=[Phase.explicit, Phase.reuse, Phase.generate])
SESSIONS = itertools.count()
FINAL = "The value is 42."


@pytest.fixture(scope="module")
def proxy(
    fakes: tuple[FakeAnthropic, FakeOpenAI], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ProxyProcess]:
    data = tmp_path_factory.mktemp("fault-fuzz") / "data"
    with proxy_before(fakes, data, "--upstream-idle-timeout", str(IDLE)) as running:
        yield running
    assert "Traceback" not in running.log and " ERROR " not in running.log, running.log


# ---- what each wire is sent, and what its client got ----------------------------------------


def request(wire: str, session: str, stream: bool) -> tuple[str, dict[str, Any], dict[str, str]]:
    question = f"what is the value? ({session})"
    if wire == "messages":
        body: dict[str, Any] = {
            "model": "claude-sonnet-4-5",
            "max_tokens": 256,
            "messages": [{"role": "user", "content": question}],
        }
        headers = {
            "x-api-key": KEY,
            "anthropic-version": "2023-06-01",
            "x-claude-code-session-id": session,
        }
        path = "/v1/messages"
    elif wire == "responses":
        body = {"model": "gpt-5-codex", "input": question, "prompt_cache_key": session}
        headers = {"authorization": f"Bearer {KEY}"}
        path = "/v1/responses"
    else:
        body = {"model": "gpt-4o", "messages": [{"role": "user", "content": question}]}
        body["user"] = session
        headers = {"authorization": f"Bearer {KEY}"}
        path = "/v1/chat/completions"
    if stream:
        body["stream"] = True
        if wire == "chat":
            body["stream_options"] = {"include_usage": True}  # else no usage to record
    return path, body, {**headers, "content-type": "application/json"}


def sse(raw: bytes) -> list[tuple[str | None, Any]]:
    events = []
    for block in raw.replace(b"\r\n", b"\n").split(b"\n\n"):
        name, data = None, None
        for line in block.split(b"\n"):
            if line.startswith(b"event:"):
                name = line[6:].strip().decode()
            elif line.startswith(b"data:"):
                text = line[5:].strip()
                data = text.decode() if text == b"[DONE]" else orjson.loads(text)
        if name is not None or data is not None:
            events.append((name, data))
    return events


def outcome(wire: str, stream: bool, status: int, raw: bytes, recalls: int = 0) -> str:
    """ "answer" (whole, with its end) or "error" (in the wire's shape); anything else fails."""
    if not stream or status != 200:
        body = orjson.loads(raw)
        if status != 200:
            if wire == "messages":
                assert body["type"] == "error" and body["error"]["type"], body
            else:
                assert isinstance(body["error"]["message"], str), body
            return "error"
        if wire == "messages":
            assert body["stop_reason"] == "end_turn" and body["content"][-1]["text"] == FINAL
        elif wire == "responses":
            assert body["status"] == "completed"
            assert body["output"][-1]["content"][0]["text"] == FINAL
        else:
            assert body["choices"][0]["message"]["content"] == FINAL
        return "answer"
    events = sse(raw)
    assert events, raw
    last_name, last = events[-1]
    if wire == "messages":
        if last_name == "error":
            assert last["type"] == "error" and last["error"]["type"], last
            return "error"
        assert last_name == "message_stop", events
        text = "".join(
            d["delta"].get("text", "")
            for n, d in events
            if n == "content_block_delta" and isinstance(d, dict)
        )
        assert text == "Let me look." * recalls + FINAL  # every round's text, once
        assert [n for n, _ in events].count("message_start") == 1
        return "answer"
    if wire == "responses":
        kinds = [d["type"] for _, d in events]
        assert [d["sequence_number"] for _, d in events] == list(range(len(events)))
        if last["type"] == "response.failed":
            assert last["response"]["error"]["message"], last
            return "error"
        assert last["type"] == "response.completed", kinds
        assert last["response"]["output"][-1]["content"][0]["text"] == FINAL
        assert kinds.count("response.created") == 1
        return "answer"
    chunks = [d for _, d in events if isinstance(d, dict)]
    if "error" in chunks[-1]:
        assert chunks[-1]["error"]["message"], chunks[-1]
        return "error"
    # `[DONE]`, or the stream closed cleanly after its finish chunk (some servers omit it)
    finishes = [c for c in chunks if any(ch.get("finish_reason") for ch in c.get("choices", []))]
    assert last == "[DONE]" or finishes, events
    text = "".join(
        c["choices"][0]["delta"].get("content") or "" for c in chunks if c.get("choices")
    )
    assert text == FINAL
    return "answer"


# ---- the scripted rounds -------------------------------------------------------------------


def anthropic_rounds(recalls: int) -> list[Reply]:
    calls = [
        Reply.blocks(
            [
                {"type": "text", "text": "Let me look."},
                {
                    "type": "tool_use",
                    "id": f"toolu_recall_{n}",
                    "name": "compactd_recall",
                    "input": {"handle": f"recall:none-{n}"},
                },
            ],
            stop_reason="tool_use",
        )
        for n in range(recalls)
    ]
    return [*calls, Reply.answer(FINAL)]


def openai_rounds(recalls: int) -> list[dict[str, Any]]:
    calls = [
        {
            "kind": "call",
            "name": "compactd_recall",
            "call_id": f"call_recall_{n}",
            "arguments": {"handle": f"recall:none-{n}"},
        }
        for n in range(recalls)
    ]
    return [*calls, {"kind": "text", "text": FINAL}]


def broken(reply: Any, fault: str, at: int) -> Any:
    if fault.isdigit():  # the upstream refuses the round
        if isinstance(reply, Reply):
            return Reply.error(int(fault))
        return {"kind": "error", "status": int(fault), "message": "refused", "code": None}
    if isinstance(reply, Reply):
        return reply.broken(fault, at)
    return {**reply, "fault": fault, "at": at}


def usage(proxy: ProxyProcess, session: str) -> int:
    path = proxy.data_dir / "sessions" / f"{session}.jsonl"
    if not path.exists():
        return 0
    return sum(
        1
        for e in events_of(proxy.data_dir, session)
        if e.get("t") == "record" and e["r"]["kind"] == "usage"
    )


def nodes(proxy: ProxyProcess, session: str) -> int:
    return sum(1 for e in events_of(proxy.data_dir, session) if e.get("t") == "node")


def send(proxy: ProxyProcess, path: str, body: dict[str, Any], headers: dict[str, str]) -> Any:
    with httpx2.stream(
        "POST", proxy.base_url + path, content=orjson.dumps(body), headers=headers, timeout=60
    ) as response:
        return response.status_code, b"".join(response.iter_bytes())


def settled(proxy: ProxyProcess, session: str, at_least: int) -> int:
    """The session's usage records once the proxy has written `at_least` (it records an
    answer's usage after its client has it)."""
    import time

    deadline = time.monotonic() + 30
    while (found := usage(proxy, session)) < at_least and time.monotonic() < deadline:
        time.sleep(0.05)
    return found


@FUZZ
@given(data=st.data())
def test_fuzz_faults_end_in_an_answer_or_an_error_and_write_nothing_half(
    proxy: ProxyProcess, fakes: tuple[FakeAnthropic, FakeOpenAI], data: st.DataObject
) -> None:
    messages, responses = fakes
    wire = data.draw(st.sampled_from(["messages", "responses", "chat"]), label="wire")
    stream = data.draw(st.booleans(), label="stream")
    recall = not (wire == "chat" and stream)  # a streamed Chat Completions call has no recall
    recalls = data.draw(st.integers(0, 4 if recall else 0), label="recall rounds")
    rounds_index = st.integers(0, recalls)
    faulty = data.draw(st.one_of(rounds_index, rounds_index, st.none()), label="broken round")
    fault = data.draw(
        st.sampled_from(["reset", "silence", "malformed", "end", "429", "500", "529"]),
        label="fault",
    )
    at = data.draw(st.integers(0, 14 if stream else 400), label="at event or byte")

    session = f"fuzz-{next(SESSIONS)}"
    rounds: list[Any] = anthropic_rounds(recalls) if wire == "messages" else openai_rounds(recalls)
    if faulty is not None:
        rounds[faulty] = broken(rounds[faulty], fault, at)
    if wire == "messages":
        messages.reset()
        messages.push(*rounds)
    else:
        responses.queue.clear()
        responses.queue.extend(rounds)

    path, body, headers = request(wire, session, stream)
    status, raw = send(proxy, path, body, headers)
    got = outcome(wire, stream, status, raw, recalls)
    event(f"{wire} {'stream' if stream else 'whole'}: {fault if faulty is not None else 'none'}")
    event(f"outcome: {got}")
    if faulty is None:  # no fault: an answer, unless the model recalled past the bound
        assert got == ("error" if recalls > 3 else "answer"), raw
    elif recalls > 3 and faulty == recalls:
        assert got == "error"  # the loop is cut before the broken round is even asked
    # an answer's usage is recorded (a Chat Completions stream closed before its usage chunk
    # has none to record); a failed answer records nothing
    counted = got == "answer" and (wire != "chat" or not stream or b'"prompt_tokens"' in raw)
    after = settled(proxy, session, int(counted))
    assert after == int(counted)
    held = nodes(proxy, session)

    # the agent retries the same request: answered, nothing stored twice
    if wire == "messages":
        messages.reset()
        messages.push(Reply.answer(FINAL))
    else:
        responses.queue.clear()
        responses.queue.append({"kind": "text", "text": FINAL})
    status, raw = send(proxy, path, body, headers)
    assert outcome(wire, stream, status, raw) == "answer"
    assert settled(proxy, session, after + 1) == after + 1
    assert nodes(proxy, session) == held
