"""A summary the daemon no longer needs is cancelled at the client too, so the client's own
model call stops (instead of running on for nothing)."""

from __future__ import annotations

import asyncio
from pathlib import Path

from compactd.clients.client import CompactdClient, RpcError
from compactd.protocol import types as t


async def test_cancelling_a_compaction_cancels_the_clients_summary(tmp_path: Path) -> None:
    client = await CompactdClient.spawn(
        data_dir=str(tmp_path), args=["--summary-provider", "client"], timeout=60
    )
    started = asyncio.Event()
    cancelled = asyncio.Event()

    async def stall(params: t.SummarizeParams) -> t.SummarizeResult:
        started.set()
        try:
            await asyncio.sleep(600)  # until cancelled
        except asyncio.CancelledError:
            cancelled.set()
            raise
        return t.SummarizeResult(text="too late")

    client.on_summarize(stall)
    try:
        sid = (await client.open_session("c1")).session_id
        for i in range(4):
            await client.append(
                sid,
                [
                    {"role": "user", "content": f"request {i} " * 40},
                    {"role": "assistant", "content": f"answer {i} " * 40},
                ],
            )
        before = (await client.get(sid))["records"]
        msg_id, answer = client.send_request("context/compact", {"sessionId": sid})
        await asyncio.wait_for(started.wait(), 60)
        client.cancel(msg_id)
        try:
            await asyncio.wait_for(answer, 60)
            raise AssertionError("the cancelled compaction answered with a result")
        except RpcError as exc:
            assert exc.code == -32800
        await asyncio.wait_for(cancelled.wait(), 60)  # the daemon told us to stop
        assert (await client.get(sid))["records"] == before  # and wrote nothing
    finally:
        assert await client.close() == 0
