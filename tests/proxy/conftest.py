"""Fixtures of the proxy's tests: loopback fakes of both providers and a real `compactd proxy`."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest

from tests.support.fake_anthropic import FakeAnthropic
from tests.support.fake_openai import FakeOpenAI
from tests.support.proxy import ProxyProcess


@pytest.fixture(scope="module")
def fakes() -> Iterator[tuple[FakeAnthropic, FakeOpenAI]]:
    with FakeAnthropic() as messages:
        responses = FakeOpenAI().start()
        try:
            yield messages, responses
        finally:
            responses.stop()


@contextlib.contextmanager
def proxy_before(
    fakes: tuple[FakeAnthropic, FakeOpenAI], data: Path, *args: str
) -> Iterator[ProxyProcess]:
    """A real proxy in front of both fakes (digest summaries: no summary call upstream), and
    its clean exit afterwards."""
    messages, responses = fakes
    with ProxyProcess(
        data,
        anthropic=messages.base_url,
        openai=f"http://127.0.0.1:{responses.port}",
        args=["--summary-provider", "digest", *args],
    ) as running:
        yield running
    assert running.returncode == 0, running.log


@pytest.fixture(scope="module")
def proxy(
    fakes: tuple[FakeAnthropic, FakeOpenAI], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ProxyProcess]:
    with proxy_before(fakes, tmp_path_factory.mktemp("proxy") / "data") as running:
        yield running


def events_of(data: Path, session_id: str) -> list[dict[str, Any]]:
    path = data / "sessions" / f"{session_id}.jsonl"
    return [orjson.loads(line) for line in path.read_bytes().splitlines()[1:]]


def nodes_of(data: Path, session_id: str) -> list[dict[str, Any]]:
    return [e["n"] for e in events_of(data, session_id) if e.get("t") == "node"]


def snapshot(data: Path) -> dict[str, bytes]:
    """Every file of a data dir, for "nothing was written" checks (but the running proxy's
    own address, `proxy.json`, which is there while it runs)."""
    return {
        str(p.relative_to(data)): p.read_bytes()
        for p in sorted(data.rglob("*"))
        if p.is_file() and not p.name.endswith(".lock") and p.name != "proxy.json"
    }


def sessions_only(files: dict[str, bytes]) -> dict[str, bytes]:
    """A `snapshot` without the request log: a request sent on as the client wrote it is
    counted there (it was relayed unmanaged) whatever the upstream made of it."""
    return {name: data for name, data in files.items() if not name.startswith("requests/")}


def usage_recorded(data: Path, session_id: str, count: int, timeout: float = 60.0) -> None:
    """Wait until the session holds `count` usage records: a streamed answer's usage is kept
    once the stream has ended, which the client may see first."""
    import time

    deadline = time.monotonic() + timeout
    while True:
        path = data / "sessions" / f"{session_id}.jsonl"
        events = events_of(data, session_id) if path.exists() else []
        found = sum(1 for e in events if e.get("t") == "record" and e["r"]["kind"] == "usage")
        if found >= count:
            return
        assert time.monotonic() < deadline, f"{session_id}: {found} of {count} usage records"
        time.sleep(0.05)


def requests_logged(data: Path, session_id: str, count: int, timeout: float = 60.0) -> None:
    """Wait until the request log holds `count` rows of the session's requests: the proxy
    writes them in the background, after the client has its answer."""
    import time

    deadline = time.monotonic() + timeout
    while True:
        rows = [
            orjson.loads(line)
            for path in sorted((data / "requests").glob("*.jsonl"))
            for line in path.read_bytes().splitlines()
        ]
        found = sum(1 for r in rows if r.get("sessionId") == session_id)
        if found >= count:
            return
        assert time.monotonic() < deadline, f"{session_id}: {found} of {count} request rows"
        time.sleep(0.05)


@contextlib.contextmanager
def proxied(
    data: Path, **options: Any
) -> Iterator[tuple[ProxyProcess, tuple[FakeAnthropic, FakeOpenAI]]]:
    """Both loopback upstreams and a proxy of its own in front of them (`options`: the
    proxy's), for a test that needs a fresh one."""
    with FakeAnthropic() as anthropic:
        openai = FakeOpenAI().start()
        try:
            with ProxyProcess(
                data,
                anthropic=anthropic.base_url,
                openai=f"http://127.0.0.1:{openai.port}",
                **options,
            ) as running:
                yield running, (anthropic, openai)
        finally:
            openai.stop()
