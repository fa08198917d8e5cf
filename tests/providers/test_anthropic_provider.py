"""The `anthropic` summary provider and the fake Messages server, through the real SDK on 127.0.0.1.

Every test talks HTTP to a `FakeAnthropic` on loopback through `anthropic.AsyncAnthropic` (or the
sync client), so what is proven here is the wire behaviour: bodies, SSE, the error envelope, the
SDK's retries, and our mapping of each failure to a `SummaryFailure` kind.
"""

from __future__ import annotations

import asyncio
import json
import socket
import urllib.error
import urllib.request
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

import anthropic
import pytest
from compactd.context.summarizer.types import SummaryFailure, SummaryRequest
from compactd.service.providers.anthropic_provider import (
    DEFAULT_SUMMARY_MODEL,
    MODEL_ENV,
    AnthropicSummaryProvider,
)

from tests.support.fake_anthropic import (
    FakeAnthropic,
    FakeAnthropicProcess,
    Reply,
    estimate_prompt_tokens,
)

KEY = "sk-ant-test-0000"
SYSTEM = "You write faithful, compact summaries of agent conversations."
PROMPT = "<conversation>\nuser: fix the failing test\nassistant: done, tests pass\n</conversation>"
BETA_CONTEXT_MANAGEMENT = "context-management-2025-06-27"

ProviderFactory = Callable[..., AnthropicSummaryProvider]


# --------------------------------------------------------------------------------------------
# Fixtures and helpers
# --------------------------------------------------------------------------------------------


@pytest.fixture
def fake() -> Iterator[FakeAnthropic]:
    with FakeAnthropic(api_key=KEY) as server:
        yield server


@pytest.fixture
async def make_provider(fake: FakeAnthropic) -> AsyncIterator[ProviderFactory]:
    """Build providers aimed at the fake; all are closed after the test."""
    made: list[AnthropicSummaryProvider] = []

    def build(**options: Any) -> AnthropicSummaryProvider:
        options.setdefault("api_key", KEY)
        options.setdefault("base_url", fake.base_url)
        provider = AnthropicSummaryProvider(**options)
        made.append(provider)
        return provider

    yield build
    for provider in made:
        await provider.aclose()


@pytest.fixture
def client(fake: FakeAnthropic) -> Iterator[anthropic.Anthropic]:
    with anthropic.Anthropic(base_url=fake.base_url, api_key=KEY, max_retries=0) as sdk:
        yield sdk


def summary_request(max_output_tokens: int = 512, **options: Any) -> SummaryRequest:
    return SummaryRequest(
        purpose="rolling",
        system=SYSTEM,
        prompt=PROMPT,
        max_output_tokens=max_output_tokens,
        **options,
    )


async def expect_failure(
    provider: AnthropicSummaryProvider, request: SummaryRequest | None = None
) -> SummaryFailure:
    """Run a summary that must fail; check the message is one clean line, not a traceback."""
    with pytest.raises(SummaryFailure) as caught:
        await provider.summarize(request or summary_request())
    failure = caught.value
    assert "Traceback" not in failure.message
    assert "\n" not in failure.message
    assert failure.message
    return failure


