"""The Gemini API through a real `compactd proxy`, against a loopback Gemini API as strict as
the real one (`tests.support.fake_gemini`): the official SDK (`google-genai`) whole and
streamed, a token count of what compactd would send, a session past a small window with no 400,
the upstream's own "input token count exceeds" taken by Tier 5 and retried, refusals and a
stream broken mid-way in the API's own error shape, and the key kept to its provider."""

from __future__ import annotations

import json
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from google import genai
from google.genai import errors, types

from tests.support.fake_gemini import FakeGemini, prompt_tokens
from tests.support.proxy import ProxyProcess

KEY = "AIzaSy-test-gemini-key-0123456789abcdef"
MODEL = "gemini-2.5-pro"
WINDOW = 16_000


@pytest.fixture(scope="module")
def fake() -> Iterator[FakeGemini]:
    running = FakeGemini().start()
    try:
        yield running
    finally:
        running.stop()


@pytest.fixture
def upstream(fake: FakeGemini) -> FakeGemini:
    """The fake as a test finds it: no script, no window, no records."""
    with fake.lock:
        fake.records.clear()
        fake.queue.clear()
        fake.previous.clear()
    fake.default = {"kind": "text", "text": "Hello from the fake."}
    fake.context_window = None
    fake.fault_gate = None
    return fake


@pytest.fixture(scope="module")
def proxy(fake: FakeGemini, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ProxyProcess]:
    data = tmp_path_factory.mktemp("gemini") / "data"
    with ProxyProcess(
        data,
        gemini=f"http://127.0.0.1:{fake.port}",
        window=WINDOW,
        args=["--summary-provider", "digest"],
    ) as running:
        yield running
    assert running.returncode == 0, running.log
    assert KEY not in running.log


def client(base_url: str) -> genai.Client:
    return genai.Client(
        api_key=KEY,
        http_options=types.HttpOptions(base_url=base_url, api_version="v1beta"),
    )


def post(base_url: str, method: str, body: Any, key: str = KEY) -> tuple[int, bytes]:
    """One raw request to `…/v1beta/models/MODEL:method` (the answer's status and bytes)."""
    url = f"{base_url}/v1beta/models/{MODEL}:{method}"
    if method == "streamGenerateContent":
        url += "?alt=sse"
    request = urllib.request.Request(
        url,
        data=json.dumps(body).encode(),
        headers={"content-type": "application/json", "x-goog-api-key": key},
        method="POST",
    )
    try:
        with urllib.request.urlopen(request, timeout=120) as answer:  # loopback only
            return answer.status, answer.read()
    except urllib.error.HTTPError as refused:
        return refused.code, refused.read()


def output_of(args: dict[str, Any]) -> str:
    """What the scripted model's `seq` command prints (the fake decides from it alone)."""
    command = str(args["command"])
    form = command.split("'")[1]
    count = int(command.rsplit(" ", 1)[1])
    return "\n".join(form.replace("%05g", f"{i:05d}") for i in range(1, count + 1))


SYSTEM = {"parts": [{"text": "You are a coding agent."}]}
TOOLS = [{"functionDeclarations": [{"name": "run_shell_command", "parameters": {}}]}]


def session(
    base_url: str, steps: int, prompt: str = "list the outputs"
) -> tuple[list[int], list[dict[str, Any]]]:
    """A tool-using session as an agent runs it, by hand over raw HTTP: each function call of
    the scripted model answered with its output until it is done; the statuses seen and the
    conversation."""
    contents: list[dict[str, Any]] = [{"role": "user", "parts": [{"text": prompt}]}]
    statuses = []
    for _ in range(steps + 2):
        body = {"systemInstruction": SYSTEM, "tools": TOOLS, "contents": contents}
        status, data = post(base_url, "generateContent", body)
        statuses.append(status)
        if status != 200:
            return statuses, contents
        content = json.loads(data)["candidates"][0]["content"]
        contents.append(content)
        calls = [p["functionCall"] for p in content["parts"] if "functionCall" in p]
        if not calls:
            return statuses, contents
        contents.append(
            {
                "role": "user",
                "parts": [
                    {
                        "functionResponse": {
                            "name": c["name"],
                            "response": {"output": output_of(c["args"])},
                        }
                    }
                    for c in calls
                ],
            }
        )
    return statuses, contents


