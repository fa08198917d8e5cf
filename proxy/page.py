"""The proxy's own page and its health: what compactd did and saved, live, at the proxy's root.

`GET /` is one self-contained HTML file (no CDN, no font, no request beyond this proxy, so it
works offline); it reads `GET /api/stats`, `GET /api/sessions/{id}`, a recall handle's content
(`GET /api/sessions/{id}/recall?handle=…`) and hears of each new row on `GET /api/events`
(server-sent events). Everything here answers only a loopback peer addressed by a loopback
name, whatever `--listen` says: sessions' content is behind it, and a web page elsewhere must
not read it through a browser on this machine (the `Host` check stops a DNS rebinding).

`GET /healthz` says that this is compactd's proxy and where its sessions are, so `compactd
claude` can find one already running on the same data dir.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.metadata
import ipaddress
import os
from importlib import resources
from typing import Any

import orjson
from aiohttp import web
from yarl import URL

from ..context.errors import CompactdError
from ..service.app import App
from ..service.stats import CALL, PASSED, REQUEST, Recorder, Usage, summarize
from .wire import ApiError

HEARTBEAT_SECONDS = 15.0
RECALL_CHARS = 200_000
"""What one click shows of a handle's content at most (page by page, as the model reads it)."""


def _loopback(host: str | None) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host or "").is_loopback
    except ValueError:
        return False


def local_only(request: web.Request) -> None:
    """Refuse (403) a peer or a `Host` that is not this machine's loopback."""
    try:
        host = URL(f"http://{request.host}").host
    except ValueError:
        host = None
    if not (_loopback(request.remote) and _loopback(host)):
        raise ApiError(
            403, "permission_error", "compactd's page answers only on this machine's loopback"
        )


def _json(value: Any, status: int = 200) -> web.Response:
    return web.Response(
        body=orjson.dumps(value),
        status=status,
        content_type="application/json",
        headers={"cache-control": "no-store"},
    )


def session_view(rows: list[dict[str, Any]], session_id: str) -> dict[str, Any]:
    """One session for the page: its sums, each request and call over time, the last
    request's panel, and the cascade's events in order with their recall handles."""
    own = sorted((r for r in rows if r.get("sessionId") == session_id), key=lambda r: r["at"])
    report = summarize(own)
    requests: list[dict[str, Any]] = []
    events: list[dict[str, Any]] = []
    panel: dict[str, Any] | None = None
    for row in own:
        usage = Usage.from_json(row.get("usage"))
        kind = row.get("kind")
        item: dict[str, Any] = {"at": row["at"], "kind": kind, "model": row.get("model")}
        if kind == REQUEST:
            item.update(
                status=row.get("status"),
                clientTokens=row.get("clientTokens"),
                sentTokens=row.get("sentTokens"),
                upstreamTokens=usage.prompt if usage else None,
                cacheRead=usage.cache_read if usage else 0,
                cacheWrite=usage.cache_write if usage else 0,
                output=usage.output if usage else 0,
                window=row.get("window"),
                limit=row.get("limit"),
            )
            for event in row.get("events") or []:
                events.append({**event, "at": row["at"], "request": len(requests)})
            panel = {
                "at": row["at"],
                "model": row.get("model"),
                "window": row.get("window"),
                "limit": row.get("limit"),
                "categories": row.get("categories") or {},
                "total": row.get("sentTokens"),
                "reported": usage.prompt if usage else None,
            }
        elif kind == PASSED:
            item["reason"] = row.get("reason")
        elif kind == CALL:
            item.update(
                purpose=row.get("purpose"),
                upstreamTokens=usage.prompt if usage else None,
                output=usage.output if usage else 0,
            )
        requests.append(item)
    summary = report["sessions"][0] if report["sessions"] else None
    return {"session": summary, "requests": requests, "panel": panel, "events": events}


