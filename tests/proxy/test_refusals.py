"""A refusal writes nothing, and says what the API would say — on every wire, streamed or not:

- under `--window`, a turn whose newest step no longer fits is refused as the API refuses a
  prompt over its window (so the agent's own compaction runs), after the running turn's older
  results were cleared and only when that was not enough;
- a request without a key, refused by the upstream, leaves no session behind; a body that is not
  JSON by its content type is refused as the APIs refuse it;
- a request to an upstream that died since its last answer leaves its session as it was;
- conversations that name no session and start alike are kept apart, each in a session of its
  own (they do not queue behind each other in one session's turn)."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx2
import orjson
import pytest

from tests.support.fake_anthropic import FakeAnthropic, FakeAnthropicProcess
from tests.support.fake_openai import FakeOpenAI, FakeOpenAIProcess
from tests.support.proxy import ProxyProcess
from tests.support.wires import (
    WIRES,
    Call,
    Parallel,
    Said,
    Step,
    User,
    Wire,
    reset,
    upstream_bodies,
)

from .conftest import events_of, proxied, requests_logged, snapshot, usage_recorded

all_wires = pytest.mark.parametrize(
    "wire", [Wire(name, stream) for name in WIRES for stream in (False, True)], ids=str
)
RESULT = "".join(f"{n:05d} entry of a long listing, kept whole by no tier\n" for n in range(230))


def _step(n: int, calls: int = 3) -> list[Step]:
    return [Parallel(tuple(Call(f"call_{n}_{k}", RESULT, f"cat part{n}{k}") for k in range(calls)))]


def _results(body: dict[str, Any], wire: Wire) -> list[str]:
    """The text of every tool result a request holds, in order, as this wire writes it."""
    if wire.name == "messages":
        blocks = [
            b for m in body["messages"] if isinstance(m["content"], list) for b in m["content"]
        ]
        return [_text(b["content"]) for b in blocks if b["type"] == "tool_result"]
    if wire.name == "chat":
        return [_text(m["content"]) for m in body["messages"] if m["role"] == "tool"]
    return [_text(i["output"]) for i in body["input"] if i.get("type") == "function_call_output"]


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    return "".join(str(part.get("text", "")) for part in content if isinstance(part, dict))


def _error(response: Any, wire: Wire) -> dict[str, Any]:
    body = response.json()
    if wire.name == "messages":
        assert body["type"] == "error"
    else:
        assert set(body) == {"error"}
    return dict(body["error"])


# ---- a turn that does not fit -------------------------------------------------------------


@all_wires
def test_a_running_turn_is_shortened_then_refused_in_the_api_s_words(
    wire: Wire, tmp_path: Path
) -> None:
    with proxied(tmp_path / "data", window=9_000, args=["--summary-provider", "digest"]) as (
        capped,
        fakes,
    ):
        session = f"running-{wire.name}"
        history: list[Step] = [User("read every part, then sum them up")]
        for n in range(4):  # one running turn, three calls a step
            history += _step(n)
            response = wire.send(capped.base_url, history, session)
            assert response.status_code == 200, response.text[:300]
        shown = _results(upstream_bodies(fakes, wire)[-1], wire)
        assert len(shown) == 12
        # the running turn's older results went; its newest step's stayed whole
        assert all(RESULT[:400] in text for text in shown[-3:]), "newest step whole"
        assert not any(RESULT[:400] in text for text in shown[:3]), "oldest step kept"
        usage_recorded(tmp_path / "data", session, 4 if wire.reports_usage else 0)
        requests_logged(tmp_path / "data", session, 4)
        before = snapshot(tmp_path / "data")
        history += _step(4, calls=10)  # a newest step over the window by itself
        refused = wire.send(capped.base_url, history, session)
        assert snapshot(tmp_path / "data") == before  # the refusal wrote nothing
    assert refused.status_code == 400, refused.text[:300]
    error = _error(refused, wire)
    assert error["type"] == "invalid_request_error"
    if wire.name == "messages":
        words = error["message"].split()
        assert error["message"].startswith("prompt is too long: ")
        assert int(words[4]) > int(words[7]) and words[-1] == "maximum", error
    else:
        assert error["code"] == "context_length_exceeded", error
    assert "nothing more can be removed" not in refused.text  # the proxy's own words


# ---- refusals by the upstream, and bodies that are not JSON -----------------------------------


@all_wires
def test_a_request_without_a_key_is_refused_upstream_and_writes_nothing(
    proxy: ProxyProcess, fakes: tuple[FakeAnthropic, FakeOpenAI], wire: Wire
) -> None:
    reset(fakes)
    before = snapshot(proxy.data_dir)
    history: list[Step] = [User("who am I?"), Call(f"keyless-{wire}", RESULT)]
    response = wire.send(proxy.base_url, history, f"keyless-{wire.name}", key=None)
    assert response.status_code == 401, response.text[:300]
    assert snapshot(proxy.data_dir) == before
    assert len(upstream_bodies(fakes, wire)) == 1  # the upstream said no, not the proxy


@pytest.mark.parametrize("wire", [Wire(name) for name in WIRES], ids=str)
@pytest.mark.parametrize(
    "content_type", ["text/plain", "application/x-www-form-urlencoded", "multipart/form-data"]
)
def test_a_body_that_is_not_json_by_its_type_is_refused_as_the_api_refuses_it(
    proxy: ProxyProcess, fakes: tuple[FakeAnthropic, FakeOpenAI], wire: Wire, content_type: str
) -> None:
    reset(fakes)
    before = snapshot(proxy.data_dir)
    body = wire.body([User("x" * 2_000_000)])  # a well-formed request, 2 MB of it
    headers = {**wire.headers(f"typed-{wire.name}"), "content-type": content_type}
    response = httpx2.post(
        proxy.base_url + wire.path, content=orjson.dumps(body), headers=headers, timeout=60
    )
    assert response.status_code == 400, response.text[:300]
    error = _error(response, wire)
    assert error["type"] == "invalid_request_error" and content_type in error["message"]
    if wire.name != "messages":
        assert error["code"] == "unsupported_content_type"
    assert snapshot(proxy.data_dir) == before
    assert upstream_bodies(fakes, wire) == []


# ---- an upstream that died ----------------------------------------------------------------


@all_wires
def test_an_upstream_that_died_since_its_last_answer_leaves_the_session_as_it_was(
    tmp_path: Path, wire: Wire
) -> None:
    """Within the 30 s after an answer the upstream is not probed; the tail that request
    brought is held until the upstream takes it, and the 502 leaves nothing of it."""
    with (
        FakeAnthropicProcess() as anthropic,
        FakeOpenAIProcess() as openai,
        ProxyProcess(
            tmp_path / "data", anthropic=anthropic.base_url, openai=openai.base_url
        ) as proxy,
    ):
        history: list[Step] = [User("first"), Call("c-died-1", RESULT)]
        assert wire.send(proxy.base_url, history, "died").status_code == 200
        usage_recorded(tmp_path / "data", "died", 1 if wire.reports_usage else 0)
        anthropic.stop()  # killed: their connections go with them
        openai.stop()
        before = snapshot(tmp_path / "data")
        history += [Said("ok"), User("second"), Call("c-died-2", RESULT)]
        response = wire.send(proxy.base_url, history, "died")
        assert response.status_code == 502, response.text[:300]
        assert snapshot(tmp_path / "data") == before


# ---- conversations that name no session -----------------------------------------------------


@pytest.mark.parametrize("wire", [Wire("messages", True), Wire("chat"), Wire("responses")], ids=str)
def test_conversations_that_start_alike_get_sessions_of_their_own(
    tmp_path: Path, wire: Wire
) -> None:
    clients = 8
    with proxied(tmp_path / "data") as (proxy, _fakes):

        def converse(k: int) -> list[int]:
            history: list[Step] = [User("Summarize this repository.")]  # everyone's
            statuses = []
            for turn in range(6):
                statuses.append(wire.send(proxy.base_url, history).status_code)
                history += [Said(f"client {k} heard {turn}"), User(f"client {k}: {turn}")]
            return statuses

        with ThreadPoolExecutor(clients) as pool:
            statuses = [s for got in pool.map(converse, range(clients)) for s in got]
    assert statuses == [200] * clients * 6
    logs = sorted((tmp_path / "data" / "sessions").glob("*.jsonl"))
    assert len(logs) == clients  # one session each, however alike they began
    for log in logs:
        events = events_of(tmp_path / "data", log.stem)
        assert not [e for e in events if e.get("t") == "branch"], log.name  # none shared
