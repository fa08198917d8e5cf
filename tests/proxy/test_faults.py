"""An upstream answer that breaks reaches the client as a failure in its API's own shape, never
as a finished answer: a reset, a silence past `--upstream-idle-timeout`, an event that is not
JSON, a stream that ends before its last event, a recall follow-up the upstream refuses, a model
that keeps calling recall. Streamed, the client gets its wire's error event (Messages: `event:
error`; Chat Completions: a chunk holding `error`; Responses: `response.failed`) and its SDK
raises; before the first byte, and for whole answers, an error status in the API's shape (the
upstream's own for a refusal). A failed answer records nothing in its session, and the proxy
logs no traceback."""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anthropic
import httpx2
import openai
import orjson
import pytest

from tests.support.fake_anthropic import FakeAnthropic, Reply
from tests.support.fake_openai import FakeOpenAI
from tests.support.proxy import ProxyProcess

from .conftest import events_of, proxy_before

KEY = "sk-ant-faults-0123456789"
IDLE = 2  # --upstream-idle-timeout: how long a silent stream is waited for
MODEL = "claude-sonnet-4-5"
DANGER = {"type": "tool_use", "id": "toolu_rm", "name": "Bash", "input": {"command": "rm -rf b"}}
# the Messages stream of DANGER: message_start, ping, its block's start, two input deltas, its
# stop, message_delta, message_stop; after event 4 the client has half of its input
MID_CALL = 4
FAULTS = ["reset", "silence", "malformed", "end"]


@pytest.fixture(scope="module")
def proxy(
    fakes: tuple[FakeAnthropic, FakeOpenAI], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ProxyProcess]:
    data = tmp_path_factory.mktemp("faults") / "data"
    with proxy_before(fakes, data, "--upstream-idle-timeout", str(IDLE)) as running:
        yield running


@pytest.fixture(autouse=True)
def no_tracebacks(proxy: ProxyProcess) -> Iterator[None]:
    yield
    assert "Traceback" not in proxy.log and " ERROR " not in proxy.log, proxy.log


def usage_records(proxy: ProxyProcess, session: str, *, at_least: int = 0) -> int:
    """The session's usage records, once there are `at_least` (the proxy records an answer's
    usage after its client has it)."""
    path = proxy.data_dir / "sessions" / f"{session}.jsonl"
    deadline = time.monotonic() + 30
    while True:
        found = 0
        if path.exists():
            found = sum(
                1
                for e in events_of(proxy.data_dir, session)
                if e.get("t") == "record" and e["r"]["kind"] == "usage"
            )
        if found >= at_least or time.monotonic() > deadline:
            return found
        time.sleep(0.05)


def messages_client(proxy: ProxyProcess) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=proxy.base_url, api_key=KEY, max_retries=0, timeout=60)


def openai_client(proxy: ProxyProcess) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{proxy.base_url}/v1", api_key=KEY, max_retries=0, timeout=60)


def ask(session: str) -> dict[str, Any]:
    return {
        "model": MODEL,
        "max_tokens": 256,
        "messages": [{"role": "user", "content": f"clean the build ({session})"}],
        "extra_headers": {"x-claude-code-session-id": session},
    }


# ---- the Messages API ------------------------------------------------------------------


@pytest.mark.parametrize("fault", FAULTS)
def test_a_stream_broken_mid_call_is_an_error_event_the_sdk_raises(
    proxy: ProxyProcess, fakes: tuple[FakeAnthropic, FakeOpenAI], fault: str
) -> None:
    """Today the SDK would return the message with `stop_reason: null` and the call's input
    half-parsed to `{}` — an agent may run it."""
    fake = fakes[0]
    session = f"broken-stream-{fault}"
    fake.push(Reply.blocks([DANGER], stop_reason="tool_use").broken(fault, MID_CALL))
    with (
        pytest.raises(anthropic.APIStatusError) as raised,
        messages_client(proxy).messages.stream(**ask(session)) as stream,
    ):
        stream.get_final_message()
    assert raised.value.body["type"] == "error"
    assert raised.value.body["error"]["type"] == "api_error"
    assert usage_records(proxy, session) == 0  # a failed answer records nothing
    fake.push(Reply.answer("Cleaned."))  # the agent's retry goes through
    with messages_client(proxy).messages.stream(**ask(session)) as stream:
        assert stream.get_final_message().content[0].text == "Cleaned."
    assert usage_records(proxy, session, at_least=1) == 1  # the retry's, and only it