class Page:
    """The page's routes over one proxy's `App` and its stats `Recorder`."""

    def __init__(self, app: App, recorder: Recorder, health: dict[str, Any]) -> None:
        self.app = app
        self.recorder = recorder
        self.health = health
        self._streams: set[asyncio.Queue[dict[str, Any] | None]] = set()
        recorder.listeners.append(self._heard)

    def routes(self, web_app: web.Application) -> None:
        web_app.router.add_get("/", self.index)
        web_app.router.add_get("/healthz", self.healthz)
        web_app.router.add_get("/api/stats", self.stats)
        web_app.router.add_get("/api/events", self.events)
        web_app.router.add_get("/api/sessions/{sid}", self.session)
        web_app.router.add_get("/api/sessions/{sid}/recall", self.recall)
        web_app.on_shutdown.append(self._close_streams)

    async def index(self, request: web.Request) -> web.StreamResponse:
        local_only(request)
        html = resources.files("compactd.proxy").joinpath("static", "index.html").read_bytes()
        return web.Response(
            body=html,
            content_type="text/html",
            charset="utf-8",
            headers={
                "cache-control": "no-store",
                # nothing but this page's own inline code, and requests to this proxy
                "content-security-policy": "default-src 'none'; script-src 'unsafe-inline'; "
                "style-src 'unsafe-inline'; connect-src 'self'; img-src 'self' data:",
            },
        )

    async def healthz(self, request: web.Request) -> web.StreamResponse:
        local_only(request)
        return _json({"status": "ok", "pid": os.getpid(), "version": _version(), **self.health})

    async def stats(self, request: web.Request) -> web.StreamResponse:
        local_only(request)
        return _json(summarize(await self.recorder.rows()))

    async def session(self, request: web.Request) -> web.StreamResponse:
        local_only(request)
        sid = request.match_info["sid"]
        view = session_view(await self.recorder.rows(), sid)
        if view["session"] is None:
            return _json({"error": f"no proxied session {sid!r}"}, 404)
        return _json(view)

    async def recall(self, request: web.Request) -> web.StreamResponse:
        """What a recall handle stands for: the page the model would get, whole lines."""
        local_only(request)
        sid = request.match_info["sid"]
        handle = request.query.get("handle", "")
        if not handle or not self.app.engine.library.exists(sid):
            return _json({"error": "a handle of a stored session is needed"}, 404)
        try:
            pages = await self.app.run(sid, lambda s: _recalled(self.app, s.id, handle))
        except CompactdError as exc:
            return _json({"error": str(exc)}, 404)
        first, last = pages[0], pages[-1]
        return _json(
            {
                "handle": handle,
                "text": "".join(p.text for p in pages),
                "startLine": first.start_line,
                "endLine": last.end_line,
                "totalLines": last.total_lines,
                "truncated": last.truncated,
            }
        )

    async def events(self, request: web.Request) -> web.StreamResponse:
        """Server-sent events: one `row` event per row recorded, a comment now and then."""
        local_only(request)
        response = web.StreamResponse(
            headers={"content-type": "text/event-stream", "cache-control": "no-store"}
        )
        await response.prepare(request)
        queue: asyncio.Queue[dict[str, Any] | None] = asyncio.Queue(maxsize=1000)
        self._streams.add(queue)
        try:
            await response.write(b": compactd\n\n")
            while True:
                try:
                    row = await asyncio.wait_for(queue.get(), HEARTBEAT_SECONDS)
                except TimeoutError:
                    await response.write(b": still here\n\n")
                    continue
                if row is None:
                    break
                await response.write(b"event: row\ndata: " + orjson.dumps(row) + b"\n\n")
        except (ConnectionResetError, asyncio.CancelledError):
            pass
        finally:
            self._streams.discard(queue)
        with contextlib.suppress(ConnectionResetError):
            await response.write_eof()
        return response

    def _heard(self, row: dict[str, Any]) -> None:
        brief = {k: row.get(k) for k in ("kind", "sessionId", "at")}
        for queue in list(self._streams):
            with contextlib.suppress(asyncio.QueueFull):
                queue.put_nowait(brief)

    async def _close_streams(self, _app: web.Application) -> None:
        for queue in list(self._streams):
            with contextlib.suppress(asyncio.QueueFull):
                queue.put_nowait(None)


def _recalled(app: App, session_id: str, handle: str) -> list[Any]:
    """A handle's content page by page, as the model would read it, up to `RECALL_CHARS`."""
    pages = [app.engine.recall(session_id, handle)]
    read = len(pages[0].text)
    while pages[-1].truncated and read < RECALL_CHARS:
        last = pages[-1]
        if last.end_line >= last.total_lines:
            break
        pages.append(app.engine.recall(session_id, handle, last.end_line + 1))
        read += len(pages[-1].text)
    return pages


def _version() -> str:
    try:
        return importlib.metadata.version("compactd")
    except importlib.metadata.PackageNotFoundError:
        return "unknown"
