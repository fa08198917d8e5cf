"""A real `compactd proxy` process for tests: spawned on a free loopback port, its log kept so a
test can check what it said (and that no secret is in it)."""

from __future__ import annotations

import os
import re
import resource
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
LISTENING = re.compile(r"compactd proxy listening on (http://127\.0\.0\.1:(\d+))")


class ProxyProcess:
    """``with ProxyProcess(data_dir, anthropic=URL, window=64000) as proxy:`` → `proxy.base_url`;
    after it ends, `proxy.log` is everything it wrote and `proxy.returncode` its exit code.
    `open_files` caps its descriptors (soft and hard), as a small machine's limit would."""

    def __init__(
        self,
        data_dir: Path,
        *,
        anthropic: str | None = None,
        openai: str | None = None,
        gemini: str | None = None,
        window: int | None = None,
        args: Sequence[str] = (),
        env: dict[str, str] | None = None,
        open_files: int | None = None,
    ) -> None:
        self.data_dir = data_dir
        command = [sys.executable, "-m", "compactd", "proxy", "--listen", "127.0.0.1:0"]
        if anthropic:
            command += ["--anthropic-upstream", anthropic]
        if openai:
            command += ["--openai-upstream", openai]
        if gemini:
            command += ["--gemini-upstream", gemini]
        if window is not None:
            command += ["--window", str(window)]
        self.command = [*command, *args]
        self.env = {**os.environ, "COMPACTD_DATA_DIR": str(data_dir), **(env or {})}
        self.open_files = open_files  # its descriptor limit, soft and hard (None: ours)
        self.process: subprocess.Popen[bytes] | None = None
        self.log_path = data_dir.parent / f"proxy-{os.getpid()}-{id(self)}.log"
        self.base_url = ""
        self.returncode: int | None = None

    def start(self, timeout: float = 120.0) -> ProxyProcess:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self._log = self.log_path.open("wb")
        self.process = subprocess.Popen(
            self.command,
            cwd=ROOT,
            env=self.env,
            stdout=subprocess.PIPE,
            stderr=self._log,
            preexec_fn=self._limit if self.open_files is not None else None,
        )
        assert self.process.stdout is not None
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            line = self.process.stdout.readline().decode()
            if not line:
                break
            found = LISTENING.search(line)
            if found:
                self.base_url = found.group(1)
                return self
        self.stop()
        raise RuntimeError(f"the proxy did not start; its log:\n{self.log}")

    def _limit(self) -> None:
        assert self.open_files is not None
        resource.setrlimit(resource.RLIMIT_NOFILE, (self.open_files, self.open_files))

    @property
    def port(self) -> int:
        return int(self.base_url.rsplit(":", 1)[1])

    @property
    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def stop(self) -> int | None:
        if self.process is not None:
            if self.process.poll() is None:
                self.process.send_signal(signal.SIGINT)
                try:
                    self.process.wait(timeout=60)
                except subprocess.TimeoutExpired:
                    self.process.kill()
                    self.process.wait(timeout=5)
            self.returncode = self.process.returncode
            if self.process.stdout is not None:
                self.process.stdout.close()
            self.process = None
            self._log.close()
        return self.returncode

    def __enter__(self) -> ProxyProcess:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


class TappedProxy(ProxyProcess):
    """A proxy with a recording tap in front: clients talk to the tap (`base_url`), and
    `tap.bodies` holds every body they sent, before the proxy changed anything."""

    def start(self, timeout: float = 30.0) -> TappedProxy:
        from tests.support.tap import Tap

        super().start(timeout)
        self.proxy_url = self.base_url
        self.tap = Tap(self.proxy_url).start()
        self.base_url = self.tap.base_url
        return self

    def stop(self) -> int | None:
        tap = getattr(self, "tap", None)
        if tap is not None:
            tap.stop()
        return super().stop()


def client_bodies(proxies: list[TappedProxy], path: str) -> list[Any]:
    """What clients sent to `path` through these proxies' taps, in order."""
    return [
        body for proxy in proxies for sent, body in proxy.tap.bodies if sent.split("?")[0] == path
    ]
