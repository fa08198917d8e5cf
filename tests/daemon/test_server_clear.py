"""Tier 1's server path end to end: the real daemon renders, the real `anthropic` SDK sends
the request the way the README says, the loopback fake answers `applied_edits` like the API,
and the usage reported back makes `context/measure` agree with the provider's count."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anthropic
import orjson
import pytest
from compactd.context.policy import CLEARED_PLACEHOLDER
from compactd.context.tiers.microcompact import CLEAR_EDIT, CONTEXT_MANAGEMENT_BETA

from tests.support.fake_anthropic import FakeAnthropic
from tests.support.invariants import check_anthropic_pairing, server_cleared

from .conftest import running
from .convo import assistant, filler, tool_results, tool_use, user

MODEL = "claude-sonnet-4-5"


def one_long_turn(calls: int) -> list[dict[str, Any]]:
    """One user request and `calls` Reads (every 10th a TodoWrite, which is never cleared)."""
    messages: list[dict[str, Any]] = [user("audit every module")]
    for k in range(calls):
        name = "TodoWrite" if k % 10 == 9 else "Read"
        messages.append(assistant(f"step {k}", tool_use(f"toolu_{k:03d}", name)))
        messages.append(tool_results((f"toolu_{k:03d}", filler(f"m{k}", 1000))))
    return messages


@pytest.mark.asyncio
async def test_the_readme_loop_sends_the_server_clear_and_measure_follows_the_provider(
    tmp_path: Path,
) -> None:
    with FakeAnthropic(api_key="test") as fake:
        async with running(tmp_path / "data") as daemon:
            session = (await daemon.open_session()).session_id
            await daemon.append(session, one_long_turn(60))
            budget = {"model": MODEL, "window": 24_000, "max_output_tokens": 2_000}
            full = (await daemon.measure(session, **budget)).total
            assert full > 0.9 * 22_000  # over the threshold: the cascade must act

            out = await daemon.render(session, cascade=True, **budget)
            request = out.request
            assert [e.tier for e in out.events if e.applied] == ["microcompact"]
            assert out.headers == {"anthropic-beta": CONTEXT_MANAGEMENT_BETA}
            assert CLEARED_PLACEHOLDER not in orjson.dumps(request).decode()
            assert len(server_cleared(request)) == 60 - 6 - 5  # TodoWrites and 5 newest kept
            assert out.tokens.total <= out.tokens.limit
            assert out.tokens.cleared_by_provider > 0
            check_anthropic_pairing(request)

            # the README's call, through the real SDK
            with anthropic.Anthropic(base_url=fake.base_url, api_key="test", max_retries=0) as sdk:
                reply = sdk.beta.messages.create(**request, extra_headers=out.headers)
            assert fake.last_request.betas == [CONTEXT_MANAGEMENT_BETA]
            assert reply.context_management is not None
            cleared = reply.context_management.applied_edits
            assert cleared[0].type == CLEAR_EDIT
            assert cleared[0].cleared_tool_uses == 60 - 6 - 5
            usage = reply.usage.model_dump()
            report = await daemon.report_usage(
                session,
                MODEL,
                usage=usage,
                applied_edits=[e.model_dump() for e in cleared],
            )
            assert report.reported_tokens == usage["input_tokens"]
            # measure now says what the provider counted, within the calibration's smoothing
            measured = (await daemon.measure(session, **budget)).total
            assert measured == pytest.approx(usage["input_tokens"], rel=0.05)
            # and the next request is the same bytes: nothing was re-written
            again = await daemon.render(session, cascade=True, **budget)
            assert orjson.dumps(again.request) == orjson.dumps(request)
            assert again.events == [] or not any(e.applied for e in again.events)


@pytest.mark.asyncio
async def test_a_result_the_provider_cleared_is_recalled_by_its_tool_use_id(
    tmp_path: Path,
) -> None:
    """The provider's placeholder names no handle; the model still has the call's id."""
    async with running(tmp_path / "data") as daemon:
        session = (await daemon.open_session(config={"recall": True})).session_id
        await daemon.append(session, one_long_turn(60))
        budget = {"model": MODEL, "window": 24_000, "max_output_tokens": 2_000}
        out = await daemon.render(session, cascade=True, **budget)
        assert "toolu_000" in server_cleared(out.request)
        assert any(t["name"] == "compactd_recall" for t in out.request["tools"])
        got = await daemon.recall(session, "toolu_000")
        assert got.text == filler("m0", 1000)
        answer = await daemon.answer_recall(
            session,
            {"type": "tool_use", "id": "r1", "name": "compactd_recall", "input": {"handle": "x"}},
        )
        assert answer["is_error"] is True and "tool_use id" in str(answer["content"])
