"""`compactd claude [args…]` and `compactd codex [args…]`: the agent through compactd in one
command.

A proxy already serving this data dir is used (its address is in the data dir's `proxy.json`,
or the default port; its `GET /healthz` must say it is compactd's proxy on the same sessions and
upstream); otherwise one is started on a free loopback port, its log in the data dir. The agent
runs in this terminal with its base URL pointed at the proxy — Claude Code through
`ANTHROPIC_BASE_URL`; Codex through `-c` overrides that add a model provider for the run, so
the user's `config.toml` is never touched — and its exit code is this command's. The proxy this
command started stops when the agent exits; a proxy that stops under the agent stops the agent
too, at once, rather than leaving it to retry a dead address for minutes.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import attrs
import orjson
import platformdirs

LISTENING = re.compile(r"compactd proxy listening on (http://[^\s]+)")
DEFAULT_PROXY = "http://127.0.0.1:8788"
START_SECONDS = 60.0
STOP_SECONDS = 15.0
WATCH_SECONDS = 1.0
EXIT_NOT_INSTALLED = 127
EXIT_PROXY_DIED = 3


@attrs.frozen
class Agent:
    binary: str
    install: str
    base_url_env: str  # the variable a user may already point at an upstream (a gateway)
    upstream_option: str  # the proxy's option for that upstream

    def environment(self, url: str) -> dict[str, str]:
        return {"ANTHROPIC_BASE_URL": url} if self.binary == "claude" else {}

    def arguments(self, url: str) -> list[str]:
        """Codex's provider for this run, as `-c` overrides (its config.toml stays as it is):
        the Responses API at the proxy, with the key from `OPENAI_API_KEY`, else Codex's own
        stored login."""
        if self.binary != "codex":
            return []
        auth = 'env_key = "OPENAI_API_KEY"'
        if not os.environ.get("OPENAI_API_KEY"):
            auth = "requires_openai_auth = true"
        provider = f'{{ name = "compactd", base_url = "{url}/v1", wire_api = "responses", {auth} }}'
        return ["-c", 'model_provider="compactd"', "-c", f"model_providers.compactd={provider}"]


AGENTS = {
    "claude": Agent(
        "claude",
        "npm install -g @anthropic-ai/claude-code",
        "ANTHROPIC_BASE_URL",
        "anthropic_upstream",
    ),
    "codex": Agent("codex", "npm install -g @openai/codex", "OPENAI_BASE_URL", "openai_upstream"),
}
LAUNCH_OPTIONS = {  # the launcher's own options (before the agent's arguments) -> takes a value
    "--window": True,
    "--anthropic-upstream": True,
    "--openai-upstream": True,
    "--no-recall": False,
    "--no-stats": False,
    "--new-proxy": False,
}


OWN_FLAGS = ("-h", "--help", "-v", "-vv", "-q", "--quiet", "--verbose", "--color")


def split_arguments(argv: list[str], value_options: tuple[str, ...]) -> tuple[list[str], list[str]]:
    """compactd's options (the launcher's and the global ones, right after the command) and
    the agent's arguments (from the first other argument on; `--` ends compactd's early)."""
    ours: list[str] = []
    i = 0
    while i < len(argv):
        arg = argv[i]
        if arg == "--":
            return ours, argv[i + 1 :]
        name = arg.split("=", 1)[0]
        takes_value = LAUNCH_OPTIONS.get(name, name in value_options)
        known = name in LAUNCH_OPTIONS or name in value_options or arg in OWN_FLAGS
        if not known:
            break
        ours.append(arg)
        if takes_value and "=" not in arg and i + 1 < len(argv):
            ours.append(argv[i + 1])
            i += 1
        i += 1
    return ours, argv[i:]


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--window",
        type=int,
        default=None,
        help="cap every request's context window (default: the window of the model the agent "
        "asks for)",
    )
    p.add_argument("--anthropic-upstream", metavar="URL", help="where Claude Code's requests go")
    p.add_argument("--openai-upstream", metavar="URL", help="where Codex's requests go")
    p.add_argument("--no-recall", action="store_true", help="do not offer compactd_recall")
    p.add_argument("--no-stats", action="store_true", help="record nothing in the request log")
    p.add_argument(
        "--new-proxy",
        action="store_true",
        help="start a proxy of its own even when one is already running on this data dir",
    )


def data_dir_of(ns: argparse.Namespace) -> Path:
    """Where the proxy keeps its sessions (as `compactd proxy` decides it)."""
    given = ns.data_dir or os.environ.get("COMPACTD_DATA_DIR")
    return Path(given) if given else Path(platformdirs.user_data_dir("compactd", appauthor=False))


def health(url: str, timeout: float = 2.0) -> dict[str, Any] | None:
    """A proxy's `/healthz`, or None when nothing (or something else) answers there."""
    import urllib.request  # here: every command's parser reads this module's options

    try:
        with urllib.request.urlopen(f"{url}/healthz", timeout=timeout) as answer:
            data = json.loads(answer.read())
    except (OSError, ValueError):  # urllib's URLError is an OSError
        return None
    ok = isinstance(data, dict) and data.get("service") == "compactd proxy"
    return data if ok else None