def free_port() -> int:
    """A loopback port nobody listens on (bound, then released)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def post_raw(
    fake: FakeAnthropic, path: str, body: Any, headers: dict[str, str] | None = None
) -> tuple[int, dict[str, str], Any]:
    """POST without the SDK (for bodies it refuses to build): (status, headers, json)."""
    data = json.dumps(body).encode()
    request = urllib.request.Request(f"{fake.base_url}{path}", data=data, method="POST")
    request.add_header("content-type", "application/json")
    for name, value in (headers or {"x-api-key": KEY, "anthropic-version": "2023-06-01"}).items():
        request.add_header(name, value)
    try:
        with urllib.request.urlopen(request, timeout=5) as response:
            return response.status, dict(response.headers), json.loads(response.read())
    except urllib.error.HTTPError as error:
        return error.code, dict(error.headers), json.loads(error.read())


def tool_turns(*ids: str) -> list[dict[str, Any]]:
    """A valid conversation: one assistant turn calling tools `ids`, then all their results."""
    return [
        {"role": "user", "content": "look around"},
        {
            "role": "assistant",
            "content": [{"type": "text", "text": "Reading."}]
            + [{"type": "tool_use", "id": i, "name": "Read", "input": {"path": i}} for i in ids],
        },
        {
            "role": "user",
            "content": [
                {"type": "tool_result", "tool_use_id": i, "content": f"body {i}"} for i in ids
            ]
            + [{"type": "text", "text": "continue"}],
        },
    ]


# --------------------------------------------------------------------------------------------
# Provider: successes and the request we send
# --------------------------------------------------------------------------------------------


async def test_summary_success_returns_text_and_usage(
    fake: FakeAnthropic, make_provider: ProviderFactory
) -> None:
    fake.push(
        Reply.answer(
            "  The user asked to fix a test; it passes now.\n",
            input_tokens=1234,
            output_tokens=56,
            cache_read_input_tokens=7,
            cache_creation_input_tokens=8,
            model="claude-haiku-4-5-20251001",
        )
    )
    result = await make_provider().summarize(summary_request())

    assert result.text == "The user asked to fix a test; it passes now."
    assert result.model == "claude-haiku-4-5-20251001"
    assert (result.input_tokens, result.output_tokens) == (1234, 56)
    assert (result.cache_read_input_tokens, result.cache_creation_input_tokens) == (7, 8)
    assert len(fake.messages_requests()) == 1
    assert fake.last_request.stream is False


async def test_request_body_is_exactly_what_we_intend(
    fake: FakeAnthropic, make_provider: ProviderFactory
) -> None:
    await make_provider(model="claude-sonnet-4-6").summarize(summary_request(max_output_tokens=700))

    sent = fake.last_request
    assert sent.path == "/v1/messages" and sent.method == "POST"
    assert not sent.is_beta
    assert sent.api_key == KEY
    assert sent.headers["anthropic-version"]  # the SDK's, whatever it is
    assert sent.body == {
        "model": "claude-sonnet-4-6",
        "max_tokens": 700,
        "system": SYSTEM,
        "messages": [{"role": "user", "content": PROMPT}],
    }


async def test_request_model_overrides_the_configured_one(
    fake: FakeAnthropic, make_provider: ProviderFactory
) -> None:
    provider = make_provider(model="claude-sonnet-4-6")
    result = await provider.summarize(summary_request(model="claude-opus-4-8"))
    assert fake.last_request.body["model"] == "claude-opus-4-8"
    assert result.model == "claude-opus-4-8"  # the fake echoes the request's model


async def test_streamed_summary_collects_text_and_final_usage(
    fake: FakeAnthropic, make_provider: ProviderFactory
) -> None:
    long = Reply.long_text(chars=6000, input_tokens=900, output_tokens=1300, chunks=40)
    fake.push(long)
    result = await make_provider().summarize(summary_request(max_output_tokens=8192))

    sent = fake.last_request
    assert sent.stream is True
    assert sent.body["max_tokens"] == 8192
    assert result.text == long.text
    assert len(result.text) >= 5900
    # message_start says output_tokens=1; only the cumulative message_delta says 1300
    assert (result.input_tokens, result.output_tokens) == (900, 1300)


@pytest.mark.parametrize(
    ("max_output_tokens", "threshold", "streams"),
    [(4095, 4096, False), (4096, 4096, True), (200, 100, True), (30_000, 10**9, True)],
)
async def test_streaming_is_chosen_by_output_size(
    fake: FakeAnthropic,
    make_provider: ProviderFactory,
    max_output_tokens: int,
    threshold: int,
    streams: bool,
) -> None:
    """Large outputs stream (and above the SDK's non-streaming limit they always do)."""
    provider = make_provider(stream_threshold_tokens=threshold)
    result = await provider.summarize(summary_request(max_output_tokens=max_output_tokens))
    assert fake.last_request.stream is streams
    assert result.text == Reply.answer().text


async def test_model_comes_from_argument_then_env_then_default(
    fake: FakeAnthropic, make_provider: ProviderFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(MODEL_ENV, raising=False)
    assert make_provider().model == DEFAULT_SUMMARY_MODEL
    monkeypatch.setenv(MODEL_ENV, "claude-haiku-5-5")
    assert make_provider(model="claude-opus-5").model == "claude-opus-5"
    provider = make_provider()
    assert provider.model == "claude-haiku-5-5"
    await provider.summarize(summary_request())
    assert fake.last_request.body["model"] == "claude-haiku-5-5"


async def test_key_and_base_url_come_from_the_environment(
    fake: FakeAnthropic, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What the daemon end-to-end tests rely on: ANTHROPIC_BASE_URL and ANTHROPIC_API_KEY."""
    monkeypatch.setenv("ANTHROPIC_BASE_URL", fake.base_url)
    monkeypatch.setenv("ANTHROPIC_API_KEY", KEY)
    monkeypatch.delenv("ANTHROPIC_AUTH_TOKEN", raising=False)
    async with AnthropicSummaryProvider() as provider:
        result = await provider.summarize(summary_request())
    assert result.text == Reply.answer().text
    assert fake.last_request.api_key == KEY


async def test_empty_prompt_fails_without_calling_the_api(
    fake: FakeAnthropic, make_provider: ProviderFactory
) -> None:
    request = SummaryRequest(purpose="rolling", system=SYSTEM, prompt=" \n", max_output_tokens=100)
    failure = await expect_failure(make_provider(), request)
    assert failure.kind == "other"
    assert fake.requests == []


# --------------------------------------------------------------------------------------------
# Provider: every failure kind
# --------------------------------------------------------------------------------------------


async def test_prompt_too_long_is_parsed_and_not_retried(
    fake: FakeAnthropic, make_provider: ProviderFactory
) -> None:
    fake.push(Reply.prompt_too_long(210_345, 200_000))
    failure = await expect_failure(make_provider())
    assert failure.kind == "prompt_too_long"
    assert (failure.prompt_tokens, failure.limit_tokens) == (210_345, 200_000)
    assert failure.status == 400
    assert "prompt is too long: 210345 tokens > 200000 maximum" in failure.message
    assert "req_fake_" in failure.message  # the request id, for support tickets
    assert len(fake.messages_requests()) == 1


async def test_prompt_too_long_from_the_fakes_own_window(
    fake: FakeAnthropic, make_provider: ProviderFactory
) -> None:
    """`context_window` makes the fake measure the request and refuse it like the API."""
    fake.context_window = 10
    failure = await expect_failure(make_provider())
    assert failure.kind == "prompt_too_long"
    assert failure.limit_tokens == 10
    assert failure.prompt_tokens == estimate_prompt_tokens(fake.last_request.body)


async def test_other_bad_request_is_other(
    fake: FakeAnthropic, make_provider: ProviderFactory
) -> None:
    fake.push(Reply.error(400, message="model: claude-nonexistent is not a valid model"))
    failure = await expect_failure(make_provider())
    assert failure.kind == "other"
    assert failure.status == 400
    assert failure.prompt_tokens is None
    assert len(fake.messages_requests()) == 1


async def test_request_too_large_is_too_large(
    fake: FakeAnthropic, make_provider: ProviderFactory
) -> None:
    fake.push(Reply.too_large())
    failure = await expect_failure(make_provider())
    assert (failure.kind, failure.status) == ("too_large", 413)
    assert len(fake.messages_requests()) == 1


@pytest.mark.parametrize(
    ("reply", "kind", "status"),
    [
        (Reply.rate_limited(), "rate_limited", 429),
        (Reply.overloaded(), "overloaded", 529),
        (Reply.server_error(), "other", 500),
        (Reply.error(503), "unavailable", 503),
    ],
)
async def test_retryable_errors_fail_after_the_sdks_retries(
    fake: FakeAnthropic, make_provider: ProviderFactory, reply: Reply, kind: str, status: int
) -> None:
    fake.push(reply, times=3)  # each says `retry-after-ms: 1`: the SDK's backoff stays short
    failure = await expect_failure(make_provider(max_retries=2))
    assert (failure.kind, failure.status) == (kind, status)
    seen = fake.messages_requests()
    assert len(seen) == 3  # one attempt + max_retries
    assert [request.retry_count for request in seen] == [0, 1, 2]


async def test_a_retry_that_succeeds_is_a_success(
    fake: FakeAnthropic, make_provider: ProviderFactory
) -> None:
    fake.push(Reply.overloaded(), Reply.rate_limited(), Reply.answer("second time lucky"))
    result = await make_provider(max_retries=2).summarize(summary_request())
    assert result.text == "second time lucky"
    assert len(fake.messages_requests()) == 3


async def test_max_retries_zero_means_one_request(
    fake: FakeAnthropic, make_provider: ProviderFactory
) -> None:
    fake.push(Reply.overloaded(), times=3)
    failure = await expect_failure(make_provider(max_retries=0))
    assert failure.kind == "overloaded"
    assert len(fake.messages_requests()) == 1


@pytest.mark.parametrize("status", [401, 403])
async def test_auth_errors_are_auth(
    fake: FakeAnthropic, make_provider: ProviderFactory, status: int
) -> None:
    fake.push(Reply.error(status))
    failure = await expect_failure(make_provider())
    assert (failure.kind, failure.status) == ("auth", status)


async def test_wrong_api_key_is_auth(fake: FakeAnthropic, make_provider: ProviderFactory) -> None:
    failure = await expect_failure(make_provider(api_key="sk-ant-wrong"))
    assert (failure.kind, failure.status) == ("auth", 401)
    assert fake.last_request.api_key == "sk-ant-wrong"


@pytest.mark.parametrize(
    ("error_type", "kind"), [("overloaded_error", "overloaded"), ("api_error", "stream_error")]
)
async def test_error_event_inside_a_stream(
    fake: FakeAnthropic, make_provider: ProviderFactory, error_type: str, kind: str
) -> None:
    fake.push(Reply.stream_error("Half a summ", error_type=error_type, message="boom"))
    failure = await expect_failure(make_provider(), summary_request(max_output_tokens=8000))
    assert failure.kind == kind
    assert failure.status == 200  # the HTTP status was fine; the stream said otherwise
    assert "boom" in failure.message
    assert len(fake.messages_requests()) == 1  # the SDK does not retry a broken stream


async def test_stall_hits_the_wall_time_bound(
    fake: FakeAnthropic, make_provider: ProviderFactory
) -> None:
    fake.push(Reply.stall(600))  # ended by the 0.3 s bound (said in the message), not its end
    failure = await expect_failure(make_provider(wall_seconds=0.3))
    assert failure.kind == "timeout"
    assert "wall-time" in failure.message
    assert len(fake.messages_requests()) == 1


async def test_stall_hits_the_http_timeout_and_is_retried(
    fake: FakeAnthropic, make_provider: ProviderFactory
) -> None:
    """The SDK's own timeout (per attempt) also maps to `timeout`; the SDK retries it once."""
    fake.push(Reply.stall(10), times=2)
    provider = make_provider(timeout_seconds=0.2, max_retries=1, wall_seconds=10)
    failure = await expect_failure(provider)
    assert failure.kind == "timeout"
    assert "wall-time" not in failure.message
    assert len(fake.messages_requests()) == 2


async def test_stream_that_stalls_between_deltas_hits_the_wall_bound(
    fake: FakeAnthropic, make_provider: ProviderFactory
) -> None:
    fake.push(Reply.answer("slow " * 40, chunks=40, chunk_delay=0.2))
    provider = make_provider(wall_seconds=0.5)
    failure = await expect_failure(provider, summary_request(max_output_tokens=8000))
    assert failure.kind == "timeout"


@pytest.mark.parametrize(
    "reply", [Reply.empty(), Reply.blank(""), Reply.blank("  \n\t ")], ids=["none", "", "space"]
)
@pytest.mark.parametrize("max_output_tokens", [512, 8192], ids=["json", "stream"])
async def test_empty_answer_is_empty(
    fake: FakeAnthropic, make_provider: ProviderFactory, reply: Reply, max_output_tokens: int
) -> None:
    fake.push(reply)
    failure = await expect_failure(make_provider(), summary_request(max_output_tokens))
    assert failure.kind == "empty"
    assert fake.last_request.stream is (max_output_tokens == 8192)


async def test_nobody_listening_is_unavailable(make_provider: ProviderFactory) -> None:
    provider = make_provider(base_url=f"http://127.0.0.1:{free_port()}", max_retries=0)
    failure = await expect_failure(provider)
    assert failure.kind == "unavailable"


@pytest.mark.parametrize("max_output_tokens", [512, 8192], ids=["json", "stream"])
async def test_cancellation_propagates(
    fake: FakeAnthropic, make_provider: ProviderFactory, max_output_tokens: int
) -> None:
    """Cancelling the caller raises CancelledError (not SummaryFailure) once the request left."""
    fake.push(Reply.stall(10))
    provider = make_provider()
    task = asyncio.create_task(provider.summarize(summary_request(max_output_tokens)))
    for _ in range(200):
        if fake.messages_requests():
            break
        await asyncio.sleep(0.01)
    assert len(fake.messages_requests()) == 1
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert task.cancelled()
    assert len(fake.messages_requests()) == 1  # nothing was retried behind our back


async def test_count_tokens_returns_the_servers_count(
    fake: FakeAnthropic, make_provider: ProviderFactory
) -> None:
    messages = tool_turns("toolu_a1")
    tools = [{"name": "Read", "description": "read a file", "input_schema": {"type": "object"}}]
    provider = make_provider(model="claude-sonnet-4-6")
    counted = await provider.count_tokens(SYSTEM, messages, tools)

    sent = fake.last_request
    assert sent.path == "/v1/messages/count_tokens"
    assert sent.body == {
        "model": "claude-sonnet-4-6",
        "messages": messages,
        "system": SYSTEM,
        "tools": tools,
    }
    assert counted == estimate_prompt_tokens(sent.body)
    fake.push_count_tokens(Reply.count_tokens(4242))
    assert await provider.count_tokens(None, messages, model="claude-opus-4-8") == 4242
    assert "system" not in fake.last_request.body
    assert fake.last_request.body["model"] == "claude-opus-4-8"


async def test_count_tokens_failures_are_summary_failures(
    fake: FakeAnthropic, make_provider: ProviderFactory
) -> None:
    fake.push_count_tokens(Reply.rate_limited(), times=3)
    with pytest.raises(SummaryFailure) as caught:
        await make_provider().count_tokens(None, [{"role": "user", "content": "hi"}])
    assert caught.value.kind == "rate_limited"
    assert len(fake.count_tokens_requests()) == 3


# --------------------------------------------------------------------------------------------
# The fake server itself: what it validates, and its wire shapes
# --------------------------------------------------------------------------------------------


def test_valid_tool_conversation_is_accepted(
    fake: FakeAnthropic, client: anthropic.Anthropic
) -> None:
    message = client.messages.create(
        model="claude-haiku-4-5", max_tokens=64, messages=tool_turns("toolu_a1", "toolu_a2")
    )
    assert message.content[0].text == Reply.answer().text


@pytest.mark.parametrize(
    ("mutate", "expected"),
    [
        pytest.param(
            lambda msgs: msgs[2]["content"].pop(1),
            "messages.1: `tool_use` ids were found without `tool_result` blocks immediately "
            "after: toolu_a2. Each `tool_use` block must have a corresponding `tool_result` "
            "block in the next message.",
            id="missing-result",
        ),
        pytest.param(
            lambda msgs: msgs[2]["content"].insert(0, {"type": "text", "text": "first"}),
            "messages.1: `tool_use` ids were found without `tool_result` blocks immediately "
            "after: toolu_a1, toolu_a2. Each `tool_use` block must have a corresponding "
            "`tool_result` block in the next message.",
            id="results-not-first",
        ),
        pytest.param(
            lambda msgs: msgs[2]["content"].insert(
                2, {"type": "tool_result", "tool_use_id": "toolu_zz", "content": "?"}
            ),
            "messages.2.content.2: unexpected `tool_use_id` found in `tool_result` blocks: "
            "toolu_zz. Each `tool_result` block must have a corresponding `tool_use` block in "
            "the previous message.",
            id="orphan-result",
        ),
        pytest.param(
            lambda msgs: msgs[1]["content"][2].update(id="toolu_a1"),
            "messages.1.content.2: `tool_use` ids must be unique",
            id="duplicate-id",
        ),
        pytest.param(
            lambda msgs: msgs.pop(2),
            "messages.1: `tool_use` ids were found without `tool_result` blocks immediately "
            "after: toolu_a1, toolu_a2. Each `tool_use` block must have a corresponding "
            "`tool_result` block in the next message.",
            id="no-next-message",
        ),
    ],
)
def test_pairing_violations_are_rejected_with_the_real_text(
    fake: FakeAnthropic,
    client: anthropic.Anthropic,
    mutate: Callable[[list[dict[str, Any]]], object],
    expected: str,
) -> None:
    messages = tool_turns("toolu_a1", "toolu_a2")
    mutate(messages)
    fake.push(Reply.answer("must not be consumed"))
    with pytest.raises(anthropic.BadRequestError) as caught:
        client.messages.create(model="claude-haiku-4-5", max_tokens=64, messages=messages)
    assert caught.value.api_message == expected
    assert caught.value.type == "invalid_request_error"
    assert fake.pending() == 1  # a rejected request consumes no scripted reply


def test_orphan_result_after_a_plain_user_turn(
    fake: FakeAnthropic, client: anthropic.Anthropic
) -> None:
    messages = [
        {"role": "user", "content": "hello"},
        {"role": "assistant", "content": "hi"},
        {
            "role": "user",
            "content": [{"type": "tool_result", "tool_use_id": "toolu_x", "content": "x"}],
        },
    ]
    with pytest.raises(anthropic.BadRequestError) as caught:
        client.messages.create(model="claude-haiku-4-5", max_tokens=64, messages=messages)
    assert caught.value.api_message.startswith(
        "messages.2.content.0: unexpected `tool_use_id` found in `tool_result` blocks: toolu_x."
    )


def test_thinking_turn_rebuilt_without_its_thinking_is_rejected(
    fake: FakeAnthropic, client: anthropic.Anthropic
) -> None:
    messages = tool_turns("toolu_t1")
    thinking = {"type": "adaptive"}
    with pytest.raises(anthropic.BadRequestError) as caught:
        client.messages.create(
            model="claude-opus-4-8", max_tokens=2048, messages=messages, thinking=thinking
        )
    assert caught.value.api_message.startswith(
        "messages.1.content.0.type: Expected `thinking` or `redacted_thinking`, but found `text`."
    )
    messages[1]["content"].insert(0, {"type": "thinking", "thinking": "hm", "signature": "sig"})
    ok = client.messages.create(
        model="claude-opus-4-8", max_tokens=2048, messages=messages, thinking=thinking
    )
    assert ok.stop_reason == "end_turn"


def test_empty_messages_and_missing_max_tokens_are_rejected(
    fake: FakeAnthropic, client: anthropic.Anthropic
) -> None:
    with pytest.raises(anthropic.BadRequestError) as caught:
        client.messages.create(model="claude-haiku-4-5", max_tokens=64, messages=[])
    assert caught.value.api_message == "messages: at least one message is required"

    body = {"model": "claude-haiku-4-5", "messages": [{"role": "user", "content": "hi"}]}
    status, headers, envelope = post_raw(fake, "/v1/messages", body)
    assert status == 400
    assert envelope["type"] == "error"
    assert envelope["error"] == {
        "type": "invalid_request_error",
        "message": "max_tokens: Field required",
    }
    assert envelope["request_id"] == headers["request-id"]
    assert envelope["request_id"].startswith("req_")


def test_empty_text_blocks_and_empty_turns_are_rejected(
    fake: FakeAnthropic, client: anthropic.Anthropic
) -> None:
    empty_block = [{"role": "user", "content": [{"type": "text", "text": ""}]}]
    with pytest.raises(anthropic.BadRequestError, match="text content blocks must be non-empty"):
        client.messages.create(model="claude-haiku-4-5", max_tokens=64, messages=empty_block)
    empty_turn = [{"role": "user", "content": []}, {"role": "assistant", "content": "x"}]
    with pytest.raises(anthropic.BadRequestError, match="all messages must have non-empty content"):
        client.messages.create(model="claude-haiku-4-5", max_tokens=64, messages=empty_turn)


def test_key_is_accepted_as_bearer_or_x_api_key_and_required(fake: FakeAnthropic) -> None:
    body = {"model": "m", "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}]}
    version = {"anthropic-version": "2023-06-01"}
    assert post_raw(fake, "/v1/messages", body, {**version, "x-api-key": KEY})[0] == 200
    assert (
        post_raw(fake, "/v1/messages", body, {**version, "authorization": f"Bearer {KEY}"})[0]
        == 200
    )
    status, _, envelope = post_raw(fake, "/v1/messages", body, version)
    assert status == 401
    assert envelope["error"]["type"] == "authentication_error"


def test_sse_has_event_lines_and_cumulative_usage(
    fake: FakeAnthropic, client: anthropic.Anthropic
) -> None:
    fake.push(Reply.answer("one two three four", chunks=4, input_tokens=50, output_tokens=9))
    with client.messages.create(
        model="claude-haiku-4-5",
        max_tokens=64,
        messages=[{"role": "user", "content": "hi"}],
        stream=True,
    ) as events:
        names = [event.type for event in events]
    assert names == [
        "message_start",
        "content_block_start",
        *["content_block_delta"] * 4,
        "content_block_stop",
        "message_delta",
        "message_stop",
    ]  # `ping` was sent and swallowed by the SDK; every event carried its `event:` line

    fake.push(Reply.answer("abc"))
    body = {
        "model": "m",
        "max_tokens": 8,
        "stream": True,
        "messages": [{"role": "user", "content": "x"}],
    }
    request = urllib.request.Request(
        f"{fake.base_url}/v1/messages", data=json.dumps(body).encode(), method="POST"
    )
    for name, value in {"x-api-key": KEY, "anthropic-version": "2023-06-01"}.items():
        request.add_header(name, value)
    with urllib.request.urlopen(request, timeout=5) as response:
        raw = response.read().decode()
    chunks = [chunk for chunk in raw.split("\n\n") if chunk]
    assert all(chunk.startswith("event: ") for chunk in chunks)
    assert "event: ping\n" in raw
    delta = next(chunk for chunk in chunks if chunk.startswith("event: message_delta"))
    assert json.loads(delta.split("data: ", 1)[1])["usage"]["output_tokens"] >= 1


def test_count_tokens_plain_and_beta_through_the_sdk(
    fake: FakeAnthropic, client: anthropic.Anthropic
) -> None:
    messages = tool_turns(*(f"toolu_{n}" for n in range(6)))
    plain = client.messages.count_tokens(model="claude-haiku-4-5", messages=messages)
    assert plain.input_tokens == estimate_prompt_tokens({"messages": messages})

    edits = {
        "edits": [
            {
                "type": "clear_tool_uses_20250919",
                "trigger": {"type": "tool_uses", "value": 1},
                "keep": {"type": "tool_uses", "value": 2},
            }
        ]
    }
    beta = client.beta.messages.count_tokens(
        model="claude-haiku-4-5",
        messages=messages,
        betas=[BETA_CONTEXT_MANAGEMENT],
        context_management=edits,
    )
    assert beta.context_management is not None
    assert beta.context_management.original_input_tokens == plain.input_tokens
    assert 0 < beta.input_tokens < plain.input_tokens  # four old results would be cleared
    sent = fake.last_request
    assert sent.is_beta
    assert BETA_CONTEXT_MANAGEMENT in sent.betas


def test_applied_edits_are_reported_and_configurable(
    fake: FakeAnthropic, client: anthropic.Anthropic
) -> None:
    """The cache-aware microcompact path: what the API says it cleared comes back typed."""
    messages = tool_turns(*(f"toolu_{n}" for n in range(5)))
    config = {
        "edits": [
            {
                "type": "clear_tool_uses_20250919",
                "trigger": {"type": "tool_uses", "value": 3},
                "keep": {"type": "tool_uses", "value": 3},
            }
        ]
    }
    common = {"model": "claude-haiku-4-5", "max_tokens": 64, "messages": messages}
    computed = client.beta.messages.create(
        **common, betas=[BETA_CONTEXT_MANAGEMENT], context_management=config
    )
    assert computed.context_management is not None
    (edit,) = computed.context_management.applied_edits
    assert edit.type == "clear_tool_uses_20250919"
    assert edit.cleared_tool_uses == 2  # five uses, keep three
    assert edit.cleared_input_tokens > 0

    config["edits"][0]["clear_at_least"] = {"type": "input_tokens", "value": 10**6}
    unworthy = client.beta.messages.create(
        **common, betas=[BETA_CONTEXT_MANAGEMENT], context_management=config
    )
    assert unworthy.context_management.applied_edits == []  # not worth clearing: not applied

    forced = [
        {"type": "clear_tool_uses_20250919", "cleared_tool_uses": 8, "cleared_input_tokens": 50000}
    ]
    fake.applied_edits = forced
    with client.beta.messages.stream(
        **common, betas=[BETA_CONTEXT_MANAGEMENT], context_management=config
    ) as stream:
        streamed = stream.get_final_message()
    assert streamed.context_management.applied_edits[0].cleared_input_tokens == 50000
    assert streamed.context_management.applied_edits[0].cleared_tool_uses == 8

    plain = client.messages.create(**common)
    assert getattr(plain, "context_management", None) is None
    assert "context_management" not in fake.last_request.body


def test_context_management_without_its_beta_is_rejected(
    fake: FakeAnthropic, client: anthropic.Anthropic
) -> None:
    config = {"edits": [{"type": "clear_tool_uses_20250919"}]}
    with pytest.raises(anthropic.BadRequestError) as caught:
        client.messages.create(
            model="claude-haiku-4-5",
            max_tokens=64,
            messages=[{"role": "user", "content": "hi"}],
            extra_body={"context_management": config},
        )
    assert caught.value.api_message == "context_management: Extra inputs are not permitted"


def test_error_replies_map_to_the_sdks_classes(
    fake: FakeAnthropic, client: anthropic.Anthropic
) -> None:
    expected = [
        (Reply.prompt_too_long(), anthropic.BadRequestError),
        (Reply.too_large(), anthropic.ContentTooLargeError),
        (Reply.rate_limited(), anthropic.RateLimitError),
        (Reply.overloaded(), anthropic.OverloadedError),
        (Reply.server_error(), anthropic.InternalServerError),
        (Reply.unauthorized(), anthropic.AuthenticationError),
    ]
    for reply, error_class in expected:
        fake.push(reply)
        with pytest.raises(error_class) as caught:
            client.messages.create(
                model="m", max_tokens=8, messages=[{"role": "user", "content": "hi"}]
            )
        assert caught.value.status_code == reply.status
        assert caught.value.body["error"]["type"] == reply.error_type
        assert caught.value.request_id == caught.value.body["request_id"]


def test_script_round_trips_through_json(fake: FakeAnthropic, client: anthropic.Anthropic) -> None:
    fake.load_script(
        {
            "default": {"kind": "text", "text": "scripted default"},
            "messages": [
                {"kind": "prompt_too_long", "prompt_tokens": 9, "limit_tokens": 5},
                {"kind": "stall", "seconds": 0.01, "then": {"kind": "text", "text": "late"}},
                Reply.answer("from to_dict", output_tokens=3).to_dict(),
            ],
        }
    )
    ask = {"model": "m", "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}]}
    with pytest.raises(anthropic.BadRequestError, match="9 tokens > 5 maximum"):
        client.messages.create(**ask)
    assert client.messages.create(**ask).content[0].text == "late"
    assert client.messages.create(**ask).usage.output_tokens == 3
    assert client.messages.create(**ask).content[0].text == "scripted default"


async def test_subprocess_mode_is_scriptable_and_serves_the_provider(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """`python -m tests.support.fake_anthropic`: PORT= on stdout, --script, control endpoints."""
    script = {"messages": [{"kind": "rate_limited"}], "default": {"kind": "text", "text": "child"}}
    with FakeAnthropicProcess(script=script, api_key=KEY) as child:
        monkeypatch.setenv("ANTHROPIC_BASE_URL", child.base_url)
        monkeypatch.setenv("ANTHROPIC_API_KEY", KEY)
        async with AnthropicSummaryProvider(max_retries=0) as provider:
            failure = await expect_failure(provider)
            assert failure.kind == "rate_limited"
            assert (await provider.summarize(summary_request())).text == "child"
            child.load_script({"messages": [{"kind": "overloaded"}]})
            assert (await expect_failure(provider)).kind == "overloaded"

        seen = child.requests()
        assert [request["path"] for request in seen] == ["/v1/messages"] * 3
        assert seen[0]["body"]["system"] == SYSTEM
        child.reset()
        assert child.requests() == []


def test_beta_query_is_routed_and_recorded(fake: FakeAnthropic) -> None:
    body = {"model": "m", "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}]}
    status, _, message = post_raw(fake, "/v1/messages?beta=true", body)
    assert status == 200 and message["type"] == "message"
    assert fake.last_request.path == "/v1/messages"
    assert fake.last_request.is_beta
    status, _, envelope = post_raw(fake, "/v1/complete", body)
    assert (status, envelope["error"]["type"]) == (404, "not_found_error")
