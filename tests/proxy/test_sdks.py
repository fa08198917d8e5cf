"""The official SDKs through a real `compactd proxy`: anthropic's Messages (streamed and not, the
beta path Claude Code uses too), openai's Responses and Chat Completions (streamed and not).
Each answer is the upstream's, each upstream request carries compactd's rendering of the
session, and the conversation lands in its session, the new tail only."""

from __future__ import annotations

import anthropic
import openai

from tests.support.fake_anthropic import FakeAnthropic, Reply
from tests.support.fake_openai import FakeOpenAI
from tests.support.proxy import ProxyProcess

from .conftest import events_of, nodes_of

KEY = "sk-test-proxy-key-0123456789"


# ---- Anthropic -------------------------------------------------------------------------


def test_anthropic_sdk_create_and_the_session_keeps_only_the_tail(
    proxy: ProxyProcess, fakes: tuple[FakeAnthropic, FakeOpenAI]
) -> None:
    fake = fakes[0]
    fake.reset()
    client = anthropic.Anthropic(base_url=proxy.base_url, api_key=KEY, max_retries=0)
    meta = {"user_id": '{"session_id": "sdk-create-1"}'}
    first = [{"role": "user", "content": "What is in the box?"}]
    fake.push(Reply.answer("A cat."))
    reply = client.messages.create(
        model="claude-sonnet-4-5", max_tokens=256, messages=first, metadata=meta
    )
    assert reply.content[0].text == "A cat."
    assert reply.usage.input_tokens > 0
    sent = fake.last_request.body
    assert sent["messages"][0]["content"][0]["text"] == "What is in the box?"
    assert sent["metadata"] == meta  # the client's own fields ride along
    assert fake.last_request.api_key == KEY

    fake.push(Reply.answer("Grey."))
    second = [
        *first,
        {"role": "assistant", "content": [{"type": "text", "text": "A cat."}]},
        {"role": "user", "content": "What colour?"},
    ]
    reply = client.messages.create(
        model="claude-sonnet-4-5", max_tokens=256, messages=second, metadata=meta
    )
    assert reply.content[0].text == "Grey."
    nodes = nodes_of(proxy.data_dir, "sdk-create-1")
    assert [n["kind"] for n in nodes] == ["user", "assistant", "user"]  # nothing twice
    usage = [e for e in events_of(proxy.data_dir, "sdk-create-1") if e.get("t") == "record"]
    assert any(r["r"]["kind"] == "usage" for r in usage)  # the upstream's count was reported


def test_anthropic_sdk_stream_through_the_beta_path(
    proxy: ProxyProcess, fakes: tuple[FakeAnthropic, FakeOpenAI]
) -> None:
    fake = fakes[0]
    fake.reset()
    client = anthropic.Anthropic(base_url=proxy.base_url, api_key=KEY, max_retries=0)
    thinking = {"type": "thinking", "thinking": "Let me look.", "signature": "sig-opaque-123"}
    fake.push(Reply.blocks([thinking, {"type": "text", "text": "Streamed hello."}]))
    with client.beta.messages.stream(
        model="claude-sonnet-4-5",
        max_tokens=2048,
        thinking={"type": "enabled", "budget_tokens": 1024},
        messages=[{"role": "user", "content": "Say hello"}],
        betas=["context-management-2025-06-27"],
        extra_headers={"x-claude-code-session-id": "sdk-stream-1"},
        extra_query={"beta": "true"},  # the form Claude Code uses
    ) as stream:
        text = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert text == "Streamed hello."
    assert final.content[0].signature == "sig-opaque-123"  # byte for byte
    request = fake.last_request
    assert request.query.get("beta") == ["true"]
    assert "context-management-2025-06-27" in request.betas
    assert (proxy.data_dir / "sessions" / "sdk-stream-1.jsonl").exists()


def test_anthropic_count_tokens_counts_what_compactd_would_send(
    proxy: ProxyProcess, fakes: tuple[FakeAnthropic, FakeOpenAI]
) -> None:
    fake = fakes[0]
    fake.reset()
    client = anthropic.Anthropic(base_url=proxy.base_url, api_key=KEY, max_retries=0)
    counted = client.messages.count_tokens(
        model="claude-sonnet-4-5", messages=[{"role": "user", "content": "count me"}]
    )
    assert counted.input_tokens > 0
    assert fake.last_request.endpoint == "count_tokens"


# ---- OpenAI ----------------------------------------------------------------------------


def test_openai_sdk_responses_create_and_stream(
    proxy: ProxyProcess, fakes: tuple[FakeAnthropic, FakeOpenAI]
) -> None:
    fake = fakes[1]
    client = openai.OpenAI(base_url=f"{proxy.base_url}/v1", api_key=KEY, max_retries=0)
    fake.queue.append({"kind": "text", "text": "Responses answer."})
    answer = client.responses.create(
        model="gpt-5-codex", input="hello there", prompt_cache_key="sdk-responses-1"
    )
    assert answer.output_text == "Responses answer."
    sent = fake.records[-1]["body"]
    assert sent["input"][-1]["content"][0]["text"] == "hello there"
    assert fake.records[-1]["headers"]["authorization"] == f"Bearer {KEY}"

    fake.queue.append({"kind": "text", "text": "Streamed responses answer."})
    with client.responses.stream(
        model="gpt-5-codex",
        input=[
            {"role": "user", "content": "hello there"},
            {"role": "assistant", "content": "Responses answer."},
            {"role": "user", "content": "and again, streamed"},
        ],
        prompt_cache_key="sdk-responses-1",
    ) as stream:
        final = stream.get_final_response()
    assert final.output_text == "Streamed responses answer."
    kinds = [n["kind"] for n in nodes_of(proxy.data_dir, "sdk-responses-1")]
    assert kinds == ["user", "assistant", "user"]


def test_openai_sdk_chat_completions_create_and_stream(
    proxy: ProxyProcess, fakes: tuple[FakeAnthropic, FakeOpenAI]
) -> None:
    fake = fakes[1]
    client = openai.OpenAI(base_url=f"{proxy.base_url}/v1", api_key=KEY, max_retries=0)
    fake.queue.append({"kind": "text", "text": "Chat answer."})
    messages = [
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": "hi"},
    ]
    answer = client.chat.completions.create(model="gpt-4o", messages=messages, user="chat-1")
    assert answer.choices[0].message.content == "Chat answer."
    sent = fake.records[-1]["body"]["messages"]
    assert sent[0] == {"role": "system", "content": "You are terse."}  # as the client wrote it

    fake.queue.append({"kind": "text", "text": "Streamed chat answer."})
    chunks = client.chat.completions.create(
        model="gpt-4o",
        messages=[
            *messages,
            {"role": "assistant", "content": "Chat answer."},
            {"role": "user", "content": "more"},
        ],
        user="chat-1",
        stream=True,
        stream_options={"include_usage": True},
    )
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == "Streamed chat answer."
    kinds = [n["kind"] for n in nodes_of(proxy.data_dir, "chat-1")]
    assert kinds == ["user", "assistant", "user"]
