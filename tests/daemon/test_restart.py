"""Restart with persisted state: everything that decides a render (nodes, branches, functions,
summary / clear / snip records, usage calibration) lives in the session log, so a new daemon
renders the very same bytes for the same session and parameters — what keeps a provider's
prompt cache warm across editor restarts."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson
import pytest

from .conftest import running
from .convo import assistant, tool_turns, tool_use, user

pytestmark = pytest.mark.asyncio(loop_scope="module")

MODEL = "claude-sonnet-4-5"
RENDERS: list[dict[str, Any]] = [
    {},
    {"format": "openai"},
    {"model": MODEL, "system": "Be brief.", "max_output_tokens": 2000},
    {"branch": "side"},
    {"model": MODEL, "format": "openai", "window": 60_000},
]


async def test_a_restarted_daemon_renders_the_same_bytes(tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    sid = "restart"
    async with running(data_dir, "--summary-provider", "digest") as first:
        await first.open_session(sid)
        await first.append(sid, tool_turns("old", 6, 1500, "Deploy"))
        assert (await first.compact(sid)).applied  # a summary record
        await first.append(sid, tool_turns("new", 8, 1200, "Read"))
        full = (await first.measure(sid)).total
        forced = await first.render(sid, cascade=True, window=full + 600, max_output_tokens=500)
        assert next(e.tier for e in forced.events if e.applied) == "microcompact"
        head = (await first.get(sid))["head"]
        await first.branch(sid, "side", from_node=head)
        await first.append(
            sid, [user("on the side"), assistant("ok", tool_use("fn", "Task"))], branch="side"
        )
        fid = (await first.function_start(sid, "Task", {"q": "x"}, tool_use_id="fn")).function_id
        await first.append(sid, [user("inside"), assistant("done inside")], function_id=fid)
        await first.function_complete(sid, fid, "function output")
        await first.append(sid, [assistant("after the function")], branch="side")
        estimate = (await first.render(sid, model=MODEL)).tokens.estimate
        await first.report_usage(sid, MODEL, usage={"input_tokens": int(estimate * 1.3)})
        before = [await first.render(sid, **params) for params in RENDERS]
        measured = await first.measure(sid, model=MODEL)
        assert before[2].tokens.calibration == pytest.approx(1.3, abs=0.01)

    async with running(data_dir, "--summary-provider", "digest") as second:
        after = [await second.render(sid, **params) for params in RENDERS]
        for params, old, new in zip(RENDERS, before, after, strict=True):
            assert orjson.dumps(new.request) == orjson.dumps(old.request), params
            assert new.tokens == old.tokens, params
        assert await second.measure(sid, model=MODEL) == measured
        # nothing is left to do: the cascade changes nothing and writes nothing
        records = len((await second.get(sid))["records"])
        again = await second.render(sid, cascade=True, window=full + 600, max_output_tokens=500)
        assert orjson.dumps(again.request) == orjson.dumps(forced.request)
        assert not [e for e in again.events if e.applied]
        assert len((await second.get(sid))["records"]) == records