# ---- the SDK ----------------------------------------------------------------------------------


def test_the_sdk_whole_and_streamed(proxy: ProxyProcess, upstream: FakeGemini) -> None:
    sdk = client(proxy.base_url)
    whole = sdk.models.generate_content(model=MODEL, contents="What is in the box?")
    assert whole.text == "Hello from the fake."
    assert whole.usage_metadata is not None and whole.usage_metadata.prompt_token_count
    chunks = list(sdk.models.generate_content_stream(model=MODEL, contents="And now?"))
    assert len(chunks) == 2  # as the upstream streamed them
    assert "".join(c.text or "" for c in chunks) == "Hello from the fake."
    assert chunks[-1].candidates and chunks[-1].candidates[0].finish_reason == "STOP"
    seen = upstream.requests()
    assert [r["status"] for r in seen] == [200, 200]
    assert all(r["headers"]["x-goog-api-key"] == KEY for r in seen)
    assert seen[1]["path"].endswith(":streamGenerateContent") and seen[1]["query"] == "alt=sse"


def test_a_session_past_the_window_gets_no_400(proxy: ProxyProcess, upstream: FakeGemini) -> None:
    """Straight, the session is refused once its history passes the window; through the proxy
    it completes, every prompt under the window, thought signatures passed back intact (the
    fake refuses one it did not issue, and a current call that lost its own)."""
    upstream.default = {"kind": "agent", "steps": 24, "lines": 150}
    upstream.context_window = WINDOW
    straight, _ = session(f"http://127.0.0.1:{upstream.port}", 24)
    assert straight[-1] == 400
    with upstream.lock:
        upstream.records.clear()
        upstream.previous.clear()
    through, contents = session(proxy.base_url, 24)
    assert through == [200] * 25
    assert contents[-1]["parts"][-1]["text"] == "Done: ran 24 commands."
    seen = upstream.requests()
    assert [r["status"] for r in seen] == [200] * 25
    assert max(r["prompt_tokens"] for r in seen) <= WINDOW
    assert prompt_tokens({"contents": contents}) > 2 * WINDOW  # what it would have sent


def test_the_upstreams_overflow_is_taken_by_tier_5_and_retried(
    proxy: ProxyProcess, upstream: FakeGemini
) -> None:
    """An upstream whose window is smaller than the proxy's: its "input token count exceeds"
    refusal is read, the request rendered smaller and sent once more, and the client sees
    only the answer."""
    upstream.default = {"kind": "agent", "steps": 12, "lines": 150}
    statuses, contents = session(proxy.base_url, 12, "list the outputs once")
    assert statuses[-1] == 200
    small = upstream.requests()[-1]["prompt_tokens"] * 2 // 3  # under what the proxy sends
    upstream.context_window = small
    upstream.default = {"kind": "text", "text": "All listed."}
    with upstream.lock:
        upstream.records.clear()
    more = [*contents, {"role": "user", "parts": [{"text": "anything else?"}]}]
    status, data = post(
        proxy.base_url,
        "generateContent",
        {"systemInstruction": SYSTEM, "tools": TOOLS, "contents": more},
    )
    assert status == 200, data
    assert json.loads(data)["candidates"][0]["content"]["parts"][0]["text"] == "All listed."
    seen = upstream.requests()
    assert [r["status"] for r in seen] == [400, 200]
    assert "exceeds the maximum number of tokens allowed" in seen[0]["error"]
    assert seen[1]["prompt_tokens"] <= small


def test_a_token_count_is_of_what_compactd_would_send(
    proxy: ProxyProcess, upstream: FakeGemini
) -> None:
    upstream.default = {"kind": "agent", "steps": 10, "lines": 200}
    statuses, contents = session(proxy.base_url, 10, "list the outputs to count")
    assert statuses[-1] == 200
    more = [*contents, {"role": "user", "parts": [{"text": "and now?"}]}]
    body = {"systemInstruction": SYSTEM, "tools": TOOLS, "contents": more}
    status, data = post(proxy.base_url, "countTokens", body)
    assert status == 200, data
    assert 0 < json.loads(data)["totalTokens"] < prompt_tokens(body)


