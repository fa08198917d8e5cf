"""What the proxy records of its work and what `compactd stats` and `compactd sessions` make of
it: every request sent upstream unmanaged counted with its reason, a recall follow-up counted
as compactd's own call, the saving priced as the economy notes price it (cache reads 0.1×,
writes 1.25×, output 5× for compactd's calls), in money only where the model has a published
price."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx2
import pytest
from compactd.context.prices import price_of
from compactd.service.stats import summarize

from tests.support.fake_anthropic import FakeAnthropic, Reply, estimate_prompt_tokens
from tests.support.fake_openai import FakeOpenAI
from tests.support.proxy import ProxyProcess

SCRIPT = str(Path(sys.executable).with_name("compactd"))
KEY = "sk-ant-stats-0123456789-secret"
HEADERS = {"x-api-key": KEY, "anthropic-version": "2023-06-01"}


def compactd(data: Path, *args: str) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(
        [SCRIPT, *args],
        env={**os.environ, "COMPACTD_DATA_DIR": str(data)},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    return done


def post(proxy: ProxyProcess, path: str, body: Any, headers: dict[str, str]) -> Any:
    return httpx2.post(f"{proxy.base_url}{path}", json=body, headers=headers, timeout=60)


def test_requests_sent_unmanaged_are_counted_with_their_reasons(tmp_path: Path) -> None:
    """A history the proxy cannot keep (a result whose call it never saw) and a Responses
    request with no conversation go upstream as the client wrote them: each is a request of
    its session, passed through, with why; the managed ones beside them are not."""
    with FakeAnthropic() as fake:
        openai = FakeOpenAI().start()
        try:
            with ProxyProcess(
                tmp_path / "data",
                anthropic=fake.base_url,
                openai=f"http://127.0.0.1:{openai.port}",
            ) as proxy:
                session = {**HEADERS, "x-claude-code-session-id": "passed-session"}
                ok = [{"role": "user", "content": "hello"}]
                for _ in range(2):
                    body = {"model": "claude-sonnet-4-5", "max_tokens": 50, "messages": ok}
                    assert post(proxy, "/v1/messages", body, session).status_code == 200
                broken = [
                    {"role": "user", "content": "hello"},
                    {"role": "assistant", "content": "hi"},
                    {
                        "role": "user",
                        "content": [{"type": "tool_result", "tool_use_id": "toolu_nowhere"}],
                    },
                ]
                body = {"model": "claude-sonnet-4-5", "max_tokens": 50, "messages": broken}
                post(proxy, "/v1/messages", body, session)  # the upstream's own answer
                developer = [{"role": "developer", "content": "only instructions"}]
                post(
                    proxy,
                    "/v1/responses",
                    {"model": "gpt-5", "input": developer},
                    {"authorization": f"Bearer {KEY}", "session_id": "passed-openai"},
                )
        finally:
            openai.stop()
    report = json.loads(compactd(tmp_path / "data", "stats", "--json").stdout)
    by_id = {s["sessionId"]: s for s in report["sessions"]}
    claude = by_id["passed-session"]
    assert (claude["requests"], claude["passedThrough"]) == (3, 1)
    assert claude["passedReasons"] == {"history not kept": 1}
    assert claude["state"] == "1 of 3 passed through"
    [other] = [s for sid, s in by_id.items() if sid != "passed-session"]
    assert other["passedReasons"] == {"no conversation": 1}
    assert report["totals"]["passedThrough"] == 2 and report["totals"]["requests"] == 4
    listing = compactd(tmp_path / "data", "sessions").stdout
    assert "1 of 3 passed through" in listing


def test_a_recall_follow_up_is_compactd_s_own_call(tmp_path: Path) -> None:
    with FakeAnthropic() as fake:
        call = {
            "type": "tool_use",
            "id": "toolu_recall_1",
            "name": "compactd_recall",
            "input": {"handle": "recall:n1.00000000"},
        }
        fake.push(Reply.blocks([call], stop_reason="tool_use", output_tokens=30))
        fake.push(Reply.answer("done", output_tokens=7))
        with ProxyProcess(tmp_path / "data", anthropic=fake.base_url) as proxy:
            headers = {**HEADERS, "x-claude-code-session-id": "recall-session"}
            body = {
                "model": "claude-sonnet-4-5",
                "max_tokens": 50,
                "messages": [{"role": "user", "content": "what did you clear?"}],
            }
            answer = post(proxy, "/v1/messages", body, headers)
            assert answer.json()["content"][0]["text"] == "done"
        first, follow_up = fake.messages_requests()
    totals = json.loads(compactd(tmp_path / "data", "stats", "--json").stdout)["totals"]
    assert (totals["requests"], totals["compactdCalls"]) == (1, 1)
    # the request the client made is counted as the upstream counted it; the follow-up the
    # proxy made to answer the model's recall is compactd's, with its own usage
    assert totals["upstreamInputTokens"] == estimate_prompt_tokens(first.body)
    assert totals["outputTokens"] == 30
    assert totals["compactdInputTokens"] == estimate_prompt_tokens(follow_up.body)
    assert totals["compactdOutputTokens"] == 7
    assert follow_up.body["messages"][-1]["content"][0]["tool_use_id"] == "toolu_recall_1"


# ---- the sums, on rows as the proxy writes them --------------------------------------------


def request(at: float, client: int, usage: dict[str, int] | None, **extra: Any) -> dict[str, Any]:
    return {
        "kind": "request",
        "at": at,
        "sessionId": "s",
        "agent": "claude-cli/2.1",
        "wire": "anthropic",
        "model": "claude-sonnet-4-5",
        "branch": "main",
        "status": 200,
        "clientTokens": client,
        "usage": usage,
        **extra,
    }


def usage(input: int = 0, read: int = 0, write: int = 0, output: int = 0) -> dict[str, int]:
    return {"input": input, "cacheRead": read, "cacheWrite": write, "output": output}


def test_the_saving_is_priced_under_the_cache_the_upstream_keeps() -> None:
    """Two requests of one branch, the second within the cache's TTL: straight, the client's
    first would have been written (1.25×) and its second read that one back (0.1×) and
    written the rest; compactd's cost is the upstream's own usage, and its summary call
    (output 5×) is counted against the saving."""
    rows = [
        request(1000.0, 10_000, usage(input=10, write=8_000, output=100)),
        request(1060.0, 14_000, usage(read=8_000, write=1_000, output=100)),
        {
            "kind": "call",
            "at": 1061.0,
            "sessionId": "s",
            "purpose": "rolling",
            "model": "claude-sonnet-4-5",
            "wire": "anthropic",
            "usage": usage(input=3_000, output=500),
        },
    ]
    [session] = summarize(rows)["sessions"]
    baseline = 10_000 * 1.25 + (10_000 * 0.1 + 4_000 * 1.25)
    cost = (10 + 8_000 * 1.25) + (8_000 * 0.1 + 1_000 * 1.25) + (3_000 + 500 * 5)
    assert session["savedInputTokens"] == round(baseline - cost)
    assert session["upstreamInputTokens"] == 8_010 + 9_000
    assert session["clientInputTokens"] == 24_000
    assert session["outputTokens"] == 200 and session["compactdCalls"] == 1
    price = price_of("claude-sonnet-4-5")
    assert price is not None
    assert session["savedUsd"] == pytest.approx((baseline - cost) * price.input / 1e6, abs=1e-4)


def test_a_cold_cache_and_a_new_branch_read_nothing_back() -> None:
    """Past the TTL, or on a branch of its own (the client rewrote its history), the
    client's request would have written its whole prompt again."""
    rows = [
        request(0.0, 10_000, usage(write=5_000)),
        request(400.0, 11_000, usage(read=5_000)),  # 5-minute TTL: cold
        request(401.0, 3_000, usage(write=3_000), branch="fork-1"),
    ]
    [session] = summarize(rows)["sessions"]
    baseline = 10_000 * 1.25 + 11_000 * 1.25 + 3_000 * 1.25
    cost = 5_000 * 1.25 + 5_000 * 0.1 + 3_000 * 1.25
    assert session["savedInputTokens"] == round(baseline - cost)


