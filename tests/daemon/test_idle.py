"""Idle timers with a short threshold (`--idle-seconds 1 --idle-check-seconds 0.2`).

A session whose old `Read` results are compactable goes idle: the daemon clears them
client-side (Tier 1, trigger `idle`), tells its client (`context/compacted`, `session/idle`),
and persists the clear, so a restarted daemon renders the same bytes. A daemon started after
the idle period does the idle work on the first touch of the session.

Three daemons in order on one data dir: a writer with the default threshold (90 minutes), then
A with the short one, then B (a restart of A).
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import orjson
import pytest
from compactd.clients.client import CompactdClient
from compactd.context.policy import CLEARED_PLACEHOLDER

from .conftest import running
from .convo import all_text, tool_turns

pytestmark = pytest.mark.asyncio(loop_scope="module")

SHORT = ("--idle-seconds", "1", "--idle-check-seconds", "0.2")
READS = 8  # Read results; the 5 most recent are kept, 3 are cleared


def listen(client: CompactdClient) -> dict[str, list[dict[str, Any]]]:
    heard: dict[str, list[dict[str, Any]]] = {"session/idle": [], "context/compacted": []}
    for method, bucket in heard.items():
        client.on_notification(method, bucket.append)
    return heard


async def until(predicate: Any, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.05)


def check_idle_clear(
    view: dict[str, Any], heard: dict[str, list[dict[str, Any]]], sid: str
) -> None:
    (idle,) = [n for n in heard["session/idle"] if n["sessionId"] == sid]
    assert idle["cleared"] == READS - 5 and idle["idleSeconds"] >= 1
    (compacted,) = [n for n in heard["context/compacted"] if n["sessionId"] == sid]
    assert compacted["tier"] == "microcompact" and compacted["applied"] is True
    assert compacted["details"]["trigger"] == "idle"
    assert compacted["tokensAfter"] < compacted["tokensBefore"]
    (clear,) = [r for r in view["records"] if r["kind"] == "clear"]
    assert clear["data"]["trigger"] == "idle" and len(clear["covers"]) == READS - 5
    assert compacted["recordIds"] == [clear["id"]]
    reads = [c["id"] for n in view["nodes"] for c in n.get("calls", [])]
    assert clear["covers"] == reads[: READS - 5]  # the oldest ones


async def test_idle_work_is_done_persisted_and_survives_a_restart(tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    async with running(data_dir) as writer:  # default threshold: nothing goes idle here
        await writer.open_session("idle-early")
        await writer.append("idle-early", tool_turns("early", READS))
        written_at = time.monotonic()
        assert (await writer.get("idle-early"))["records"] == []

    async with running(data_dir, *SHORT) as a:
        heard = listen(a)
        assert (await a.status()).idle_seconds == 1.0
        await asyncio.sleep(max(0.0, 1.2 - (time.monotonic() - written_at)))
        # started after the idle period: the first touch does the idle work, before answering
        early = await a.get("idle-early")
        check_idle_clear(early, heard, "idle-early")

        # loaded and left alone: the idle timer fires
        await a.open_session("idle-late")
        await a.append("idle-late", tool_turns("late", READS))
        await until(lambda: any(n["sessionId"] == "idle-late" for n in heard["session/idle"]))
        late = await a.get("idle-late")
        check_idle_clear(late, heard, "idle-late")

        rendered = {}
        for sid in ("idle-early", "idle-late"):
            request = (await a.render(sid)).request
            assert all_text(request).count(CLEARED_PLACEHOLDER) == READS - 5
            rendered[sid] = orjson.dumps(request)
        await asyncio.sleep(0.5)  # more idle checks: the work is done once per idle period
        assert len(heard["session/idle"]) == 2 and len(heard["context/compacted"]) == 2

    async with running(data_dir, *SHORT) as b:
        heard_b = listen(b)
        for sid, before in rendered.items():
            assert orjson.dumps((await b.render(sid)).request) == before
        await asyncio.sleep(0.5)
        assert heard_b == {"session/idle": [], "context/compacted": []}
        assert len((await b.get("idle-late"))["records"]) == len(late["records"])


async def test_the_idle_pass_runs_in_the_background_after_eviction(tmp_path: Path) -> None:
    """Eviction (here after 0.3 s unused) comes before the idle threshold (2 s), as with the
    defaults (600 s before 90 minutes): the idle work still runs while the session is idle —
    in the background, not on the next request's path."""
    args = ("--idle-seconds", "2", "--idle-check-seconds", "0.2", "--evict-after-seconds", "0.3")
    async with running(tmp_path / "data", *args) as daemon:
        heard = listen(daemon)
        await daemon.open_session("idle-evicted")
        await daemon.append("idle-evicted", tool_turns("ev", READS))
        await daemon.render("idle-evicted")
        evicted = False
        deadline = time.monotonic() + 60  # a hang detector: it leaves after 0.3 s unused
        while time.monotonic() < deadline and not evicted:  # unused: it leaves memory first
            evicted = "idle-evicted" not in (await daemon.status()).loaded_sessions
            await asyncio.sleep(0.1)
        assert evicted
        await until(lambda: any(n["sessionId"] == "idle-evicted" for n in heard["session/idle"]))
        view = await daemon.get("idle-evicted")
        check_idle_clear(view, heard, "idle-evicted")
