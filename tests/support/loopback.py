"""What every scripted loopback upstream shares: an HTTP/1.1 server on 127.0.0.1 in a thread
(each event sent at once: `TCP_NODELAY`, else Nagle holds an event for the client's delayed
ACK), the script it answers from, and start / stop. Each fake says only how its API answers
(`handle`)."""

from __future__ import annotations

import argparse
import json
import signal
import socket
import threading
from collections import deque
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Self


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True


class ScriptedUpstream:
    """A fake API upstream: `handle(h, method)` answers each request; `load_script` queues
    replies, sets the default one and the context window it enforces."""

    def __init__(self) -> None:
        self.default: dict[str, Any] = {"kind": "text", "text": "Hello from the fake."}
        self.queue: deque[dict[str, Any]] = deque()
        self.context_window: int | None = None

    def handle(self, h: BaseHTTPRequestHandler, method: str) -> None:
        raise NotImplementedError

    def serve(self, port: int) -> None:
        """Bind the server (`port` 0: any free one); `start` runs it."""
        fake = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def setup(self) -> None:
                super().setup()
                self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

            def log_message(self, format: str, *args: Any) -> None:
                pass

            def do_GET(self) -> None:
                fake.handle(self, "GET")

            def do_POST(self) -> None:
                fake.handle(self, "POST")

        self.server = _Server(("127.0.0.1", port), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def port(self) -> int:
        return self.server.server_address[1]

    def load_script(self, script: dict[str, Any]) -> None:
        if "default" in script:
            self.default = script["default"]
        for item in script.get("replies", []):
            self.queue.append(item)
        if "context_window" in script:
            self.context_window = script["context_window"]

    def start(self) -> Self:
        self.thread.start()
        return self

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def run_until_stopped(make: Any, description: str, argv: list[str] | None = None) -> int:
    """A fake as a child process (`--port`, `--script`): prints `PORT=N` once it listens and
    serves until SIGTERM or SIGINT. `make(port)` builds the fake."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--script", type=Path)
    options = parser.parse_args(argv)
    fake = make(options.port)
    if options.script:
        fake.load_script(json.loads(options.script.read_text()))
    fake.start()
    stopped = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stopped.set())
    signal.signal(signal.SIGINT, lambda *_: stopped.set())
    print(f"PORT={fake.port}", flush=True)
    while not stopped.wait(0.5):
        pass
    fake.stop()
    return 0