def test_a_stream_broken_before_its_first_event_is_a_502(
    proxy: ProxyProcess, fakes: tuple[FakeAnthropic, FakeOpenAI]
) -> None:
    fakes[0].push(Reply.answer("never").broken("reset", 0))
    with (
        pytest.raises(anthropic.InternalServerError) as raised,
        messages_client(proxy).messages.stream(**ask("broken-at-once")) as stream,
    ):
        stream.get_final_message()
    assert raised.value.status_code == 502
    assert raised.value.body["error"]["type"] == "api_error"


@pytest.mark.parametrize("fault", ["reset", "malformed", "end"])
def test_a_whole_answer_broken_on_its_way_is_a_502_in_the_api_s_shape(
    proxy: ProxyProcess, fakes: tuple[FakeAnthropic, FakeOpenAI], fault: str
) -> None:
    session = f"broken-whole-{fault}"
    fakes[0].push(Reply.blocks([DANGER], stop_reason="tool_use").broken(fault, 40))
    with pytest.raises(anthropic.InternalServerError) as raised:
        messages_client(proxy).messages.create(**ask(session))
    assert raised.value.status_code == 502
    assert raised.value.body["error"]["type"] == "api_error"
    assert usage_records(proxy, session) == 0


def failure(
    proxy: ProxyProcess, session: str, stream: bool, whole: type[anthropic.APIStatusError]
) -> anthropic.APIStatusError:
    """What the SDK raised for the request: streamed (at an error event), or whole (`whole`, by
    its status)."""
    client = messages_client(proxy)
    if stream:
        with (
            pytest.raises(anthropic.APIStatusError) as raised,
            client.messages.stream(**ask(session)) as events,
        ):
            events.get_final_message()
    else:
        with pytest.raises(whole) as raised:
            client.messages.create(**ask(session))
    return raised.value


def recall_call(n: int = 1) -> dict[str, Any]:
    return {
        "type": "tool_use",
        "id": f"toolu_recall_{n}",
        "name": "compactd_recall",
        "input": {"handle": "recall:nothing-here"},
    }


@pytest.mark.parametrize("stream", [True, False])
def test_a_recall_follow_up_the_upstream_refuses_reaches_the_client(
    proxy: ProxyProcess, fakes: tuple[FakeAnthropic, FakeOpenAI], stream: bool
) -> None:
    """The model's answer calls only `compactd_recall`; the proxy answers it and asks again,
    and the upstream refuses that (429). Streamed, the client gets the refusal as an error
    event; whole, the upstream's own status and body."""
    fake = fakes[0]
    session = f"refused-follow-up-{stream}"
    fake.push(Reply.blocks([recall_call()], stop_reason="tool_use"), Reply.rate_limited())
    raised = failure(proxy, session, stream, anthropic.RateLimitError)
    if not stream:
        assert raised.status_code == 429
    assert raised.body["error"]["type"] == "rate_limit_error"
    assert [r.status for r in fake.messages_requests()[-2:]] == [200, 429]
    assert usage_records(proxy, session) == 0


