"""Headless Chromium from the OS packages, driven over its DevTools protocol (a websocket, through
aiohttp): a test loads a page in a real browser and reads what the browser rendered.

Chromium is started with no network of its own beyond what the page asks (no background
networking, component updates, sync or QUIC: on a closed network those connections are
refused and slow it down) and an empty profile each time.
"""

from __future__ import annotations

import asyncio
import base64
import itertools
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import aiohttp

FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--window-size=1400,1300",
)
START_SECONDS = 60.0


def chromium() -> str | None:
    for name in ("chromium", "chromium-browser", "google-chrome"):
        found = shutil.which(name)
        if found:
            return found
    return None


class Browser:
    """``async with Browser(profile_dir) as browser:`` → `goto`, `evaluate`, `wait_for`,
    `screenshot`; the browser process (and its children) stop on exit."""

    def __init__(self, profile: Path) -> None:
        self.profile = profile
        self.process: subprocess.Popen[bytes] | None = None
        self._http: aiohttp.ClientSession | None = None
        self._ws: aiohttp.ClientWebSocketResponse | None = None
        self._ids = itertools.count(1)

    async def __aenter__(self) -> Browser:
        binary = chromium()
        if binary is None:
            raise RuntimeError("no chromium on PATH: `make test` installs it with apt-get")
        self.profile.mkdir(parents=True, exist_ok=True)
        self.process = subprocess.Popen(
            [
                binary,
                *FLAGS,
                f"--user-data-dir={self.profile}",
                "--remote-debugging-port=0",
                "about:blank",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        port_file = self.profile / "DevToolsActivePort"
        deadline = time.monotonic() + START_SECONDS
        while not port_file.exists() or not port_file.read_text().strip():
            if self.process.poll() is not None or time.monotonic() > deadline:
                await self.__aexit__()
                raise RuntimeError("chromium did not start its DevTools endpoint")
            await asyncio.sleep(0.1)
        port = int(port_file.read_text().split()[0])
        self._http = aiohttp.ClientSession()
        targets = []
        while not targets and time.monotonic() < deadline:
            async with self._http.get(f"http://127.0.0.1:{port}/json/list") as listed:
                targets = [t for t in await listed.json() if t.get("type") == "page"]
            if not targets:
                await asyncio.sleep(0.1)
        self._ws = await self._http.ws_connect(targets[0]["webSocketDebuggerUrl"], max_msg_size=0)
        await self.send("Page.enable")
        await self.send("Runtime.enable")
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._ws is not None:
            await self._ws.close()
        if self._http is not None:
            await self._http.close()
        if self.process is not None and self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait(timeout=15)

    async def send(self, method: str, params: dict[str, Any] | None = None) -> dict[str, Any]:
        """One DevTools command; its result (events that arrive meanwhile are passed over)."""
        assert self._ws is not None
        call = next(self._ids)
        await self._ws.send_json({"id": call, "method": method, "params": params or {}})
        while True:
            message = await self._ws.receive_json(timeout=START_SECONDS)
            if message.get("id") == call:
                if "error" in message:
                    raise RuntimeError(f"{method}: {message['error']}")
                return message.get("result", {})

    async def goto(self, url: str) -> None:
        await self.send("Page.navigate", {"url": url})

    async def evaluate(self, expression: str) -> Any:
        result = await self.send(
            "Runtime.evaluate",
            {"expression": expression, "returnByValue": True, "awaitPromise": True},
        )
        if "exceptionDetails" in result:
            raise RuntimeError(f"{expression}: {result['exceptionDetails']}")
        return result.get("result", {}).get("value")

    async def wait_for(self, expression: str, timeout: float = 60.0) -> Any:
        """The expression's value once it is truthy (the page rendered it), polled."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                value = await self.evaluate(expression)
            except RuntimeError:  # the page is not there yet (still loading, or rendering)
                value = None
            if value:
                return value
            if time.monotonic() > deadline:
                raise TimeoutError(f"the page never showed {expression!r}")
            await asyncio.sleep(0.2)

    async def screenshot(self, path: Path) -> bytes:
        shot = await self.send("Page.captureScreenshot", {"format": "png"})
        data = base64.b64decode(shot["data"])
        path.write_bytes(data)
        return data
