"""The `anthropic` summary provider: one Messages API call per `SummaryRequest`, via the SDK.

Why a thin wrapper: the engine must see every failure as one of the `SummaryFailure` kinds in
`compactd.context.summarize` (so Tier 4/5 can react — e.g. retry with a smaller chunk on
`prompt_too_long`), never an SDK exception or a traceback, and a cancelled summary must simply
stop (the caller writes nothing). Retries are the SDK's own (bounded by `max_retries`); a wall-time
bound covers the whole call including those retries.

A request that offers a fork (`SummaryRequest.fork`) is sent as one: the request compactd rendered,
byte for byte, with the fork's instruction as the last user turn — so the provider reads its
prefix from the prompt cache — on the request's own model, unless this provider was given a
summary model of its own (the cache is per model: a named model is asked the plain prompt).
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import anthropic
import attrs
from anthropic import AsyncAnthropic
from compactd.context.secrets import hold
from compactd.context.summarizer.types import Fork, SummaryFailure, SummaryRequest, SummaryResult
from compactd.context.tiers.reactive import parse_overflow

DEFAULT_SUMMARY_MODEL = "claude-haiku-4-5"
MODEL_ENV = "COMPACTD_SUMMARY_MODEL"

# The only signal the API gives for an over-window prompt (notes §5): no error_code, just this text.

# Above this the SDK refuses a non-streaming `create()` client-side (notes §5), so we must stream.
NON_STREAMING_MAX_TOKENS = 21_333

MAX_DETAIL_CHARS = 400  # provider messages are shown to users; keep them to a line or two

T = TypeVar("T")


class AnthropicSummaryProvider:
    """Summaries from an Anthropic model. Configuration is explicit; nothing falls back silently.

    `timeout_seconds` bounds each HTTP attempt (the SDK's timeout); `wall_seconds` bounds the
    whole call, retries included. Outputs of at least `stream_threshold_tokens` are streamed, so
    long summaries never hit the SDK's non-streaming guard or an idle-connection timeout.
    """

    name = "anthropic"

    def __init__(
        self,
        *,
        model: str | None = None,
        api_key: str | None = None,
        base_url: str | None = None,
        auth_token: str | None = None,
        default_headers: dict[str, str] | None = None,
        max_retries: int = 2,
        timeout_seconds: float = 120.0,
        wall_seconds: float = 300.0,
        stream_threshold_tokens: int = 4096,
    ) -> None:
        self.model = model or os.environ.get(MODEL_ENV) or DEFAULT_SUMMARY_MODEL
        self.model_named = bool(model or os.environ.get(MODEL_ENV))  # a fork keeps to it
        self.max_retries = max_retries
        self.timeout_seconds = timeout_seconds
        self.wall_seconds = wall_seconds
        self.stream_threshold_tokens = stream_threshold_tokens
        self._api_key = api_key  # None: the SDK reads ANTHROPIC_API_KEY (or its other sources)
        self._base_url = base_url  # None: the SDK reads ANTHROPIC_BASE_URL
        self._auth_token = auth_token  # a bearer token instead of a key (what the proxy relays)
        self._default_headers = default_headers
        self._client: AsyncAnthropic | None = None

    # -- public API ------------------------------------------------------------------------

    async def summarize(self, request: SummaryRequest) -> SummaryResult:
        """One summary, or `SummaryFailure`; `asyncio.CancelledError` propagates untouched."""
        fork = request.fork
        body = fork_body(fork, request.max_output_tokens) if fork is not None else None
        if fork is not None and body is not None and self._may_fork(body):
            return await self._forked(body, fork.headers)
        if not request.prompt.strip():
            raise SummaryFailure("other", "nothing to summarize: the summary prompt is empty")
        if request.max_output_tokens < 1:
            raise SummaryFailure("other", "max_output_tokens must be at least 1")
        model = request.model or self.model
        kwargs: dict[str, Any] = {
            "model": model,
            "max_tokens": request.max_output_tokens,
            "messages": [{"role": "user", "content": request.prompt}],
        }
        if request.system:
            kwargs["system"] = request.system
        if self._should_stream(request.max_output_tokens):
            message = await self._bounded(lambda client: self._stream(client, kwargs), "summary")
        else:
            message = await self._bounded(
                lambda client: client.messages.create(**kwargs), "summary"
            )
        return self._result(message, model)

    async def count_tokens(
        self,
        system: str | None,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None = None,
        model: str | None = None,
    ) -> int:
        """The provider's own prompt count (for calibrating the estimator), or `SummaryFailure`."""
        kwargs: dict[str, Any] = {"model": model or self.model, "messages": messages}
        if system:
            kwargs["system"] = system
        if tools:
            kwargs["tools"] = tools
        counted = await self._bounded(
            lambda client: client.messages.count_tokens(**kwargs), "token count"
        )
        return int(counted.input_tokens)

    async def aclose(self) -> None:
        """Close the HTTP connection pool (the daemon calls this on shutdown)."""
        if self._client is not None:
            await self._client.close()
            self._client = None

    async def __aenter__(self) -> AnthropicSummaryProvider:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    # -- internals ---------------------------------------------------------------------------

    def _may_fork(self, body: dict[str, Any]) -> bool:
        """A fork is read from the cache of the model that wrote it: the request's own. A
        provider given a summary model of its own asks that model the plain prompt."""
        model = body.get("model")
        return (
            isinstance(model, str) and bool(model) and (not self.model_named or model == self.model)
        )

    async def _forked(self, body: dict[str, Any], headers: dict[str, str]) -> SummaryResult:
        """The fork, sent as it is built: the request's own fields are passed through as they
        were rendered (`extra_body`), so the prefix the provider cached is the one it reads."""
        kwargs: dict[str, Any] = {
            "model": body["model"],
            "max_tokens": body["max_tokens"],
            "messages": body["messages"],
            "extra_body": {
                k: v for k, v in body.items() if k not in ("model", "max_tokens", "messages")
            },
        }
        if headers:
            kwargs["extra_headers"] = headers
        try:
            if self._should_stream(body["max_tokens"]):
                message = await self._bounded(
                    lambda client: self._stream(client, kwargs), "summary"
                )
            else:
                message = await self._bounded(
                    lambda client: client.messages.create(**kwargs), "summary"
                )
            return attrs.evolve(self._result(message, body["model"]), forked=True)
        except SummaryFailure as failure:
            failure.forked = True  # the engine may ask the plain prompt next
            raise

    def _should_stream(self, max_output_tokens: int) -> bool:
        return (
            max_output_tokens >= self.stream_threshold_tokens
            or max_output_tokens > NON_STREAMING_MAX_TOKENS
        )

    def _client_or_fail(self) -> AsyncAnthropic:
        """The SDK client, built on first use: constructing a provider does no I/O."""
        if self._client is None:
            try:
                client = AsyncAnthropic(
                    api_key=self._api_key,
                    auth_token=self._auth_token,
                    base_url=self._base_url,
                    default_headers=self._default_headers,
                    max_retries=self.max_retries,
                    timeout=self.timeout_seconds,
                )
            except anthropic.AnthropicError as exc:
                raise SummaryFailure(
                    "auth", f"cannot load Anthropic credentials: {_line(exc)}"
                ) from exc
            hold(client.api_key, client.auth_token)  # out of every message compactd emits
            if client.api_key is None and client.auth_token is None and client.credentials is None:
                raise SummaryFailure(
                    "auth", "no Anthropic API key: set ANTHROPIC_API_KEY or configure api_key"
                )
            self._client = client
        return self._client

    @staticmethod
    async def _stream(client: AsyncAnthropic, kwargs: dict[str, Any]) -> Any:
        async with client.messages.stream(**kwargs) as stream:
            return await stream.get_final_message()

    async def _bounded(self, call: Callable[[AsyncAnthropic], Awaitable[T]], what: str) -> T:
        """Run one SDK call under the wall-time bound; every failure becomes `SummaryFailure`."""
        client = self._client_or_fail()
        try:
            return await asyncio.wait_for(call(client), timeout=self.wall_seconds)
        except asyncio.CancelledError:
            raise  # the caller cancelled: no failure record, nothing written
        except TimeoutError as exc:
            raise SummaryFailure(
                "timeout", f"no {what} within the {self.wall_seconds:g} s wall-time bound"
            ) from exc
        except SummaryFailure:
            raise
        except Exception as exc:
            raise failure_from_exception(exc) from exc

    @staticmethod
    def _result(message: Any, requested_model: str) -> SummaryResult:
        """The summary of a message that ended as it meant to: one cut off at `max_tokens`
        (or stopped for any other reason) is half a summary, never committed as one."""
        text = "".join(
            block.text for block in message.content if getattr(block, "type", None) == "text"
        )
        if message.stop_reason == "tool_use":  # a fork carries the agent's tools
            raise SummaryFailure("other", "the model called a tool instead of writing the summary")
        if message.stop_reason not in COMPLETE_STOPS:
            raise SummaryFailure(
                "truncated",
                f"the model stopped before the summary's end (stop_reason={message.stop_reason}"
                f", {len(text)} characters written)",
            )
        if not text.strip():
            raise SummaryFailure(
                "empty", f"the model returned no summary text (stop_reason={message.stop_reason})"
            )
        usage = message.usage
        return SummaryResult(
            text=text.strip(),
            model=message.model or requested_model,
            input_tokens=usage.input_tokens or 0,
            output_tokens=usage.output_tokens or 0,
            cache_read_input_tokens=usage.cache_read_input_tokens or 0,
            cache_creation_input_tokens=usage.cache_creation_input_tokens or 0,
        )


COMPLETE_STOPS = frozenset({"end_turn", "stop_sequence"})
"""Stop reasons of an answer that ended where the model meant it to."""

FORCED_TOOL_CHOICES = frozenset({"any", "tool"})
"""A `tool_choice` that makes the model call a tool: a fork under it could write no summary
(and a fork must keep the request's own, or the provider re-reads its messages uncached)."""


def fork_body(fork: Fork, max_output: int) -> dict[str, Any] | None:
    """The Messages body of a summary asked as a fork (`Fork`): the rendered request as it is,
    the instruction as a text block after everything in its last user message (after tool
    results, as the API requires) or as a user message of its own, room for `max_output`
    tokens of summary (beside an `enabled` thinking budget, which stays what it was: thinking
    settings are part of what the cache keys). None where the request cannot be forked: not
    the Anthropic format, or a `tool_choice` that forces a call."""
    if fork.format != "anthropic" or not fork.request.get("messages"):
        return None
    choice = fork.request.get("tool_choice")
    if isinstance(choice, dict) and choice.get("type") in FORCED_TOOL_CHOICES:
        return None
    body = {k: v for k, v in fork.request.items() if k != "stream"}
    ask = {"type": "text", "text": fork.instruction}
    messages = list(body["messages"])
    last = messages[-1]
    if last.get("role") == "user":
        content = last.get("content")
        blocks = [{"type": "text", "text": content}] if isinstance(content, str) else content
        messages[-1] = {**last, "content": [*blocks, ask]}
    else:
        messages.append({"role": "user", "content": [ask]})
    body["messages"] = messages
    thinking = body.get("thinking")
    budget = 0
    if isinstance(thinking, dict) and thinking.get("type") == "enabled":
        budget = int(thinking.get("budget_tokens") or 0)
    elif isinstance(thinking, dict) and thinking.get("type") == "adaptive":
        budget = max_output  # adaptive thinking spends from the same max_tokens
    body["max_tokens"] = max_output + budget
    return body


def failure_from_exception(exc: Exception) -> SummaryFailure:
    """Map an SDK (or other) exception to a `SummaryFailure` with a one-line message."""
    if isinstance(exc, anthropic.APITimeoutError):  # before APIConnectionError: a subclass
        return SummaryFailure("timeout", "the Anthropic API did not answer in time")
    if isinstance(exc, anthropic.APIConnectionError):
        return SummaryFailure("unavailable", f"cannot reach the Anthropic API: {_line(exc)}")
    if isinstance(exc, anthropic.APIStatusError):
        return _failure_from_status(exc)
    if isinstance(exc, anthropic.CredentialsError):
        return SummaryFailure("auth", f"cannot load Anthropic credentials: {_line(exc)}")
    return SummaryFailure("other", f"{type(exc).__name__}: {_line(exc)}")


def _failure_from_status(exc: anthropic.APIStatusError) -> SummaryFailure:
    """HTTP errors by status; an `error` event inside a 200 stream by its `error.type`."""
    status = exc.status_code
    error_type = exc.type
    detail = exc.api_message or _line(exc)
    message = _clip(f"Anthropic API {status} {error_type or 'error'}: {detail}")
    if exc.request_id:
        message = f"{message} (request {exc.request_id})"

    def fail(kind: str, **numbers: int) -> SummaryFailure:
        return SummaryFailure(kind, message, status=status, **numbers)

    if status == 200:  # the stream started fine, then the server sent `event: error`
        return fail("overloaded" if error_type == "overloaded_error" else "stream_error")
    if status == 400:
        found = parse_overflow(400, exc.api_message or "")  # the one reading of that message
        if found is not None and found.prompt_tokens is not None:
            return fail(
                "prompt_too_long",
                prompt_tokens=found.prompt_tokens,
                limit_tokens=found.limit_tokens or 0,
            )
        return fail("other")
    if status == 413 or error_type == "request_too_large":
        return fail("too_large")
    if status == 429:
        return fail("rate_limited")
    if status == 529 or error_type == "overloaded_error":
        return fail("overloaded")
    if status in (401, 403):
        return fail("auth")
    if status in (408, 504):
        return fail("timeout")
    if status in (502, 503):
        return fail("unavailable")
    return fail("other")


def _line(exc: BaseException) -> str:
    """The first line of an exception's text — never a traceback."""
    text = str(exc).strip().splitlines()
    return _clip(text[0]) if text else type(exc).__name__


def _clip(text: str) -> str:
    return text if len(text) <= MAX_DETAIL_CHARS else text[: MAX_DETAIL_CHARS - 1] + "…"
