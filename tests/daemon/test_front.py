"""The front (`daemon.front`): the daemon answers compactd's own methods before pygls is
imported, and hands over to pygls — the same answers, the same errors — once anything needs it.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from .wire import RawDaemon


def test_the_daemon_starts_without_pygls() -> None:
    code = (
        "import sys, compactd.daemon.main as m; "
        "print(any(k.split('.')[0] in ('pygls', 'lsprotocol') for k in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


@pytest.mark.asyncio
async def test_same_answers_before_and_after_pygls(tmp_path: Path) -> None:
    daemon = await RawDaemon.spawn(tmp_path / "data", log_path=tmp_path / "daemon.log")
    before_ok = await daemon.call("session/open", {"sessionId": "front-1"})
    before_err = await daemon.error("session/get", {"sessionId": "nope"})
    before_bad = await daemon.error("session/open", {"sessionId": 5})
    # `initialize` is pygls': it loads the real server, which answers from then on
    init = await daemon.call("initialize", {"processId": None, "capabilities": {}})
    assert "capabilities" in init
    after_ok = await daemon.call("session/open", {"sessionId": "front-1"})
    after_err = await daemon.error("session/get", {"sessionId": "nope"})
    after_bad = await daemon.error("session/open", {"sessionId": 5})
    assert before_ok["sessionId"] == after_ok["sessionId"] == "front-1"
    assert before_ok["created"] is True and after_ok["created"] is False
    assert before_err == after_err
    assert before_bad == after_bad
    await daemon.call("shutdown")
    daemon.notify("exit")
    assert await daemon.wait_exit() == 0
    assert not daemon.violations
