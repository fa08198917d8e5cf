"""Requests the proxy relays without managing them go where the client wrote them for, with the
client's key and to no one else: the model list by the request's provider headers (a bearer
token with `anthropic-version` is Anthropic's, not OpenAI's), Codex's remote compaction
(`POST /v1/responses/compact`) to the Responses upstream."""

from __future__ import annotations

import anthropic
import openai

from tests.support.fake_anthropic import MODELS, FakeAnthropic
from tests.support.fake_openai import FakeOpenAI
from tests.support.proxy import ProxyProcess

ANTHROPIC_TOKEN = "sk-ant-oat01-routes-0123456789"
OPENAI_KEY = "sk-proj-routes-0123456789"


def test_the_model_list_asked_with_an_anthropic_token_goes_to_anthropic(
    proxy: ProxyProcess, fakes: tuple[FakeAnthropic, FakeOpenAI]
) -> None:
    """`Authorization: Bearer sk-ant-…` with `anthropic-version` and no `x-api-key` (what the
    SDK sends with an auth token, as Claude Code does with ANTHROPIC_AUTH_TOKEN)."""
    messages, responses = fakes
    messages.reset()
    before = len(responses.records)
    client = anthropic.Anthropic(
        base_url=proxy.base_url, auth_token=ANTHROPIC_TOKEN, api_key=None, max_retries=0
    )
    listed = client.models.list()
    assert [m.id for m in listed.data] == list(MODELS)
    assert client.models.retrieve("claude-haiku-4-5").id == "claude-haiku-4-5"
    asked = [r for r in messages.requests if r.endpoint == "models"]
    assert [r.path for r in asked] == ["/v1/models", "/v1/models/claude-haiku-4-5"]
    assert all(r.api_key == ANTHROPIC_TOKEN for r in asked)
    seen = responses.records[before:]
    assert seen == []  # the key never went to the other provider


def test_the_model_list_asked_with_an_openai_key_goes_to_openai(
    proxy: ProxyProcess, fakes: tuple[FakeAnthropic, FakeOpenAI]
) -> None:
    messages, responses = fakes
    messages.reset()
    client = openai.OpenAI(base_url=f"{proxy.base_url}/v1", api_key=OPENAI_KEY, max_retries=0)
    assert "gpt-5-codex" in [m.id for m in client.models.list().data]
    assert responses.records[-1]["path"] == "/v1/models"
    assert responses.records[-1]["headers"]["authorization"] == f"Bearer {OPENAI_KEY}"
    assert messages.requests == []


def test_codex_remote_compaction_is_forwarded_with_the_client_s_key(
    proxy: ProxyProcess, fakes: tuple[FakeAnthropic, FakeOpenAI]
) -> None:
    """The answer is the upstream's (its compaction item rides in the history the client
    sends next, which the proxy takes like any rewritten history)."""
    responses = fakes[1]
    client = openai.OpenAI(base_url=f"{proxy.base_url}/v1", api_key=OPENAI_KEY, max_retries=0)
    history = [
        {"role": "user", "content": "list the files"},
        {"role": "assistant", "content": "a.txt b.txt"},
        {"role": "user", "content": "now compact"},
    ]
    compacted = client.responses.compact(
        model="gpt-5-codex",
        input=history,
        extra_headers={"x-codex-beta-features": "remote_compaction_v2", "session_id": "cmp-1"},
    )
    assert compacted.object == "response.compaction"
    assert [item.type for item in compacted.output] == ["message", "message", "compaction"]
    sent = responses.records[-1]
    assert sent["path"] == "/v1/responses/compact"
    assert sent["headers"]["authorization"] == f"Bearer {OPENAI_KEY}"
    assert sent["headers"]["x-codex-beta-features"] == "remote_compaction_v2"
    assert sent["body"]["input"] == history

    responses.queue.append({"kind": "text", "text": "Carrying on."})
    after = client.responses.create(
        model="gpt-5-codex",
        input=[
            *[i.model_dump(exclude_none=True, warnings=False) for i in compacted.output],
            {"role": "user", "content": "and then?"},
        ],
        extra_headers={"session_id": "cmp-1"},
    )
    assert after.output_text == "Carrying on."
    carried = responses.records[-1]["body"]["input"]
    assert any(item.get("type") == "compaction" for item in carried)


def test_an_anthropic_key_beside_an_openai_request_stays_home(
    proxy: ProxyProcess, fakes: tuple[FakeAnthropic, FakeOpenAI]
) -> None:
    """A client that sends both kinds of key (an environment with both set): the Responses
    request goes to OpenAI with its bearer token, without the Anthropic key or headers."""
    responses = fakes[1]
    client = openai.OpenAI(
        base_url=f"{proxy.base_url}/v1",
        api_key=OPENAI_KEY,
        max_retries=0,
        default_headers={"x-api-key": ANTHROPIC_TOKEN, "anthropic-version": "2023-06-01"},
    )
    responses.queue.append({"kind": "text", "text": "Hello."})
    client.responses.create(model="gpt-5-codex", input="hi", prompt_cache_key="both-keys")
    sent = responses.records[-1]["headers"]
    assert sent["authorization"] == f"Bearer {OPENAI_KEY}"
    assert "x-api-key" not in sent and "anthropic-version" not in sent
    assert ANTHROPIC_TOKEN not in str(sent)