def upstreams(ns: argparse.Namespace) -> dict[str, str]:
    """The upstreams the proxy should use: the options, else a base URL the user's own
    environment already points the agents at (a gateway), else the providers'."""
    return {
        "anthropicUpstream": ns.anthropic_upstream
        or os.environ.get("ANTHROPIC_BASE_URL")
        or "https://api.anthropic.com",
        "openaiUpstream": ns.openai_upstream
        or os.environ.get("OPENAI_BASE_URL", "").removesuffix("/v1")
        or "https://api.openai.com",
    }


def running_proxy(ns: argparse.Namespace, data_dir: Path) -> tuple[str, dict[str, Any]] | None:
    """A proxy already serving this data dir, with the same upstreams and window."""
    candidates = []
    with contextlib.suppress(OSError, ValueError):
        candidates.append(json.loads((data_dir / "proxy.json").read_text())["url"])
    candidates.append(DEFAULT_PROXY)
    wanted = {**upstreams(ns), "window": ns.window}
    for url in dict.fromkeys(candidates):
        found = health(url)
        if found is None:
            continue
        same_store = found.get("store") == str(data_dir) or url != DEFAULT_PROXY
        if same_store and all(found.get(k) == v for k, v in wanted.items()):
            return url, found
    return None


def proxy_command(ns: argparse.Namespace) -> list[str]:
    command = [sys.executable, "-m", "compactd", "proxy", "--listen", "127.0.0.1:0"]
    ups = upstreams(ns)
    command += ["--anthropic-upstream", ups["anthropicUpstream"]]
    command += ["--openai-upstream", ups["openaiUpstream"]]
    if ns.window is not None:
        command += ["--window", str(ns.window)]
    for flag, on in (("--no-recall", ns.no_recall), ("--no-stats", ns.no_stats)):
        if on:
            command.append(flag)
    for flag, value in (
        ("--data-dir", ns.data_dir),
        ("--store", ns.store),
        ("--summary-provider", ns.summary_provider),
        ("--summary-model", ns.summary_model),
    ):
        if value:
            command += [flag, value]
    if ns.session_config:
        command += ["--config", orjson.dumps(ns.session_config).decode()]
    return command


