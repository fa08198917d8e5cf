"""`compactd proxy`: the proxy's command — its settings, the services, the server on loopback."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import ipaddress
import logging
import os
import signal
import sys

import attrs
from aiohttp import web

from ..context.errors import CompactdError
from ..context.policy import MAX_REQUEST_BYTES
from ..context.secrets import scrub_logs
from ..service import background
from ..service.app import App
from ..service.settings import settings_from
from .front import ProxyFront
from .server import Proxy, ProxySettings
from .summarizer import UpstreamSummarizer

log = logging.getLogger("compactd.proxy")
MESSAGE_ENVELOPE = 64 * 1024
"""What a stored event adds around a message (its sequence number, ids, time)."""


def proxy_settings(args: argparse.Namespace) -> ProxySettings:
    host, _, port = args.listen.rpartition(":")
    if not host or not port.isdigit():
        raise SystemExit(f"compactd: --listen wants HOST:PORT, got {args.listen!r}")
    host = host.strip("[]")
    if not _loopback(host) and not args.allow_remote:
        raise SystemExit(
            f"compactd: {host} is not a loopback address; the proxy relays your API keys, so "
            "listening beyond this machine needs --allow-remote"
        )
    if args.window is not None and args.window <= 0:
        raise SystemExit("compactd: --window must be a positive number of tokens")
    return ProxySettings(
        host=host,
        port=int(port),
        anthropic_upstream=args.anthropic_upstream,
        openai_upstream=args.openai_upstream,
        window=args.window,
        context_editing=args.context_editing,
    )


def _loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def message_limit(limits: dict[str, int]) -> dict[str, int]:
    """The proxy stores any message a request it takes can hold: unless the environment sets
    `maxMessageBytes`, it follows the request limit (a stored message is never bigger than
    the request that brought it, give or take its envelope), so whatever the API accepts (32
    MB a request) the proxy keeps too."""
    if "max_message_bytes" in limits:
        return limits
    request = limits.get("max_request_bytes", MAX_REQUEST_BYTES)
    return {**limits, "max_message_bytes": request + MESSAGE_ENVELOPE}


def build(args: argparse.Namespace) -> tuple[App, Proxy]:
    settings = settings_from(
        args,
        summary_provider=args.summary_provider
        or os.environ.get("COMPACTD_SUMMARY_PROVIDER")
        or "client",
    )
    # recall is on in the proxy (the proxy answers it, so no client has to): a default for
    # sessions without their own `recall`; --no-recall turns it off for every session
    recall = {"recall": False} if args.no_recall else {}
    settings = attrs.evolve(
        settings,
        config={"recall": True, **settings.config, **recall},
        limits=message_limit(settings.limits),
    )
    config = proxy_settings(args)
    proxy: Proxy | None = None

    def summarizer(session_id: str, timeout: float) -> UpstreamSummarizer:
        assert proxy is not None
        return UpstreamSummarizer(
            config.anthropic_upstream,
            proxy.credentials,
            session_id,
            model=settings.summary_model,
            timeout_seconds=timeout,
        )

    app = App(ProxyFront(summarizer), settings)
    proxy = Proxy(app, config)
    return app, proxy


def run(args: argparse.Namespace) -> int:
    level = (args.log_level or os.environ.get("COMPACTD_LOG_LEVEL") or "INFO").upper()
    logging.basicConfig(
        stream=sys.stderr, level=level, format="compactd %(levelname)s %(name)s: %(message)s"
    )
    scrub_logs()  # no secret compactd holds in any line it logs
    logging.getLogger("aiohttp.access").setLevel(logging.WARNING)
    for name in ("watchfiles", "httpx", "httpx2", "anthropic"):
        logging.getLogger(name).setLevel(logging.WARNING)
    try:
        app, proxy = build(args)
    except CompactdError as exc:
        print(f"compactd: {exc}", file=sys.stderr)
        return 2
    if not _loopback(proxy.settings.host):
        log.warning(
            "listening on %s, beyond this machine: anyone who can reach it can use the "
            "API keys of the clients it relays",
            proxy.settings.host,
        )
    try:
        return asyncio.run(serve(app, proxy))
    except KeyboardInterrupt:
        return 130
    finally:
        app.engine.store.close()


async def serve(app: App, proxy: Proxy) -> int:
    runner = web.AppRunner(proxy.application(), access_log=None, handle_signals=False)
    await runner.setup()
    site = web.TCPSite(runner, proxy.settings.host, proxy.settings.port)
    try:
        await site.start()
    except OSError as exc:
        print(
            f"compactd: cannot listen on {proxy.settings.host}:{proxy.settings.port}: "
            f"{exc.strerror}",
            file=sys.stderr,
        )
        await runner.cleanup()
        return 2
    port = runner.addresses[0][1] if runner.addresses else proxy.settings.port
    print(f"compactd proxy listening on http://{proxy.settings.host}:{port}", flush=True)
    print(f"  ANTHROPIC_BASE_URL=http://{proxy.settings.host}:{port}  (Claude Code)", flush=True)
    print(f'  base_url = "http://{proxy.settings.host}:{port}/v1"  (Codex)', flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError):
            loop.add_signal_handler(sig, stop.set)
    tasks = [asyncio.ensure_future(c) for c in background.start(app)]
    try:
        await stop.wait()
    finally:
        for task in tasks:
            task.cancel()
        await runner.cleanup()
    return 0
