"""Clients that leave, and clients that are slow, cost the proxy nothing for long. A client that
disconnects cancels its upstream request at once (an upstream that has fallen silent would
otherwise hold it for its whole timeout) and is one INFO line, never a traceback — also when it
hangs up the moment its answer ends, as Codex does. Half-sent header blocks are closed after
`--client-timeout` (aiohttp's own bound on a connection with no request yet), a half-sent body
is a 408 in the API's shape, and a well-formed request is answered while they are open, even
with the descriptors of a 1,024-file limit all taken."""

from __future__ import annotations

import resource
import selectors
import socket
import struct
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import anthropic
import orjson
import pytest

from tests.support.fake_anthropic import FakeAnthropic, Reply
from tests.support.fake_openai import FakeOpenAI
from tests.support.proxy import ProxyProcess

from .conftest import events_of, snapshot

KEY = "sk-ant-clients-0123456789"
LEFT = "the client left before its answer ended"


def wait_for(condition: Callable[[], bool], seconds: float = 30.0) -> bool:
    """Whether `condition` came true within `seconds` (a bound for a loaded machine)."""
    deadline = time.monotonic() + seconds
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def request_bytes(path: str, body: dict[str, object], headers: dict[str, str]) -> bytes:
    data = orjson.dumps(body)
    head = [f"POST {path} HTTP/1.1", "Host: 127.0.0.1", f"Content-Length: {len(data)}"]
    head += [f"{k}: {v}" for k, v in headers.items()]
    return ("\r\n".join(head) + "\r\n\r\n").encode() + data


MESSAGES_HEADERS = {
    "content-type": "application/json",
    "x-api-key": KEY,
    "anthropic-version": "2023-06-01",
}


def stream_request(session: str) -> bytes:
    body = {
        "model": "claude-sonnet-4-5",
        "max_tokens": 64,
        "stream": True,
        "messages": [{"role": "user", "content": f"think hard ({session})"}],
    }
    return request_bytes(
        "/v1/messages", body, {**MESSAGES_HEADERS, "x-claude-code-session-id": session}
    )


def read_until(sock: socket.socket, marker: bytes) -> bytes:
    got = b""
    while marker not in got:
        chunk = sock.recv(65536)
        if not chunk:
            break
        got += chunk
    return got


def hang_up(sock: socket.socket) -> None:
    """Close at once, unread bytes and all (an RST), as an agent that quits does."""
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    sock.close()


def half_sent_headers(port: int, count: int) -> list[socket.socket]:
    """`count` connections, each open (its handshake done) with half a header block sent."""
    done: list[socket.socket] = []
    with selectors.DefaultSelector() as waiting:
        for _ in range(count):
            sock = socket.socket()
            sock.setblocking(False)
            sock.connect_ex(("127.0.0.1", port))
            waiting.register(sock, selectors.EVENT_WRITE)
        deadline = time.monotonic() + 60
        while waiting.get_map() and time.monotonic() < deadline:
            for key, _ in waiting.select(timeout=0.2):
                sock = key.fileobj
                assert isinstance(sock, socket.socket)
                waiting.unregister(sock)
                if sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR) == 0:
                    sock.send(b"POST /v1/messages HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-")
                    done.append(sock)
                else:
                    sock.close()
        for key in list(waiting.get_map().values()):
            key.fileobj.close()  # type: ignore[union-attr]
    assert len(done) == count, f"only {len(done)} of {count} connections opened"
    return done


@pytest.fixture
def fake() -> Iterator[FakeAnthropic]:
    with FakeAnthropic() as running:
        yield running


def test_a_client_that_leaves_cancels_its_upstream_request(
    fake: FakeAnthropic, tmp_path: Path
) -> None:
    """Thirty streamed requests to an upstream that falls silent after `message_start`, each
    client gone once it has that first event: every upstream request is closed within
    seconds (not at the 300 s idle bound, set to 600 here), one INFO line each."""
    clients = 30
    fake.default = Reply.answer("never finished").broken("silence", 2)
    with ProxyProcess(
        tmp_path / "data",
        anthropic=fake.base_url,
        args=["--summary-provider", "digest", "--upstream-idle-timeout", "600"],
    ) as proxy:
        for n in range(clients):
            with socket.create_connection(("127.0.0.1", proxy.port), timeout=30) as sock:
                sock.sendall(stream_request(f"leaving-{n}"))
                assert b"message_start" in read_until(sock, b"event: ping")
        assert wait_for(lambda: fake.silent == 0), f"{fake.silent} upstream requests still open"
        assert wait_for(lambda: proxy.log.count(LEFT) == clients), proxy.log
    assert proxy.returncode == 0
    assert "Traceback" not in proxy.log and " ERROR " not in proxy.log, proxy.log
    assert len([line for line in proxy.log.splitlines() if "INFO" in line and LEFT in line]) == (
        clients
    )


