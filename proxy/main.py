"""`compactd proxy`: the proxy's command — its settings, the services, the server on loopback."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import errno
import ipaddress
import json
import logging
import os
import resource
import shlex
import shutil
import signal
import sys
from pathlib import Path
from typing import Any

import attrs
from aiohttp import web

from ..context.errors import CompactdError
from ..context.policy import MAX_REQUEST_BYTES, Policy
from ..context.secrets import scrub_logs
from ..context.stores import default_data_dir
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
    for flag, seconds in (
        ("--upstream-idle-timeout", args.upstream_idle_timeout),
        ("--client-timeout", args.client_timeout),
    ):
        if not seconds > 0:
            raise SystemExit(f"compactd: {flag} must be a positive number of seconds")
    return ProxySettings(
        host=host,
        port=int(port),
        anthropic_upstream=args.anthropic_upstream,
        openai_upstream=args.openai_upstream,
        gemini_upstream=args.gemini_upstream,
        window=args.window,
        stats=not getattr(args, "no_stats", False),
        upstream_idle_seconds=args.upstream_idle_timeout,
        client_timeout_seconds=args.client_timeout,
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


def summary_input(window: int | None, config: dict[str, Any]) -> dict[str, Any]:
    """The session config with compactd's own summary calls inside `--window` too: one call's
    input at most half the window (the upstream refuses a longer one, and a chunk retried
    smaller costs a call), unless the config names its own."""
    named = {"summaryInputMaxTokens", "summary_input_max_tokens"} & set(config)
    if window is None or named:
        return config
    default = Policy().summary_input_max_tokens
    return {**config, "summaryInputMaxTokens": min(default, window // 2)}


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
        config={"recall": True, **summary_input(args.window, settings.config), **recall},
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
            called=proxy.ledger.call,
        )

    app = App(ProxyFront(summarizer), settings)
    proxy = Proxy(app, config)
    return app, proxy


SERVICE_NAME = "compactd-proxy.service"


def service_unit(args: argparse.Namespace, argv: list[str]) -> str:
    """A systemd user unit that runs this proxy (these options, this data dir) and restarts it
    if it stops: the way to leave the proxy on."""
    script = shutil.which("compactd")
    command = [script] if script else [sys.executable, "-m", "compactd"]
    options = [a for a in argv if a != "--print-service"]
    data_dir = Path(args.data_dir).resolve() if args.data_dir else default_data_dir()
    environment = f"Environment=COMPACTD_DATA_DIR={data_dir}\n"
    if args.store:
        environment = ""  # the URL holds a password: keep it in an EnvironmentFile instead
    return (
        "[Unit]\n"
        "Description=compactd proxy: the context manager in front of your coding agents\n"
        "After=network-online.target\n\n"
        "[Service]\n"
        f"ExecStart={shlex.join([*command, 'proxy', *options])}\n"
        f"{environment}"
        "Restart=on-failure\n\n"
        "[Install]\n"
        "WantedBy=default.target\n"
    )


def run(args: argparse.Namespace) -> int:
    if args.print_service:
        print(service_unit(args, sys.argv[sys.argv.index("proxy") + 1 :]), end="")
        print(
            f"# save as ~/.config/systemd/user/{SERVICE_NAME}, then: systemctl --user daemon-"
            f"reload && systemctl --user enable --now {SERVICE_NAME}",
            file=sys.stderr,
        )
        return 0
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
    _raise_open_files_limit()
    asyncio.get_running_loop().set_exception_handler(_loop_exception)
    runner = web.AppRunner(
        proxy.application(),
        access_log=None,
        handle_signals=False,
        # a client that leaves cancels its handler, and with it the upstream request
        handler_cancellation=True,
        # aiohttp closes a connection whose header block is not in this long after it opened
        # (or after its last answer, kept alive): half-sent headers hold nothing for long
        keepalive_timeout=proxy.settings.client_timeout_seconds,
    )
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
    beacon = _Beacon(app.settings.data_dir, f"http://{proxy.settings.host}:{port}")
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
        beacon.remove()
        await runner.cleanup()
        await proxy.ledger.recorder.drain()  # the last requests' rows are written
    return 0


class _Beacon:
    """`proxy.json` in the data dir while the proxy runs: where `compactd claude` looks for a
    proxy already serving these sessions (it asks that address's `/healthz` to be sure)."""

    NAME = "proxy.json"

    def __init__(self, data_dir: Path, url: str) -> None:
        self.path = data_dir / self.NAME
        self.pid = os.getpid()
        try:
            data_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
            temp = self.path.with_name(f".{self.NAME}.{self.pid}")
            temp.write_text(json.dumps({"url": url, "pid": self.pid}))
            temp.chmod(0o600)
            temp.replace(self.path)
        except OSError as exc:  # a hint for other commands, never a reason not to serve
            log.info("cannot write %s: %s", self.path, exc.strerror)

    def remove(self) -> None:
        """Gone with the proxy, unless another proxy has written its own since."""
        with contextlib.suppress(OSError, ValueError):
            if json.loads(self.path.read_text()).get("pid") == self.pid:
                self.path.unlink()


def _raise_open_files_limit() -> None:
    """Every connection is a descriptor: the soft limit raised to the hard one, as servers do
    (a 1,024 default is a thousand idle connections)."""
    try:
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        wanted = 1 << 20 if hard == resource.RLIM_INFINITY else hard  # Linux's own ceiling
        if soft != resource.RLIM_INFINITY and soft < wanted:
            resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, hard))
    except (ValueError, OSError) as exc:  # a hard limit the system will not grant
        log.debug("the open files limit stays as it was: %s", exc)


def _loop_exception(loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
    """Out of descriptors, asyncio stops accepting for a second and says so with a traceback:
    one line is enough (the proxy goes on; slow clients time out and free theirs)."""
    exc = context.get("exception")
    if isinstance(exc, OSError) and exc.errno in (errno.EMFILE, errno.ENFILE):
        log.warning("out of file descriptors (%s); accepting new connections again shortly", exc)
        return
    loop.default_exception_handler(context)