def test_an_upstream_that_reports_no_cache_is_priced_without_one() -> None:
    rows = [request(0.0, 10_000, usage(input=6_000)), request(1.0, 12_000, usage(input=7_000))]
    assert summarize(rows)["sessions"][0]["savedInputTokens"] == 22_000 - 13_000


def test_a_model_without_a_published_price_says_so_instead_of_guessing() -> None:
    rows = [
        request(0.0, 10_000, usage(input=6_000)),
        request(1.0, 12_000, usage(input=7_000), model="claude-sonnet-4-5-like-local"),
    ]
    report = summarize(rows)
    assert report["sessions"][0]["savedUsd"] is None
    assert report["totals"]["unpricedModels"] == ["claude-sonnet-4-5-like-local"]
    assert price_of("claude-sonnet-4-5-20250929") == price_of("claude-sonnet-4-5")
    assert price_of("gpt-5.5") is None  # looks alike, priced unknown


def test_since_and_session_pick_rows_and_days() -> None:
    rows = [request(86_400.0 * 3, 1_000, usage(input=900)), request(86_400.0 * 5, 1_000, None)]
    everything = summarize(rows)
    assert [d["requests"] for d in everything["days"]] == [1, 1]
    later = summarize(rows, since=86_400.0 * 4)
    assert later["totals"]["requests"] == 1 and later["totals"]["upstreamInputTokens"] == 0
    assert summarize(rows, session="nope")["sessions"] == []
