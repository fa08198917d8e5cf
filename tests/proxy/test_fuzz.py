"""Fuzzed bodies and headers against a real proxy: every answer is a refusal in the API's own
error shape (never a 5xx, never a traceback, never the key) — or, for a request shaped right
whose content compactd cannot store, the upstream's own answer to it sent on unchanged — nothing
is written, and the proxy serves a good request afterwards."""

from __future__ import annotations

from typing import Any

import httpx2
import orjson
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.support.fake_anthropic import FakeAnthropic, Reply
from tests.support.fake_openai import FakeOpenAI
from tests.support.proxy import ProxyProcess

from .conftest import sessions_only, snapshot

KEY = "sk-ant-fuzz-0123456789-secret"
PATHS = ["/v1/messages", "/v1/messages?beta=true", "/v1/responses", "/v1/chat/completions"]

json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**63), 2**63 - 1)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=20),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=12,
)
role = st.sampled_from(["user", "assistant", "system", "tool", "developer", "", 3])
block = st.fixed_dictionaries(
    {"type": st.sampled_from(["text", "tool_use", "tool_result", "image", "thinking", 1])},
    optional={
        "text": json_values,
        "id": json_values,
        "tool_use_id": json_values,
        "input": json_values,
        "content": json_values,
        "source": json_values,
    },
)
message = st.fixed_dictionaries(
    {"role": role}, optional={"content": st.one_of(json_values, st.lists(block, max_size=3))}
)
# shaped like a request, wrong somewhere: a bad field type, a bad block, a broken pairing
requests = st.fixed_dictionaries(
    {},
    optional={
        "model": st.one_of(st.just("claude-sonnet-4-5"), json_values),
        "max_tokens": st.one_of(st.integers(-5, 10), json_values),
        "messages": st.one_of(json_values, st.lists(message, min_size=1, max_size=4)),
        "input": st.one_of(json_values, st.lists(message, max_size=3)),
        "system": json_values,
        "tools": json_values,
        "stream": st.booleans(),
    },
)
header_names = st.sampled_from(
    ["x-claude-code-session-id", "anthropic-beta", "session-id", "x-api-key", "user-agent"]
)
header_values = (
    st.text(alphabet=st.characters(min_codepoint=0x20, max_codepoint=0x7E), max_size=30)
    .map(str.strip)
    .filter(bool)  # what an HTTP client can send at all
)


def _refused(response: Any, path: str) -> None:
    assert 400 <= response.status_code < 500, (response.status_code, response.text)
    body = response.json()
    if path.startswith(("/v1/responses", "/v1/chat")):
        assert set(body) == {"error"} and isinstance(body["error"]["message"], str), body
    else:
        assert body["type"] == "error" and isinstance(body["error"]["message"], str), body
    assert KEY not in response.text


def _valid(body: Any, path: str) -> bool:
    """Whether a fuzzed body happens to be a request the proxy would take (then skipped)."""
    from compactd.context.decompose import from_anthropic, from_openai
    from compactd.proxy.anthropic import ApiError, read_messages_request
    from compactd.proxy.chat import system_turn

    try:
        if path.startswith("/v1/messages"):
            from_anthropic(read_messages_request(body).messages)
            return True
        if path.startswith("/v1/chat"):
            if not (isinstance(body, dict) and isinstance(body.get("model"), str)):
                return False
            messages = body.get("messages")
            if (
                isinstance(messages, list)
                and messages
                and all(
                    isinstance(m, dict) and m.get("role") in ("system", "developer")
                    for m in messages
                )
            ):
                return True  # nothing to keep: sent on as the client wrote it
            # past the leading ones, a system or developer message is a turn of the
            # conversation, as the proxy places it (`chat.system_turn`)
            start = 0
            while (
                start < len(messages)
                and isinstance(messages[start], dict)
                and messages[start].get("role") in ("system", "developer")
            ):
                start += 1
            return bool(from_openai([system_turn(m) for m in messages[start:]]))
        return (
            isinstance(body, dict)
            and isinstance(body.get("model"), str)
            and bool(body.get("input"))
        )
    except (ApiError, Exception):
        return False


@settings(
    max_examples=150,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    path=st.sampled_from(PATHS),
    body=st.one_of(requests, json_values, st.binary(max_size=40)),
    headers=st.dictionaries(header_names, header_values, max_size=3),
)
def test_fuzzed_requests_are_refused_in_the_api_s_shape_and_write_nothing(
    proxy: ProxyProcess,
    fakes: tuple[FakeAnthropic, FakeOpenAI],
    path: str,
    body: Any,
    headers: dict[str, str],
) -> None:
    raw = body if isinstance(body, bytes) else orjson.dumps(body)
    parsed = None if isinstance(body, bytes) else body
    if parsed is not None and _valid(parsed, path):
        return  # a request the API would take is not the fuzz's concern
    before = sessions_only(snapshot(proxy.data_dir))
    response = httpx2.post(
        f"{proxy.base_url}{path}",
        content=raw,
        headers={
            "content-type": "application/json",
            "x-api-key": KEY,
            "authorization": f"Bearer {KEY}",
            **headers,
        },
        timeout=30,
    )
    upstream = fakes[0].requests if path.startswith("/v1/messages") else fakes[1].records
    sent_on = bool(upstream) and _body_of(upstream[-1]) == parsed
    if not (sent_on and response.status_code == 200):  # else the upstream's own answer
        _refused(response, path)
    assert sessions_only(snapshot(proxy.data_dir)) == before


def _body_of(record: Any) -> Any:
    return record.body if hasattr(record, "body") else record["body"]


def test_the_proxy_still_serves_after_the_fuzz(
    proxy: ProxyProcess, fakes: tuple[FakeAnthropic, FakeOpenAI]
) -> None:
    fakes[0].push(Reply.answer("still here"))
    response = httpx2.post(
        f"{proxy.base_url}/v1/messages",
        content=orjson.dumps(
            {
                "model": "claude-sonnet-4-5",
                "max_tokens": 8,
                "messages": [{"role": "user", "content": "ping"}],
            }
        ),
        headers={
            "content-type": "application/json",
            "x-api-key": KEY,
            "anthropic-version": "2023-06-01",
        },
        timeout=30,
    )
    assert response.status_code == 200 and response.json()["content"][0]["text"] == "still here"
