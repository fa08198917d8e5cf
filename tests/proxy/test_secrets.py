"""No key the proxy relays reaches a log line, an answer body or the store, whichever call it
was relayed on: compactd's own summary calls made with the client's key (an upstream or a
gateway may echo the key it refuses), and the client's own requests the upstream refuses in
words that quote the key."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anthropic
import httpx2
import orjson
import pytest

from tests.support.fake_anthropic import FakeAnthropic, Reply
from tests.support.fake_openai import FakeOpenAI
from tests.support.proxy import ProxyProcess

KEY = "sk-proj-echoed-0123456789abcdef"
ANTHROPIC_KEY = "sk-ant-api03-echoed-0123456789"
TURN = "word " * 400  # ~500 tokens a message: 40 turns are four times the window


def nowhere(key: str, proxy: ProxyProcess, *answers: Any) -> None:
    """`key` in none of the answers, the proxy's log, or any file of its data dir."""
    for text in answers:
        assert key not in text, text
    assert key not in proxy.log, proxy.log
    for path in Path(proxy.data_dir).rglob("*"):
        if path.is_file():
            assert key.encode() not in path.read_bytes(), path


def history(n: int) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = [{"role": "user", "content": "start"}]
    for i in range(n):
        items += [
            {"role": "assistant", "content": f"step {i} {TURN}"},
            {"role": "user", "content": f"go on {i} {TURN}"},
        ]
    return items


def test_a_summary_refusal_that_echoes_the_key_is_scrubbed(
    fakes: tuple[FakeAnthropic, FakeOpenAI], tmp_path: Path
) -> None:
    """A Responses session over a 20K window, the oldest turns not to be snipped: compactd's
    summaries go to the client's own upstream with the client's key, which refuses them and
    quotes the key. Nothing fits, so the client gets its API's own context-length refusal (its
    agent then compacts); the proxy's log names the summary's refusal, never the key."""
    _messages, responses = fakes
    default, responses.default = (
        responses.default,
        {
            "kind": "error",
            "status": 401,
            "message": f"Incorrect API key provided: {KEY}. You can find your API key at ...",
            "code": "invalid_api_key",
        },
    )
    with ProxyProcess(
        tmp_path / "data",
        openai=f"http://127.0.0.1:{responses.port}",
        window=20_000,
        args=["--summary-provider", "client", "--set", "snipEnabled=false"],
    ) as proxy:
        answer = httpx2.post(
            f"{proxy.base_url}/v1/responses",
            content=orjson.dumps(
                {"model": "gpt-5-codex", "input": history(40), "prompt_cache_key": "echo-1"}
            ),
            headers={"authorization": f"Bearer {KEY}", "content-type": "application/json"},
            timeout=120,
        )
    responses.default = default
    summaries = [r for r in responses.records if r["body"].get("store") is False]
    assert summaries and all(r["status"] == 401 for r in summaries)  # they were made, refused
    assert answer.status_code == 400, answer.text
    assert answer.json()["error"]["code"] == "context_length_exceeded", answer.text
    said = [line for line in proxy.log.splitlines() if "Incorrect API key provided" in line]
    assert said and all("***" in line for line in said), proxy.log  # named, its key is not
    nowhere(KEY, proxy, answer.text)


def test_the_upstream_s_refusal_of_the_client_s_own_request_is_scrubbed(
    fakes: tuple[FakeAnthropic, FakeOpenAI], tmp_path: Path
) -> None:
    """Whole, streamed before the first byte, and as an error event inside a stream."""
    messages, _responses = fakes
    with ProxyProcess(
        tmp_path / "data", anthropic=messages.base_url, args=["--summary-provider", "digest"]
    ) as proxy:
        client = anthropic.Anthropic(base_url=proxy.base_url, api_key=ANTHROPIC_KEY, max_retries=0)
        ask = {
            "model": "claude-sonnet-4-5",
            "max_tokens": 64,
            "messages": [{"role": "user", "content": "hello"}],
            "extra_headers": {"x-claude-code-session-id": "echo-2"},
        }
        seen = []
        messages.push(Reply.error(401, message=f"invalid x-api-key: {ANTHROPIC_KEY}"))
        with pytest.raises(anthropic.AuthenticationError) as refused:
            client.messages.create(**ask)
        seen.append(str(refused.value.body))
        messages.push(Reply.stream_error("Half", "overloaded_error", f"no {ANTHROPIC_KEY}"))
        with (
            pytest.raises(anthropic.APIStatusError) as broken,
            client.messages.stream(**ask) as stream,
        ):
            stream.get_final_message()
        seen.append(str(broken.value.body))
        assert broken.value.body["error"]["type"] == "overloaded_error"
    nowhere(ANTHROPIC_KEY, proxy, *seen)
