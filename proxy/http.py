"""The proxy's side of HTTP: which headers are the connection's own (never relayed), the
upstream's headers a client sees, one upstream request as a context manager, an upstream's
answer read whole (a reset is the API's 502, never a traceback), and the upstream's refusals."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import aiohttp
import orjson
from aiohttp import web

from ..context.secrets import scrub
from ..context.summarizer.types import SummaryFailure
from .wire import ApiError

HOP_BY_HOP = frozenset(
    {
        "host",
        "content-length",
        "connection",
        "keep-alive",
        "transfer-encoding",
        "te",
        "trailer",
        "upgrade",
        "proxy-authorization",
        "proxy-connection",
        "accept-encoding",
        "content-encoding",
    }
)


def response_headers(upstream: aiohttp.ClientResponse, json: bool = False) -> dict[str, str]:
    """The upstream's headers the client should see (its request id above all)."""
    out = {k: v for k, v in upstream.headers.items() if k.lower() not in HOP_BY_HOP}
    if json:
        out = {k: v for k, v in out.items() if k.lower() != "content-type"}
    return out


class Upstream:
    """`async with` one upstream request; a refused connection is the API's 502, never a
    traceback, and never names the request's headers."""

    def __init__(
        self,
        http: aiohttp.ClientSession,
        method: str,
        url: str,
        headers: dict[str, str],
        data: bytes | None,
        on_answer: Callable[[], None],
    ) -> None:
        self._cm = http.request(method, url, headers=headers, data=data)
        self._url = url.split("?", 1)[0]
        self._on_answer = on_answer

    async def __aenter__(self) -> aiohttp.ClientResponse:
        try:
            response = await self._cm.__aenter__()
            self._on_answer()
            return response
        except aiohttp.ClientConnectorError as exc:
            raise ApiError(
                502,
                "api_error",
                f"compactd's proxy could not reach the upstream at {self._url}: "
                f"{exc.os_error.strerror or exc.os_error}",
            ) from None
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise ApiError(
                502,
                "api_error",
                f"compactd's proxy lost the upstream at {self._url}: {type(exc).__name__}",
            ) from None

    async def __aexit__(self, *exc: object) -> None:
        await self._cm.__aexit__(*exc)


class UpstreamRefusal(ApiError):
    """The upstream's own error answer (its status, body and headers): relayed as it came to
    a client still waiting for a status, or in the client's stream as that wire reports an
    error (each wire reads the body in its own shape, `own_body`)."""

    def __init__(self, status: int, raw: bytes, headers: dict[str, str]) -> None:
        super().__init__(status, "api_error", f"the upstream refused the request ({status})")
        self.raw = raw
        self.headers = headers

    def own_body(self) -> Any:
        try:
            return orjson.loads(self.raw)
        except orjson.JSONDecodeError:
            return None


def broke(message: str) -> ApiError:
    """The upstream's answer given up: the API's 502, saying why."""
    return ApiError(502, "api_error", f"compactd's proxy gave up the upstream's answer: {message}")


async def next_chunk(upstream: aiohttp.ClientResponse, idle: float) -> bytes:
    """The upstream's next bytes (b"": its end). A reset, or a silence longer than `idle`
    seconds once the answer has begun, is a `broke` error (a stream the upstream keeps alive
    sends pings well within it)."""
    try:
        async with asyncio.timeout(idle):
            return await upstream.content.readany()
    except TimeoutError:
        raise broke(f"the upstream sent nothing for {idle:g} s") from None
    except aiohttp.ClientError as exc:
        raise broke(f"the connection broke off ({type(exc).__name__})") from None


async def read_whole(upstream: aiohttp.ClientResponse, idle: float) -> bytes:
    """An upstream's whole answer; one that breaks off or stalls on the way is the API's 502."""
    parts = []
    while chunk := await next_chunk(upstream, idle):
        parts.append(chunk)
    return b"".join(parts)


async def refusal(upstream: aiohttp.ClientResponse, idle: float) -> UpstreamRefusal:
    """The upstream's error answer, read, as the exception that relays it."""
    return UpstreamRefusal(
        upstream.status, await read_whole(upstream, idle), response_headers(upstream, json=False)
    )


def client_gone(request: web.BaseRequest) -> bool:
    """The client closed its connection (it will read nothing more)."""
    transport = request.transport
    return transport is None or transport.is_closing()


def scrubbed(raw: bytes) -> bytes:
    """Bytes of an error without any secret the proxy holds (an upstream may echo the key it
    refused); the same object when there was none."""
    text = raw.decode("utf-8", "replace")
    clean = scrub(text)
    return raw if clean == text else clean.encode()


async def post_json(
    url: str, headers: dict[str, str], body: Any, timeout: float
) -> tuple[int, dict[str, Any]]:
    """One request of compactd's own (a summary) and its answer's JSON object ({} when the
    answer is not one); a timeout or an unreachable upstream is the `SummaryFailure` saying
    so."""
    try:
        async with (
            aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=timeout)) as http,
            http.post(
                url,
                data=orjson.dumps(body),
                headers={**headers, "content-type": "application/json"},
            ) as response,
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
    return status, answer if isinstance(answer, dict) else {}