@pytest.mark.parametrize("stream", [True, False])
def test_a_model_that_keeps_recalling_is_an_error_not_an_end(
    proxy: ProxyProcess, fakes: tuple[FakeAnthropic, FakeOpenAI], stream: bool
) -> None:
    fake = fakes[0]
    session = f"recall-loop-{stream}"
    before = len(fake.messages_requests())
    for n in range(6):
        fake.push(Reply.blocks([recall_call(n)], stop_reason="tool_use"))
    raised = failure(proxy, session, stream, anthropic.InternalServerError)
    assert raised.body["error"]["type"] == "api_error"
    assert "compactd_recall" in raised.body["error"]["message"]
    assert len(fake.messages_requests()) - before == 4  # the request, then three rounds
    fake.reset()


# ---- Chat Completions ------------------------------------------------------------------

SHELL = {"type": "function", "function": {"name": "shell", "parameters": {"type": "object"}}}
# the chunks of a call: the role, the call's first half, its second half, the finish
HALF_A_CALL = 2


@pytest.mark.parametrize("fault", FAULTS)
def test_a_chat_stream_broken_mid_call_makes_the_sdk_raise(
    proxy: ProxyProcess, fakes: tuple[FakeAnthropic, FakeOpenAI], fault: str
) -> None:
    """Today the client's stream ends with half the call's arguments and no finish_reason,
    and the SDK reports nothing wrong."""
    fakes[1].queue.append(
        {
            "kind": "call",
            "name": "shell",
            "arguments": {"command": ["rm", "-rf", "build"]},
            "fault": fault,
            "at": HALF_A_CALL,
        }
    )
    fakes[1].fault_gate = gate = threading.Event()  # the break comes once the client has a part
    try:
        chunks = openai_client(proxy).chat.completions.create(
            model="gpt-4o",
            messages=[{"role": "user", "content": f"clean the build (chat {fault})"}],
            tools=[SHELL],
            stream=True,
            user=f"chat-broken-{fault}",
        )
        with pytest.raises(openai.APIError) as raised:
            for _chunk in chunks:
                gate.set()
    finally:
        fakes[1].fault_gate = None
    assert not isinstance(raised.value, openai.APIConnectionError)  # the API's error, in shape
    assert usage_records(proxy, f"chat-broken-{fault}") == 0


def test_a_whole_chat_answer_broken_on_its_way_is_a_502(
    proxy: ProxyProcess, fakes: tuple[FakeAnthropic, FakeOpenAI]
) -> None:
    fakes[1].queue.append({"kind": "text", "text": "All clean now.", "fault": "reset", "at": 30})
    with pytest.raises(openai.InternalServerError) as raised:
        openai_client(proxy).chat.completions.create(
            model="gpt-4o", messages=[{"role": "user", "content": "clean (chat whole)"}]
        )
    assert raised.value.status_code == 502
    assert set(raised.value.body) >= {"message", "type"}


# ---- Responses -------------------------------------------------------------------------


def stream_events(
    proxy: ProxyProcess, body: dict[str, Any], gate: threading.Event | None = None
) -> list[dict[str, Any]]:
    """The Responses events a client reads, as the wire carries them (`gate` set once the
    first of them is in)."""
    with httpx2.stream(
        "POST",
        f"{proxy.base_url}/v1/responses",
        content=orjson.dumps({**body, "stream": True}),
        headers={"authorization": f"Bearer {KEY}", "content-type": "application/json"},
        timeout=60,
    ) as response:
        assert response.status_code == 200
        raw = b""
        for part in response.iter_bytes():
            raw += part
            if gate is not None:
                gate.set()
    return [
        orjson.loads(line[6:])
        for line in raw.splitlines()
        if line.startswith(b"data: ") and line[6:].startswith(b"{")
    ]


