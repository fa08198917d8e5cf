"""The proxy's side of HTTP: which headers are the connection's own (never relayed), the
upstream's headers a client sees, and one upstream request as a context manager."""

from __future__ import annotations

from collections.abc import Callable

import aiohttp

from .anthropic import ApiError

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
        out.pop("Content-Type", None)
        out.pop("content-type", None)
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
