"""Recall inside the proxy: the model gets `compactd_recall` without the client knowing. A
response that calls only it is answered by the proxy, which asks the upstream again, so the
client sees one answer (streamed or not); a response that mixes it with the client's own calls
passes those on, and the recalled text reaches the model in the next request."""

from __future__ import annotations

import re
from typing import Any

import anthropic
import orjson
import pytest

from tests.support.fake_anthropic import FakeAnthropic, Reply
from tests.support.fake_openai import FakeOpenAI
from tests.support.proxy import ProxyProcess

KEY = "sk-ant-recall-key"
HANDLE = re.compile(r"recall:[A-Za-z0-9_.-]+")
LINES = [f"line {n:03d}: the value of setting {n} is {n * 7}" for n in range(400)]


def history(session: str) -> tuple[list[dict[str, Any]], dict[str, str]]:
    call = {"type": "tool_use", "id": f"toolu_{session}", "name": "Read", "input": {"f": "x"}}
    messages = [
        {"role": "user", "content": "read the settings file"},
        {"role": "assistant", "content": [call]},
        {
            "role": "user",
            "content": [
                {"type": "tool_result", "tool_use_id": call["id"], "content": "\n".join(LINES)}
            ],
        },
    ]
    return messages, {"x-claude-code-session-id": session}


def client(proxy: ProxyProcess) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=proxy.base_url, api_key=KEY, max_retries=0)


def first_handle(fake: FakeAnthropic, proxy: ProxyProcess, session: str) -> str:
    """Send the history once; the cut note in what went upstream names the handle."""
    messages, headers = history(session)
    fake.push(Reply.answer("I see a long file."))
    client(proxy).messages.create(
        model="claude-sonnet-4-5", max_tokens=512, messages=messages, extra_headers=headers
    )
    sent = orjson.dumps(fake.last_request.body["messages"]).decode()
    assert "truncated by compactd" in sent  # Budget Reduction cut the 4,000+ characters
    assert "compactd_recall" in [t["name"] for t in fake.last_request.body["tools"]]
    (handle,) = set(HANDLE.findall(sent))
    return handle


def recall_call(handle: str, call_id: str = "toolu_recall_1") -> dict[str, Any]:
    return {
        "type": "tool_use",
        "id": call_id,
        "name": "compactd_recall",
        "input": {"handle": handle, "startLine": 200, "endLine": 202},
    }


@pytest.mark.parametrize("stream", [False, True])
def test_a_response_that_only_recalls_is_answered_inside_the_proxy(
    proxy: ProxyProcess, fakes: tuple[FakeAnthropic, FakeOpenAI], stream: bool
) -> None:
    fake = fakes[0]
    fake.reset()
    session = f"recall-only-{stream}"
    handle = first_handle(fake, proxy, session)
    messages, headers = history(session)
    messages += [
        {"role": "assistant", "content": [{"type": "text", "text": "I see a long file."}]},
        {"role": "user", "content": "what is setting 201?"},
    ]
    thinking = {"type": "thinking", "thinking": "Look it up.", "signature": "sig-1"}
    fake.push(Reply.blocks([thinking, recall_call(handle)], stop_reason="tool_use"))
    fake.push(Reply.answer("Setting 201 is 1407."))
    before = len(fake.messages_requests())
    kwargs = {
        "model": "claude-sonnet-4-5",
        "max_tokens": 512,
        "messages": messages,
        "extra_headers": headers,
    }
    if stream:
        with client(proxy).messages.stream(**kwargs) as events:
            answer = events.get_final_message()
    else:
        answer = client(proxy).messages.create(**kwargs)
    kinds = [b.type for b in answer.content]
    assert "tool_use" not in kinds
    assert answer.content[-1].text == "Setting 201 is 1407."
    assert answer.content[0].type == "thinking" and answer.content[0].signature == "sig-1"
    asked, follow_up = fake.messages_requests()[before:]
    results = follow_up.body["messages"][-1]["content"]
    assert results[0]["tool_use_id"] == "toolu_recall_1"
    assert LINES[200] in results[0]["content"] and LINES[201] in results[0]["content"]
    assert follow_up.body["messages"][-2]["content"][1]["id"] == "toolu_recall_1"
    assert asked.body["messages"] == follow_up.body["messages"][:-2]


def test_a_recall_beside_the_client_s_calls_reaches_the_next_request(
    proxy: ProxyProcess, fakes: tuple[FakeAnthropic, FakeOpenAI]
) -> None:
    fake = fakes[0]
    fake.reset()
    session = "recall-mixed"
    handle = first_handle(fake, proxy, session)
    messages, headers = history(session)
    messages += [
        {"role": "assistant", "content": [{"type": "text", "text": "I see a long file."}]},
        {"role": "user", "content": "check setting 201 and list the dir"},
    ]
    bash = {"type": "tool_use", "id": "toolu_ls", "name": "Bash", "input": {"command": "ls"}}
    fake.push(Reply.blocks([recall_call(handle, "toolu_r2"), bash], stop_reason="tool_use"))
    answer = client(proxy).messages.create(
        model="claude-sonnet-4-5", max_tokens=512, messages=messages, extra_headers=headers
    )
    assert [b.id for b in answer.content if b.type == "tool_use"] == ["toolu_ls"]
    messages += [
        {"role": "assistant", "content": [bash]},
        {
            "role": "user",
            "content": [{"type": "tool_result", "tool_use_id": "toolu_ls", "content": "a b c"}],
        },
    ]
    fake.push(Reply.answer("Done."))
    client(proxy).messages.create(
        model="claude-sonnet-4-5", max_tokens=512, messages=messages, extra_headers=headers
    )
    last = fake.last_request.body["messages"][-1]["content"]
    assert last[0]["type"] == "tool_result" and last[0]["tool_use_id"] == "toolu_ls"
    note = " ".join(b.get("text", "") for b in last if b["type"] == "text")
    assert f"compactd_recall {handle}" in note and LINES[201] in note


