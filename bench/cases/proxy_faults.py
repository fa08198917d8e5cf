"""The proxy left on all day: its first byte at a 1,000-turn session, its memory across clients
that leave mid-answer, and its throughput with twenty sessions at once — each against the same
work straight to the same loopback upstream, or against its own floor, in one run.

(The 100-turn first byte is `proxy_first_byte_ratio`, in `proxy.py`; the helpers are its.)
"""

from __future__ import annotations

import http.client
import socket
import statistics
import sys
import threading
import time
from pathlib import Path
from typing import Any

import orjson
from registry import REPO, Context, Measurement, case

from cases.proxy import _first_byte

if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

LONG_TURNS = 1_000
LONG_RESULT_CHARS = 400  # 1,000 steps of these stay under a 200K window (~130K tokens)
SYSTEM = "You are a coding agent. " * 400
HEADERS = {
    "content-type": "application/json",
    "x-api-key": "bench-key",
    "anthropic-version": "2023-06-01",
}


def _steps(start: int, end: int, chars: int, tag: str = "") -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for i in range(start, end):
        call = {
            "type": "tool_use",
            "id": f"toolu_{tag}{i:05d}",
            "name": "Bash",
            "input": {"command": f"cat part-{i}.txt"},
        }
        text = "".join(f"line {n} of part {i}: some output text\n" for n in range(chars // 30 + 1))
        out += [
            {"role": "assistant", "content": [{"type": "text", "text": f"Reading {i}."}, call]},
            {
                "role": "user",
                "content": [
                    {"type": "tool_result", "tool_use_id": call["id"], "content": text[:chars]}
                ],
            },
        ]
    return out


def _body(messages: list[dict[str, Any]], stream: bool = True) -> bytes:
    return orjson.dumps(
        {
            "model": "claude-sonnet-4-5",
            "max_tokens": 1024,
            "stream": stream,
            "system": SYSTEM,
            "tools": [{"name": "Bash", "input_schema": {"type": "object"}}],
            "messages": messages,
        }
    )


@case("proxy_first_byte_ratio_1000_turns", target=1.2)
def proxy_first_byte_ratio_1000_turns(ctx: Context) -> Measurement:
    """(time to the first streamed byte through the proxy − 20 ms) over the same request
    straight to the loopback upstream, at a 1,000-turn session (target: ≤ 1.2× + 20 ms)."""
    from tests.support.fake_anthropic import FakeAnthropic
    from tests.support.proxy import ProxyProcess

    first = [{"role": "user", "content": "Read every part."}]
    with ctx.scratch() as root, FakeAnthropic() as fake:
        proxy = ProxyProcess(root / "data", anthropic=fake.base_url, args=["--no-recall"])
        proxy.start()
        try:
            grown = LONG_TURNS - 10
            history = first + _steps(0, grown, LONG_RESULT_CHARS)
            _first_byte(proxy.port, _body(history))  # the session, as far as the agent got
            times: dict[str, list[float]] = {"proxy": [], "direct": []}
            for step in range(grown, grown + max(ctx.repeat, 10)):
                history += _steps(step, step + 1, LONG_RESULT_CHARS)
                body = _body(history)
                times["proxy"].append(_first_byte(proxy.port, body))
                times["direct"].append(_first_byte(fake.port, body))
        finally:
            proxy.stop()
    t = {name: statistics.median(v) for name, v in times.items()}
    ratio = max(0.0, t["proxy"] - 0.020) / t["direct"]
    note = (
        f"{len(history) // 2} steps of {LONG_RESULT_CHARS}-character results "
        f"({len(body) / 1e6:.1f} MB a request); proxy {t['proxy'] * 1000:.1f} ms vs direct "
        f"{t['direct'] * 1000:.1f} ms to the first byte"
    )
    return Measurement(ratio, t, note)


def _rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError("no VmRSS")


def _leave_mid_answer(port: int, body: bytes) -> None:
    """A streamed request whose client leaves once the answer has begun."""
    data = b"".join(
        [
            b"POST /v1/messages HTTP/1.1\r\nHost: 127.0.0.1\r\n",
            f"Content-Length: {len(body)}\r\n".encode(),
            *(f"{k}: {v}\r\n".encode() for k, v in HEADERS.items()),
            b"x-claude-code-session-id: bench-leaving\r\n\r\n",
            body,
        ]
    )
    with socket.create_connection(("127.0.0.1", port), timeout=60) as sock:
        sock.sendall(data)
        got = b""
        while b"event: ping" not in got:
            chunk = sock.recv(65536)
            if not chunk:
                raise RuntimeError("the proxy closed the stream")
            got += chunk


def _wait(condition: Any, seconds: float = 120.0) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        if time.monotonic() > deadline:
            raise RuntimeError("the proxy did not let go of its upstream requests")
        time.sleep(0.05)


@case("proxy_disconnect_rss_growth_mb", target=5.0)
def proxy_disconnect_rss_growth_mb(ctx: Context) -> Measurement:
    """The proxy's resident memory after 1,000 clients that left mid-answer (an upstream gone
    silent after `message_start`), less before them, in MB (target: flat within 5 MB)."""
    from tests.support.fake_anthropic import FakeAnthropic, Reply
    from tests.support.proxy import ProxyProcess

    count = 100 if ctx.quick else 1_000
    body = _body([{"role": "user", "content": "Think for a long time."}])
    with ctx.scratch() as root, FakeAnthropic() as fake:
        fake.default = Reply.answer("never finished").broken("silence", 2)
        proxy = ProxyProcess(
            root / "data",
            anthropic=fake.base_url,
            args=["--no-recall", "--upstream-idle-timeout", "600"],
        )
        proxy.start()
        try:
            assert proxy.process is not None
            pid = proxy.process.pid
            for _ in range(200):  # warm: the session, the pools, the allocator's arenas
                _leave_mid_answer(proxy.port, body)
            _wait(lambda: fake.silent == 0)
            before = _rss_mb(pid)
            start = time.perf_counter()
            for _ in range(count):
                _leave_mid_answer(proxy.port, body)
            _wait(lambda: fake.silent == 0)
            elapsed = time.perf_counter() - start
            after = _rss_mb(pid)
            still_open = fake.silent
        finally:
            proxy.stop()
    growth = after - before
    note = (
        f"RSS {before:.1f} MB before, {after:.1f} MB after {count:,} disconnects "
        f"({growth * 1024 / count:.1f} KB each); upstream requests still open: {still_open}"
    )
    return Measurement(growth, {"per disconnect": elapsed / count}, note)


def _session(port: int, tag: str, turns: int, out: list[float]) -> None:
    """One agent's session: `turns` streamed requests, each its history plus one step."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
    history: list[dict[str, Any]] = [{"role": "user", "content": f"Read every part ({tag})."}]
    start = time.perf_counter()
    for step in range(turns):
        history += _steps(step, step + 1, 2_000, tag)
        conn.request(
            "POST",
            "/v1/messages",
            body=_body(history),
            headers={**HEADERS, "x-claude-code-session-id": f"bench-{tag}"},
        )
        response = conn.getresponse()
        response.read()
        if response.status != 200:
            raise RuntimeError(f"{response.status}: {response.read()[:200]!r}")
    out.append(time.perf_counter() - start)
    conn.close()


def _concurrent(port: int, sessions: int, turns: int, tag: str) -> float:
    """Wall time of `sessions` agents at once, `turns` requests each."""
    out: list[float] = []
    threads = [
        threading.Thread(target=_session, args=(port, f"{tag}{n}x", turns, out))
        for n in range(sessions)
    ]
    start = time.perf_counter()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if len(out) != sessions:
        raise RuntimeError("a session failed")
    return time.perf_counter() - start


@case("proxy_concurrent_sessions_ratio")
def proxy_concurrent_sessions_ratio(ctx: Context) -> Measurement:
    """Wall time of 20 agents at once, 25 streamed requests each, through the proxy over the
    same straight to the loopback upstream (the inverse of the throughput ratio)."""
    from tests.support.fake_anthropic import FakeAnthropic
    from tests.support.proxy import ProxyProcess

    sessions, turns = (4, 5) if ctx.quick else (20, 25)
    with ctx.scratch() as root, FakeAnthropic() as fake:
        proxy = ProxyProcess(root / "data", anthropic=fake.base_url, args=["--no-recall"])
        proxy.start()
        try:
            rounds = 1 if ctx.quick else 3
            times: dict[str, list[float]] = {"proxy": [], "direct": []}
            for n in range(rounds):  # interleaved, each round its own sessions
                times["proxy"].append(_concurrent(proxy.port, sessions, turns, f"p{n}"))
                times["direct"].append(_concurrent(fake.port, sessions, turns, f"d{n}"))
        finally:
            proxy.stop()
    t = {name: statistics.median(v) for name, v in times.items()}
    requests = sessions * turns
    note = (
        f"{sessions} sessions × {turns} requests: {requests / t['proxy']:.0f} requests/s "
        f"through the proxy, {requests / t['direct']:.0f} straight"
    )
    return Measurement(t["proxy"] / t["direct"], t, note)