def test_a_client_that_hangs_up_at_its_answer_s_end_is_no_traceback(tmp_path: Path) -> None:
    """Codex closes its connection as soon as it reads `response.completed`: the proxy may
    still be ending the stream. Nothing is logged above DEBUG for that, and the answer's usage
    is still recorded."""
    answers = 10
    responses = FakeOpenAI().start()
    responses.linger = 0.3
    try:
        with ProxyProcess(
            tmp_path / "data",
            openai=f"http://127.0.0.1:{responses.port}",
            args=["--summary-provider", "digest"],
        ) as proxy:
            for n in range(answers):
                body = {
                    "model": "gpt-5-codex",
                    "input": f"list the files ({n})",
                    "stream": True,
                    "prompt_cache_key": "hang-up",
                }
                headers = {"content-type": "application/json", "authorization": f"Bearer {KEY}"}
                sock = socket.create_connection(("127.0.0.1", proxy.port), timeout=30)
                sock.sendall(request_bytes("/v1/responses", body, headers))
                assert b"response.completed" in read_until(sock, b"response.completed")
                hang_up(sock)

            def recorded() -> int:
                return sum(
                    1
                    for e in events_of(proxy.data_dir, "hang-up")
                    if e.get("t") == "record" and e["r"]["kind"] == "usage"
                )

            assert wait_for(lambda: recorded() == answers), recorded()
    finally:
        responses.stop()
    assert "Traceback" not in proxy.log and "Error" not in proxy.log, proxy.log
    assert LEFT not in proxy.log


def test_half_sent_headers_do_not_stop_a_well_formed_request(
    fake: FakeAnthropic, tmp_path: Path
) -> None:
    """1,100 connections that send half a header block and wait, against a proxy limited to
    1,024 descriptors: a well-formed request is still answered while they stay open."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < 1400:
        pytest.skip(f"this test needs 1,400 descriptors of its own (the hard limit is {hard})")
    ours = 4096 if hard == resource.RLIM_INFINITY else min(4096, hard)
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, ours), hard))
    slow: list[socket.socket] = []
    try:
        with ProxyProcess(
            tmp_path / "data",
            anthropic=fake.base_url,
            args=["--summary-provider", "digest", "--client-timeout", "3"],
            open_files=1024,
        ) as proxy:
            slow += half_sent_headers(proxy.port, 1100)
            fake.push(Reply.answer("Answered."))
            # with an SDK's own retries: a request the proxy takes while the last of them are
            # still being accepted may find no descriptor free (a 500 it may retry)
            client = anthropic.Anthropic(base_url=proxy.base_url, api_key=KEY, timeout=60)
            answer = client.messages.create(
                model="claude-sonnet-4-5",
                max_tokens=16,
                messages=[{"role": "user", "content": "are you there?"}],
            )
            assert answer.content[0].text == "Answered."
    finally:
        for sock in slow:
            sock.close()
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    assert "Traceback" not in proxy.log, proxy.log


def test_a_half_sent_body_is_a_408_and_writes_nothing(fake: FakeAnthropic, tmp_path: Path) -> None:
    with ProxyProcess(
        tmp_path / "data",
        anthropic=fake.base_url,
        args=["--summary-provider", "digest", "--client-timeout", "2"],
    ) as proxy:
        before = snapshot(proxy.data_dir)
        request = stream_request("half-a-body")
        with socket.create_connection(("127.0.0.1", proxy.port), timeout=30) as sock:
            sock.sendall(request[: len(request) - 20])
            answer = read_until(sock, b"}}")
        head, _, body = answer.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 408"), answer
        error = orjson.loads(body[body.index(b"{") :])
        assert error["type"] == "error" and error["error"]["type"] == "timeout_error"
        assert snapshot(proxy.data_dir) == before
        assert fake.messages_requests() == []