class StartedProxy:
    """A `compactd proxy` this command started: its address, and a clean stop."""

    def __init__(self, ns: argparse.Namespace, data_dir: Path) -> None:
        data_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        self.log_path = data_dir / "proxy.log"
        log = self.log_path.open("ab")
        os.chmod(self.log_path, 0o600)
        self.process = subprocess.Popen(
            proxy_command(ns),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=log,
            start_new_session=True,  # the terminal's Ctrl-C is the agent's, not the proxy's
        )
        log.close()
        self.url = self._address()
        threading.Thread(target=self._drain, daemon=True).start()

    def _address(self) -> str:
        assert self.process.stdout is not None
        deadline = time.monotonic() + START_SECONDS
        while time.monotonic() < deadline:
            line = self.process.stdout.readline().decode(errors="replace")
            if not line:
                break
            found = LISTENING.search(line)
            if found:
                return found.group(1)
        self.stop()
        raise RuntimeError(f"the proxy did not start (its log: {self.log_path})")

    def _drain(self) -> None:
        assert self.process.stdout is not None
        with contextlib.suppress(OSError, ValueError):
            while self.process.stdout.read(4096):
                pass

    def alive(self) -> bool:
        return self.process.poll() is None

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGINT)
            try:
                self.process.wait(timeout=STOP_SECONDS)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=STOP_SECONDS)


def watch(agent: subprocess.Popen[bytes], alive: Callable[[], bool], died: threading.Event) -> None:
    """Stop the agent as soon as its proxy is gone (it would retry a dead address for
    minutes, printing nothing)."""
    misses = 0
    while agent.poll() is None:
        misses = 0 if alive() else misses + 1
        if misses >= 2:
            died.set()
            with contextlib.suppress(ProcessLookupError):
                agent.terminate()
            return
        time.sleep(WATCH_SECONDS)


def run(ns: argparse.Namespace) -> int:
    agent = AGENTS[ns.command]
    binary = shutil.which(agent.binary)
    if binary is None:
        print(
            f"compactd: {agent.binary} is not installed (or not on PATH): {agent.install}",
            file=sys.stderr,
        )
        return EXIT_NOT_INSTALLED
    data_dir = data_dir_of(ns)
    started: StartedProxy | None = None
    found = None if ns.new_proxy else running_proxy(ns, data_dir)
    if found is not None:
        url = found[0]
        alive: Callable[[], bool] = lambda: health(url) is not None  # noqa: E731
        said = f"using the proxy already running at {url} (pid {found[1].get('pid')})"
    else:
        try:
            started = StartedProxy(ns, data_dir)
        except (OSError, RuntimeError) as exc:
            print(f"compactd: {exc}", file=sys.stderr)
            return EXIT_PROXY_DIED
        url = started.url
        alive = started.alive
        said = (
            f"proxy at {url} (pid {started.process.pid}, log {started.log_path}); "
            "it stops when the agent does"
        )
    if not ns.quiet:
        print(f"compactd: {said}; the page: {url}/", file=sys.stderr)
    died = threading.Event()
    try:
        code = _run_agent(binary, agent, url, ns.agent_args, alive, died)
    finally:
        if started is not None:
            started.stop()
    if died.is_set():
        print(
            f"compactd: the proxy at {url} stopped, so {agent.binary} was stopped too "
            f"(the proxy's log: {started.log_path if started else 'where it was started'})",
            file=sys.stderr,
        )
        return EXIT_PROXY_DIED
    return code


def _run_agent(
    binary: str,
    agent: Agent,
    url: str,
    args: list[str],
    alive: Callable[[], bool],
    died: threading.Event,
) -> int:
    """The agent in this terminal, its exit code (a signal's as a shell gives it: 128 + n).
    Ctrl-C is the agent's to handle; a SIGTERM or SIGHUP here is passed on to it."""
    env = {**os.environ, **agent.environment(url)}
    process = subprocess.Popen([binary, *agent.arguments(url), *args], env=env)
    passed = {}

    def pass_on(signum: int, _frame: object) -> None:
        with contextlib.suppress(ProcessLookupError):
            process.send_signal(signum)

    for signum in (signal.SIGTERM, signal.SIGHUP):
        passed[signum] = signal.signal(signum, pass_on)
    ignored = signal.signal(signal.SIGINT, signal.SIG_IGN)
    threading.Thread(target=watch, args=(process, alive, died), daemon=True).start()
    try:
        code = process.wait()
    finally:
        signal.signal(signal.SIGINT, ignored)
        for signum, before in passed.items():
            signal.signal(signum, before)
    return 128 - code if code < 0 else code
