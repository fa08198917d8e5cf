"""A recording tap in front of a server: every request is forwarded as it came and its answer
relayed as it streams, and each POST's JSON body is kept — what a client sent before the
server (compactd's proxy) changed anything, so a test can count it as the upstream would have."""

from __future__ import annotations

import http.client
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import urlsplit

HOP = {"connection", "keep-alive", "transfer-encoding", "content-length", "host"}


class Tap:
    """``with Tap(target_url) as tap:`` → point the client at `tap.base_url`; `tap.bodies` holds
    (path, body) of every POST, in order."""

    def __init__(self, target: str) -> None:
        self.target = urlsplit(target)
        self.bodies: list[tuple[str, Any]] = []
        self._lock = threading.Lock()
        tap = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: Any) -> None:
                pass

            def do_GET(self) -> None:
                tap._forward(self, None)

            def do_POST(self) -> None:
                raw = self.rfile.read(int(self.headers.get("content-length") or 0))
                try:
                    body = json.loads(raw)
                except ValueError:
                    body = None
                with tap._lock:
                    tap.bodies.append((self.path, body))
                tap._forward(self, raw)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def _forward(self, handler: BaseHTTPRequestHandler, raw: bytes | None) -> None:
        upstream = http.client.HTTPConnection(self.target.hostname, self.target.port, timeout=900)
        headers = {k: v for k, v in handler.headers.items() if k.lower() not in HOP}
        upstream.request(handler.command, handler.path, body=raw, headers=headers)
        answer = upstream.getresponse()
        handler.send_response(answer.status)
        for name, value in answer.getheaders():
            if name.lower() not in HOP:
                handler.send_header(name, value)
        handler.send_header("transfer-encoding", "chunked")
        handler.send_header("connection", "close")
        handler.end_headers()
        while chunk := answer.read1(65536):
            handler.wfile.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
            handler.wfile.flush()
        handler.wfile.write(b"0\r\n\r\n")
        handler.close_connection = True
        upstream.close()

    def start(self) -> Tap:
        self._thread.start()
        return self

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    def __enter__(self) -> Tap:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
