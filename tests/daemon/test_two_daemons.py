"""Two daemons on one data dir (one per editor window): each notices the other's appends
through the file watcher, reloads, tells its client (`session/changed`), and renders them; no
event is lost or applied twice; `expectedHead` catches the other writer."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
from compactd.clients.client import CompactdClient, RpcError

from .conftest import node_ids, spawn
from .convo import all_text, assistant, user

pytestmark = pytest.mark.asyncio(loop_scope="module")
WAIT = 60.0  # a hang detector: a busy machine answers well inside it


class Window:
    """One daemon and every `session/changed` it sent, in order."""

    def __init__(self, client: CompactdClient) -> None:
        self.client = client
        self.changed: list[dict[str, Any]] = []
        self.arrived = asyncio.Event()
        client.on_notification("session/changed", self._on_changed)

    def _on_changed(self, params: dict[str, Any]) -> None:
        self.changed.append(params)
        self.arrived.set()

    def changes(self, sid: str) -> list[dict[str, Any]]:
        return [c for c in self.changed if c["sessionId"] == sid]

    async def wait_changed(self, sid: str, count: int) -> list[dict[str, Any]]:
        """Until `count` changes of `sid` arrived, without calling the daemon (so only its
        file watcher can have noticed them)."""

        async def wait() -> list[dict[str, Any]]:
            while len(self.changes(sid)) < count:
                self.arrived.clear()
                await self.arrived.wait()
            return self.changes(sid)

        return await asyncio.wait_for(wait(), WAIT)


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("two") / "data"


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def windows(data_dir: Path) -> AsyncIterator[tuple[Window, Window]]:
    a, b = await asyncio.gather(spawn(data_dir), spawn(data_dir))
    try:
        yield Window(a), Window(b)
    finally:
        codes = await asyncio.gather(a.close(), b.close())
    assert codes == [0, 0]


async def test_an_append_in_b_reaches_a(windows: tuple[Window, Window]) -> None:
    a, b = windows
    sid = "two-reach"
    await a.client.open_session(sid)
    await a.client.append(sid, [user("asked in A"), assistant("answered in A")])
    await b.client.open_session(sid)  # B loads what A wrote
    assert "answered in A" in all_text((await b.client.render(sid)).request)
    appended = await b.client.append(sid, [user("asked in B")])
    (changed,) = await a.wait_changed(sid, 1)
    assert changed["events"] == 1
    assert changed["heads"]["main"] == appended.head
    seen = all_text((await a.client.render(sid)).request)
    assert "asked in B" in seen and seen.index("answered in A") < seen.index("asked in B")
    assert b.changes(sid) == [], "a daemon is not told about its own appends"


async def test_alternating_appends_lose_and_duplicate_nothing(
    windows: tuple[Window, Window],
) -> None:
    a, b = windows
    sid = "two-alternate"
    await a.client.open_session(sid)
    await b.client.open_session(sid)
    rounds = 10
    written: list[str] = []
    for i in range(rounds):
        written += (await a.client.append(sid, [user(f"question {i}")])).node_ids
        written += (await b.client.append(sid, [assistant(f"answer {i}")])).node_ids
    view_a, view_b = await asyncio.gather(a.client.get(sid), b.client.get(sid))
    assert node_ids(view_a["nodes"]) == node_ids(view_b["nodes"]) == written
    assert [n["content"][0]["text"] for n in view_a["nodes"]] == [
        f"{kind} {i}" for i in range(rounds) for kind in ("question", "answer")
    ]
    # each daemon applied each of the other's events exactly once, in order
    for window in (a, b):
        changes = window.changes(sid)
        assert sum(c["events"] for c in changes) == rounds
        seqs = [c["seq"] for c in changes]
        assert seqs == sorted(set(seqs))
    request_a, request_b = await asyncio.gather(a.client.render(sid), b.client.render(sid))
    assert request_a.request == request_b.request


async def test_expected_head_catches_the_other_writer(windows: tuple[Window, Window]) -> None:
    a, b = windows
    sid = "two-conflict"
    await a.client.open_session(sid)
    first = await a.client.append(sid, [user("one")])
    await b.client.open_session(sid)
    await b.client.append(sid, [assistant("two from B")], expected_head=first.head)
    with pytest.raises(RpcError) as caught:  # A has not looked since: its idea of the head is stale
        await a.client.append(sid, [assistant("two from A")], expected_head=first.head)
    assert caught.value.code == 4030
    view = await a.client.get(sid)
    assert [n["content"][0]["text"] for n in view["nodes"]] == ["one", "two from B"]