@pytest.mark.parametrize("fault", FAULTS)
def test_a_responses_stream_broken_mid_answer_ends_in_response_failed(
    proxy: ProxyProcess, fakes: tuple[FakeAnthropic, FakeOpenAI], fault: str
) -> None:
    """`response.failed`, its error a `server_error`: what Codex retries on (today the stream
    just stops, and the SDK is left waiting for a completion that never comes)."""
    fake = fakes[1]
    key = f"responses-broken-{fault}"
    fake.queue.append({"kind": "text", "text": "Half of this arrives.", "fault": fault, "at": 4})
    fake.fault_gate = gate = threading.Event()  # the break comes once the client has a part
    try:
        events = stream_events(
            proxy,
            {"model": "gpt-5-codex", "input": "clean the build", "prompt_cache_key": key},
            gate,
        )
    finally:
        fake.fault_gate = None
    last = events[-1]
    assert last["type"] == "response.failed", [e["type"] for e in events]
    assert last["response"]["status"] == "failed"
    assert last["response"]["error"]["code"] == "server_error"
    assert last["response"]["id"] == events[0]["response"]["id"]
    numbers = [e["sequence_number"] for e in events]
    assert numbers == list(range(len(events)))
    assert usage_records(proxy, key) == 0

    fake.queue.append({"kind": "text", "text": "Once more.", "fault": fault, "at": 4})
    fake.fault_gate = gate = threading.Event()
    try:
        with (
            pytest.raises(RuntimeError, match=re.escape("response.completed")),
            openai_client(proxy).responses.stream(
                model="gpt-5-codex", input="clean the build", prompt_cache_key=key
            ) as stream,
        ):
            for _event in stream:
                gate.set()
            stream.get_final_response()
    finally:
        fake.fault_gate = None


@pytest.mark.parametrize("stream", [True, False])
def test_a_responses_recall_follow_up_the_upstream_refuses_reaches_the_client(
    proxy: ProxyProcess, fakes: tuple[FakeAnthropic, FakeOpenAI], stream: bool
) -> None:
    fake = fakes[1]
    key = f"responses-refused-{stream}"
    fake.queue.append(
        {"kind": "call", "name": "compactd_recall", "arguments": {"handle": "recall:none"}}
    )
    fake.queue.append(
        {
            "kind": "error",
            "status": 429,
            "message": "Rate limit reached. Please try again in 2s.",
            "code": "rate_limit_exceeded",
        }
    )
    body = {"model": "gpt-5-codex", "input": "what is in it?", "prompt_cache_key": key}
    if stream:
        last = stream_events(proxy, body)[-1]
        assert last["type"] == "response.failed"
        assert last["response"]["error"]["code"] == "rate_limit_exceeded"
        assert "try again in 2s" in last["response"]["error"]["message"]
    else:
        with pytest.raises(openai.RateLimitError) as raised:
            openai_client(proxy).responses.create(**body)
        assert raised.value.code == "rate_limit_exceeded"
    assert [r["status"] for r in fake.records[-2:]] == [200, 429]
    assert usage_records(proxy, key) == 0


def test_a_responses_model_that_keeps_recalling_is_a_failure(
    proxy: ProxyProcess, fakes: tuple[FakeAnthropic, FakeOpenAI]
) -> None:
    fake = fakes[1]
    for n in range(6):
        fake.queue.append(
            {"kind": "call", "name": "compactd_recall", "arguments": {"handle": f"recall:{n}"}}
        )
    before = len(fake.records)
    events = stream_events(
        proxy, {"model": "gpt-5-codex", "input": "dig", "prompt_cache_key": "responses-loop"}
    )
    assert events[-1]["type"] == "response.failed"
    assert "compactd_recall" in events[-1]["response"]["error"]["message"]
    assert len(fake.records) - before == 4
    fake.queue.clear()


def test_the_idle_bound_is_a_setting(tmp_path: Path) -> None:
    """A bound of zero or less is refused at start-up, naming the flag."""
    import subprocess
    import sys

    from tests.support.proxy import ROOT

    done = subprocess.run(
        [sys.executable, "-m", "compactd", "proxy", "--upstream-idle-timeout", "0"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        env={"COMPACTD_DATA_DIR": str(tmp_path), "PATH": "/usr/bin:/bin"},
    )
    assert done.returncode != 0 and "--upstream-idle-timeout" in done.stderr
