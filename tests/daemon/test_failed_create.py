"""A create that fails leaves nothing, through a real daemon on a full disk: `session/open`
and `session/import` answer a typed error, nothing is listed, and once the space is back the
same id opens and the same file imports as new — not as a half import "existing" forever.
A torn create found at start-up (a daemon killed mid-create) is moved aside and reported.

The disk is a small tmpfs where the tests may mount one, else an injected ENOSPC; on
PostgreSQL the server's own `disk_full` error (`tests/support/disk.py`)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.disk import fillable

from .convo import assistant, user
from .wire import RawDaemon, seeded_daemon

pytestmark = pytest.mark.asyncio(loop_scope="module")

TRANSCRIPT = next((Path(__file__).resolve().parents[1] / "data/transcripts/codex").glob("*.jsonl"))
STORE_FAILURE = 4060


async def listed(raw: RawDaemon) -> list[str]:
    return sorted(s["sessionId"] for s in (await raw.call("session/list"))["sessions"])


async def test_a_full_disk_during_open_or_import_leaves_nothing(tmp_path: Path) -> None:
    with fillable(tmp_path) as disk:
        async with seeded_daemon(disk.data_dir, {"kept": [user("before")]}, env=disk.env) as raw:
            disk.fill()
            for method, params in [
                ("session/open", {"sessionId": "born"}),
                ("session/open", {}),
                ("session/import", {"path": str(TRANSCRIPT)}),
            ]:
                error = await raw.error(method, params)
                assert error["code"] == STORE_FAILURE, (disk.how, method, error)
            assert await listed(raw) == ["kept"]
            disk.free()

            opened = await raw.call("session/open", {"sessionId": "born"})
            assert opened["created"], "the id a failed create used is free"
            await raw.call("session/append", {"sessionId": "born", "messages": [user("hi")]})
            imported = await raw.call("session/import", {"path": str(TRANSCRIPT)})
            assert not imported.get("existing"), "no half import stands in for the file"
            [sid] = imported["sessionIds"]
            got = await raw.call("session/get", {"sessionId": sid})
            assert got["load"] == {"tornTail": False, "badLines": []}
            await raw.call("context/render", {"sessionId": sid})
            assert await listed(raw) == sorted(["kept", "born", sid])
        async with seeded_daemon(disk.data_dir, {}, env=disk.env) as again:
            assert await listed(again) == sorted(["kept", "born", sid])
            assert not again.notifications("window/logMessage")  # nothing torn to report


@pytest.mark.files_only
async def test_a_torn_create_found_at_start_up_is_moved_aside_and_reported(
    tmp_path: Path,
) -> None:
    """What a daemon killed mid-create left (its unheld temporary log), and what an older
    compactd left (an empty log): never listed, moved to `torn/`, said on start-up."""
    data_dir = tmp_path / "data"
    sessions = data_dir / "sessions"
    sessions.mkdir(parents=True)
    (sessions / ".killed.0123456789ab.creating").write_bytes(b'{"t":"open","seq":1,"ts":1')
    (sessions / "empty.jsonl").write_bytes(b"")
    async with seeded_daemon(data_dir, {}) as raw:
        assert await listed(raw) == []
        await raw.wait_for(lambda m: len(raw.notifications("window/logMessage")) >= 2)
        said = [n["message"] for n in raw.notifications("window/logMessage")]
        assert any(".killed." in m and "torn/" in m for m in said), said
        assert any("empty.jsonl" in m and "torn/" in m for m in said), said
        opened = await raw.call("session/open", {"sessionId": "empty"})
        assert opened["created"]
        await raw.call(
            "session/append", {"sessionId": "empty", "messages": [user("q"), assistant("a")]}
        )
        assert await listed(raw) == ["empty"]
    assert sorted(p.name.split(".")[0] for p in (data_dir / "torn").iterdir()) == [
        "empty",
        "killed",
    ]
    left = sorted(p.name for p in sessions.iterdir())
    assert "empty.jsonl" in left and not [n for n in left if n.endswith(".creating")], left