# ---- failures in the API's shape --------------------------------------------------------------


def test_a_stream_broken_mid_way_is_a_failure_in_the_apis_shape(
    proxy: ProxyProcess, upstream: FakeGemini
) -> None:
    """The upstream resets the connection once the client has the first chunk: the client's
    stream ends with the API's own error event (the SDK raises it), never a short answer
    taken for whole."""
    upstream.fault_gate = gate = threading.Event()
    upstream.queue.append({"kind": "reset", "text": "This answer never ends."})
    sdk = client(proxy.base_url)
    stream = sdk.models.generate_content_stream(model=MODEL, contents="go")
    first = next(stream)
    assert first.text == "This answer"
    gate.set()
    with pytest.raises(errors.APIError) as raised:
        list(stream)
    assert raised.value.code == 502
    assert raised.value.status == "UNAVAILABLE"


def test_the_failure_event_is_the_apis_error_shape(
    proxy: ProxyProcess, upstream: FakeGemini
) -> None:
    """On the wire: after the first chunk, one event holding only the API's `error`."""
    upstream.fault_gate = gate = threading.Event()
    upstream.queue.append({"kind": "reset", "text": "This answer never ends."})
    body = {"contents": [{"role": "user", "parts": [{"text": "go"}]}]}
    request = urllib.request.Request(
        f"{proxy.base_url}/v1beta/models/{MODEL}:streamGenerateContent?alt=sse",
        data=json.dumps(body).encode(),
        headers={"content-type": "application/json", "x-goog-api-key": KEY},
        method="POST",
    )
    with urllib.request.urlopen(request, timeout=120) as answer:  # loopback only
        assert answer.status == 200
        first = b""
        while not first.endswith(b"\r\n\r\n"):
            line = answer.readline()
            assert line, first
            first += line
        gate.set()
        rest = answer.read()
    assert json.loads(first.strip()[6:])["candidates"][0]["content"]["parts"][0]["text"]
    events = rest.strip().split(b"\r\n\r\n")
    assert len(events) == 1 and events[0].startswith(b"data: "), rest
    error = json.loads(events[0][6:])
    assert set(error) == {"error"}
    assert set(error["error"]) == {"code", "message", "status"}
    assert error["error"]["code"] == 502 and error["error"]["status"] == "UNAVAILABLE"


def test_a_broken_pairing_is_refused_in_the_apis_words_and_sent_nowhere(
    proxy: ProxyProcess, upstream: FakeGemini
) -> None:
    contents = [
        {"role": "user", "parts": [{"text": "go"}]},
        {"role": "user", "parts": [{"functionResponse": {"name": "f", "response": {}}}]},
    ]
    status, data = post(proxy.base_url, "generateContent", {"contents": contents})
    assert status == 400
    error = json.loads(data)["error"]
    assert error["status"] == "INVALID_ARGUMENT" and error["code"] == 400
    assert (
        "function response turn comes immediately after a function call turn" in (error["message"])
    )
    assert upstream.requests() == []


def test_an_unknown_method_is_refused_in_the_apis_shape(proxy: ProxyProcess) -> None:
    status, data = post(proxy.base_url, "embedThings", {"contents": []})
    assert status == 404
    assert json.loads(data)["error"]["status"] == "NOT_FOUND"


def test_the_key_reaches_only_its_provider(proxy: ProxyProcess, upstream: FakeGemini) -> None:
    """A Gemini key is never logged or kept, and a request without one is the upstream's own
    403 in its words."""
    status, data = post(
        proxy.base_url,
        "generateContent",
        {"contents": [{"role": "user", "parts": [{"text": "hi"}]}]},
        key="",
    )
    assert status == 403
    assert json.loads(data)["error"]["status"] == "PERMISSION_DENIED"
    for path in Path(proxy.data_dir).rglob("*"):
        if path.is_file():
            assert KEY.encode() not in path.read_bytes(), path
