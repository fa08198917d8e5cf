"""The proxy's `client` summary provider: the client's own model, through the upstream its
requests go to (the Anthropic Messages API, or OpenAI's Responses or Chat Completions), with the
credentials of the client's latest request on that session.

The credentials are held in memory only (never logged, written or echoed in an error), so a
summary needs a request of that session since the proxy started; background preparation of an
idle session after a restart says the provider is unavailable until the client is back.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import attrs
from anthropic import Omit

from ..context.secrets import hold
from ..context.summarizer.types import SummaryFailure, SummaryRequest, SummaryResult
from ..service.providers.anthropic_provider import AnthropicSummaryProvider
from ..service.stats import Usage

Called = Callable[[str, str, str, str, Usage | None, bool], None]
"""Told of each call: (session, purpose, model, wire, usage, whether it gave a summary)."""

AUTH_HEADERS = ("x-api-key", "authorization")
"""The headers that carry a client's credentials: relayed upstream and nowhere else."""
RELAYED_HEADERS = ("anthropic-version",)


def credentials(headers: Mapping[str, str]) -> list[str]:
    """The secrets a request carries (its API key, its bearer token)."""
    found = []
    for name in AUTH_HEADERS:
        value = headers.get(name)
        if not value:
            continue
        if value[:7].lower() == "bearer ":
            value = value[7:].strip()
        found.append(value)
    return found


@attrs.define
class Credentials:
    """What a session's latest request said about who is asking, for which model, and through
    which API (`anthropic`, `responses` or `chat`) at which upstream."""

    headers: dict[str, str]
    model: str
    api: str = "anthropic"
    upstream: str = ""


class UpstreamSummarizer:
    """Summaries for one session from the Anthropic upstream, as the client would ask."""

    def __init__(
        self,
        upstream: str,
        credentials: Mapping[str, Credentials],
        session_id: str,
        *,
        model: str | None,
        timeout_seconds: float,
        called: Called | None = None,
    ) -> None:
        self.upstream = upstream
        self.credentials = credentials
        self.session_id = session_id
        self.model = model
        self.timeout_seconds = timeout_seconds
        self.called = called

    async def summarize(self, request: SummaryRequest) -> SummaryResult:
        """One summary call, told to `called` (the proxy's stats) with its usage."""
        held = self.credentials.get(self.session_id)
        model = self.model or (held.model if held is not None else "")
        wire = held.api if held is not None else "anthropic"
        try:
            result = await self._summarize(request)
        except SummaryFailure as failure:
            if self.called is not None and failure.kind not in ("unavailable", "timeout"):
                self.called(self.session_id, request.purpose, model, wire, None, False)
            raise
        if self.called is not None:
            usage = Usage(
                input=result.input_tokens,
                cache_read=result.cache_read_input_tokens,
                cache_write=result.cache_creation_input_tokens,
                output=result.output_tokens,
            )
            self.called(self.session_id, request.purpose, result.model or model, wire, usage, True)
        return result

    async def _summarize(self, request: SummaryRequest) -> SummaryResult:
        held = self.credentials.get(self.session_id)
        if held is None:
            raise SummaryFailure(
                "unavailable",
                "no request of this session has reached the proxy since it started, so there "
                "are no credentials to ask the upstream with",
            )
        # out of every log line, error and record, whatever the upstream's error echoes
        hold(*credentials(held.headers))
        if held.api != "anthropic":
            return await openai_summary(
                held, request, model=self.model or held.model, timeout=self.timeout_seconds
            )
        headers: dict[str, Any] = {k: v for k, v in held.headers.items() if k not in AUTH_HEADERS}
        api_key = held.headers.get("x-api-key")
        bearer = held.headers.get("authorization", "")
        token = bearer[7:].strip() if bearer.lower().startswith("bearer ") else None
        if not api_key:  # the SDK would otherwise add the environment's key beside the token
            headers["X-Api-Key"] = Omit()
        provider = AnthropicSummaryProvider(
            model=self.model or held.model,
            api_key=api_key or None,
            auth_token=None if api_key else token,
            base_url=held.upstream or self.upstream,
            default_headers=headers,
            timeout_seconds=self.timeout_seconds,
            wall_seconds=self.timeout_seconds,
        )
        try:
            return await provider.summarize(request)
        finally:
            await provider.aclose()


async def openai_summary(
    held: Credentials, request: SummaryRequest, *, model: str, timeout: float
) -> SummaryResult:
    """One summary from an OpenAI API (the one the session's client speaks), non-streamed; an
    answer cut short by its token limit is a failure, not a summary."""
    import aiohttp
    import orjson

    headers = {
        "authorization": held.headers.get("authorization", ""),
        "content-type": "application/json",
    }
    if held.api == "responses":
        url = held.upstream.rstrip("/") + "/v1/responses"
        body: dict[str, Any] = {
            "model": model,
            "instructions": request.system,
            "input": request.prompt,
            "max_output_tokens": request.max_output_tokens,
            "store": False,
        }
    else:
        url = held.upstream.rstrip("/") + "/v1/chat/completions"
        body = {
            "model": model,
            "messages": [
                {"role": "system", "content": request.system},
                {"role": "user", "content": request.prompt},
            ],
            "max_completion_tokens": request.max_output_tokens,
        }
    try:
        async with (
            aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=timeout)) as http,
            http.post(url, data=orjson.dumps(body), headers=headers) as response,
        ):
            data = await response.read()
            status = response.status
    except TimeoutError:
        raise SummaryFailure("timeout", "the upstream did not answer in time") from None
    except aiohttp.ClientError as exc:
        raise SummaryFailure(
            "unavailable", f"cannot reach the upstream: {type(exc).__name__}"
        ) from None
    try:
        answer = orjson.loads(data)
    except orjson.JSONDecodeError:
        answer = None
    if not isinstance(answer, dict):
        answer = {}
        if status == 200:
            raise SummaryFailure("other", "the upstream's answer is not a JSON object")
    if status != 200:
        error = answer.get("error")
        error = error if isinstance(error, dict) else {}
        message = str(error.get("message") or f"HTTP {status}")[:300]
        kind = {401: "auth", 403: "auth", 429: "rate_limited"}.get(status, "other")
        if error.get("code") == "context_length_exceeded":
            kind = "prompt_too_long"
        raise SummaryFailure(kind, f"the upstream refused the summary: {message}", status=status)
    if held.api == "responses":
        text = "".join(
            part.get("text", "")
            for item in answer.get("output") or []
            if item.get("type") == "message"
            for part in item.get("content") or []
            if part.get("type") == "output_text"
        )
        cut = answer.get("status") == "incomplete"
        usage = answer.get("usage") or {}
        tokens_in, tokens_out = usage.get("input_tokens", 0), usage.get("output_tokens", 0)
    else:
        choice = (answer.get("choices") or [{}])[0]
        text = str((choice.get("message") or {}).get("content") or "")
        cut = choice.get("finish_reason") == "length"
        usage = answer.get("usage") or {}
        tokens_in, tokens_out = usage.get("prompt_tokens", 0), usage.get("completion_tokens", 0)
    if cut:
        raise SummaryFailure("other", "the summary stopped at its token limit (incomplete)")
    if not text.strip():
        raise SummaryFailure("empty", "the model returned no summary text")
    return SummaryResult(
        text=text.strip(),
        model=str(answer.get("model") or model),
        input_tokens=int(tokens_in or 0),
        output_tokens=int(tokens_out or 0),
    )