@pytest.mark.parametrize("stream", [False, True])
def test_responses_that_only_recall_are_answered_inside_the_proxy(
    proxy: ProxyProcess, fakes: tuple[FakeAnthropic, FakeOpenAI], stream: bool
) -> None:
    """The same on the Responses API (what Codex speaks): the held-back call is answered and
    the client gets one response whose output holds no `compactd_recall` call."""
    import openai

    fake = fakes[1]
    key = f"responses-recall-{stream}"
    items: list[dict[str, Any]] = [
        {"type": "message", "role": "user", "content": "read the settings file"},
        {
            "type": "function_call",
            "call_id": f"call_{key}",
            "name": "exec_command",
            "arguments": '{"cmd": "cat settings"}',
        },
        {"type": "function_call_output", "call_id": f"call_{key}", "output": "\n".join(LINES)},
    ]
    client = openai.OpenAI(base_url=f"{proxy.base_url}/v1", api_key=KEY, max_retries=0)
    fake.queue.append({"kind": "text", "text": "A long file."})
    client.responses.create(model="gpt-5-codex", input=items, prompt_cache_key=key)
    sent = orjson.dumps(fake.records[-1]["body"]["input"]).decode()
    (handle,) = set(HANDLE.findall(sent))
    items += [
        {"type": "message", "role": "assistant", "content": "A long file."},
        {"type": "message", "role": "user", "content": "what is setting 201?"},
    ]
    fake.queue.append(
        {
            "kind": "call",
            "name": "compactd_recall",
            "call_id": "call_rc",
            "arguments": {"handle": handle, "startLine": 202, "endLine": 202},
        }
    )
    fake.queue.append({"kind": "text", "text": "Setting 201 is 1407."})
    before = len(fake.records)
    if stream:
        with client.responses.stream(
            model="gpt-5-codex", input=items, prompt_cache_key=key
        ) as events:
            answer = events.get_final_response()
    else:
        answer = client.responses.create(model="gpt-5-codex", input=items, prompt_cache_key=key)
    assert answer.output_text == "Setting 201 is 1407."
    assert all(getattr(item, "name", None) != "compactd_recall" for item in answer.output)
    _asked, follow_up = fake.records[before:]
    outputs = [i for i in follow_up["body"]["input"] if i.get("type") == "function_call_output"]
    assert outputs[-1]["call_id"] == "call_rc" and LINES[201] in outputs[-1]["output"]


def test_a_search_is_answered_inside_the_proxy_and_a_bad_one_is_the_model_s_error(
    proxy: ProxyProcess, fakes: tuple[FakeAnthropic, FakeOpenAI]
) -> None:
    """The model searches the cut file for what it needs: the proxy answers with the matching
    line and its number; a regular expression RE2 will not run comes back as an error result
    the model reads, and the client still gets one answer."""
    fake = fakes[0]
    fake.reset()
    session = "recall-search"
    handle = first_handle(fake, proxy, session)
    messages, headers = history(session)
    messages += [
        {"role": "assistant", "content": [{"type": "text", "text": "I see a long file."}]},
        {"role": "user", "content": "which setting is worth 2009?"},
    ]
    search = {"handle": handle, "search": "is 2009", "context": 0}
    bad = {"handle": handle, "search": "(\\d+)\\1", "regex": True}
    fake.push(
        Reply.blocks(
            [
                {"type": "tool_use", "id": "toolu_s1", "name": "compactd_recall", "input": search},
                {"type": "tool_use", "id": "toolu_s2", "name": "compactd_recall", "input": bad},
            ],
            stop_reason="tool_use",
        )
    )
    fake.push(Reply.answer("Setting 287."))
    before = len(fake.messages_requests())
    answer = client(proxy).messages.create(
        model="claude-sonnet-4-5", max_tokens=512, messages=messages, extra_headers=headers
    )
    assert answer.content[-1].text == "Setting 287."
    _asked, follow_up = fake.messages_requests()[before:]
    found, refused = follow_up.body["messages"][-1]["content"]
    assert found["tool_use_id"] == "toolu_s1" and "is_error" not in found
    assert f"\n288:{LINES[287]}" in found["content"]  # line 288 of the file is setting 287
    assert "1 line match" in found["content"] and LINES[286] not in found["content"]
    assert refused["tool_use_id"] == "toolu_s2" and refused["is_error"] is True
    assert "backreferences" in refused["content"]
