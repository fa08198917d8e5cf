"""What the proxy refuses, and how: a body it cannot parse, an unknown path, an upstream that is
down, a body over the size limit, a prompt the upstream says is too long (Tier 5, then one retry),
a listen address beyond loopback. Every refusal is in the API's own error shape with a clear
message, names no secret, and leaves the data dir as it was; the proxy serves on."""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx2
import orjson
import pytest

from tests.support.fake_anthropic import (
    FakeAnthropic,
    Reply,
    compute_applied_edits,
    estimate_prompt_tokens,
)
from tests.support.fake_openai import FakeOpenAI
from tests.support.proxy import ROOT, ProxyProcess

from .conftest import nodes_of, sessions_only, snapshot

KEY = "sk-ant-errors-0123456789-secret"
HEADERS = {"x-api-key": KEY, "anthropic-version": "2023-06-01", "content-type": "application/json"}


def seen(body: dict[str, Any]) -> int:
    """The upstream's count of a request after the context edits it applies."""
    edits = compute_applied_edits(body) if "context_management" in body else []
    return estimate_prompt_tokens(body) - sum(e.get("cleared_input_tokens", 0) for e in edits)


def post(proxy: ProxyProcess, path: str, body: Any, headers: dict[str, str] | None = None) -> Any:
    data = body if isinstance(body, bytes) else orjson.dumps(body)
    return httpx2.post(
        f"{proxy.base_url}{path}", content=data, headers=headers or HEADERS, timeout=30
    )


def anthropic_error(response: Any, status: int) -> str:
    assert response.status_code == status, response.text
    body = response.json()
    assert body["type"] == "error" and isinstance(body["error"]["message"], str), body
    assert KEY not in response.text
    return body["error"]["message"]


def openai_error(response: Any, status: int) -> str:
    assert response.status_code == status, response.text
    body = response.json()
    assert set(body) == {"error"} and isinstance(body["error"]["message"], str), body
    assert KEY not in response.text
    return body["error"]["message"]


def test_a_body_that_is_not_json_is_a_400_in_each_api_s_shape(proxy: ProxyProcess) -> None:
    before = snapshot(proxy.data_dir)
    message = anthropic_error(post(proxy, "/v1/messages", b"{not json"), 400)
    assert "invalid JSON" in message
    openai_error(post(proxy, "/v1/responses", b"[1, 2"), 400)
    openai_error(post(proxy, "/v1/chat/completions", b"\xff\xfe"), 400)
    assert snapshot(proxy.data_dir) == before


@pytest.mark.parametrize(
    ("body", "names"),
    [
        ([1, 2], "dictionary"),
        ({"max_tokens": 10, "messages": [{"role": "user", "content": "x"}]}, "model"),
        ({"model": "m", "max_tokens": "ten", "messages": []}, "max_tokens"),
        ({"model": "m", "max_tokens": 10, "messages": []}, "messages"),
        ({"model": "m", "max_tokens": 10, "messages": [{"role": "user", "content": 7}]}, "content"),
        (
            {
                "model": "m",
                "max_tokens": 10,
                "messages": [{"role": "user", "content": [{"type": "tool_result"}]}],
            },
            "tool_use_id",
        ),
    ],
)
def test_a_body_the_api_would_refuse_is_refused_by_name(
    proxy: ProxyProcess, body: Any, names: str
) -> None:
    before = sessions_only(snapshot(proxy.data_dir))
    message = anthropic_error(post(proxy, "/v1/messages", body), 400)
    assert names in message
    # no session holds any of it (a body compactd cannot read goes upstream as sent, and the
    # request log counts it as relayed unmanaged: that row is all it leaves)
    assert sessions_only(snapshot(proxy.data_dir)) == before


def test_an_unknown_path_is_a_404(proxy: ProxyProcess) -> None:
    message = anthropic_error(post(proxy, "/v1/complete", {"prompt": "x"}), 404)
    assert "/v1/complete" in message


def test_a_body_over_the_size_limit_is_a_413(tmp_path: Path) -> None:
    with (
        FakeAnthropic() as fake,
        ProxyProcess(
            tmp_path / "data",
            anthropic=fake.base_url,
            env={"COMPACTD_MAX_REQUEST_BYTES": "2000"},
        ) as proxy,
    ):
        body = {
            "model": "m",
            "max_tokens": 5,
            "messages": [{"role": "user", "content": "x" * 5000}],
        }
        anthropic_error(post(proxy, "/v1/messages", body), 413)
        assert fake.messages_requests() == []
        assert not list((tmp_path / "data").rglob("*.jsonl"))


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_an_upstream_that_is_down_is_a_502_and_the_session_is_unchanged(tmp_path: Path) -> None:
    down = f"http://127.0.0.1:{_closed_port()}"
    with ProxyProcess(tmp_path / "data", anthropic=down, openai=down) as proxy:
        body = {
            "model": "claude-sonnet-4-5",
            "max_tokens": 16,
            "messages": [{"role": "user", "content": "anyone there?"}],
        }
        message = anthropic_error(post(proxy, "/v1/messages", body), 502)
        assert down in message and "reach" in message
        openai_error(
            post(
                proxy,
                "/v1/responses",
                {"model": "gpt-5", "input": "hello"},
                {"authorization": f"Bearer {KEY}", "content-type": "application/json"},
            ),
            502,
        )
        assert snapshot(proxy.data_dir) == {}
        # still serving: a bad body is still answered as such
        anthropic_error(post(proxy, "/v1/messages", b"nope"), 400)
    assert KEY not in proxy.log


def test_prompt_too_long_runs_tier_5_and_retries_once(tmp_path: Path) -> None:
    """The upstream counts four times compactd's estimate (past the 2.5× a usage report is
    held to): Tier 5 takes its count as the truth, shrinks the request to fit it and the retry
    goes through, with fewer bytes — the client never sees the 400. A second refusal of the
    retry reaches the client as the upstream's error, and that request wrote nothing."""
    big = "word " * 40_000
    history = [{"role": "user", "content": "first question"}]
    for i in range(12):
        call = {"type": "tool_use", "id": f"toolu_big_{i}", "name": "Read", "input": {"i": i}}
        history += [
            {"role": "assistant", "content": [call]},
            {
                "role": "user",
                "content": [
                    {"type": "tool_result", "tool_use_id": call["id"], "content": big[:3900]}
                ],
            },
        ]
    history.append({"role": "user", "content": "and now?"})
    body = {"model": "claude-sonnet-4-5", "max_tokens": 64, "messages": history}
    headers = {**HEADERS, "x-claude-code-session-id": "tier5-session"}
    with (
        FakeAnthropic() as fake,
        ProxyProcess(
            tmp_path / "data", anthropic=fake.base_url, args=["--summary-provider", "digest"]
        ) as proxy,
    ):
        fake.push(Reply.prompt_too_long(prompt_tokens=40_000, limit_tokens=20_000))
        fake.push(Reply.answer("fits now"))
        response = post(proxy, "/v1/messages", body, headers)
        assert response.status_code == 200, response.text
        assert response.json()["content"][0]["text"] == "fits now"
        first, retry = fake.messages_requests()
        assert seen(retry.body) < seen(first.body)  # what the model sees after the edits
        assert len(retry.raw) < len(first.raw)  # and what is sent: never the same bytes
        assert "reactive" in proxy.log or "prompt is too long" in proxy.log

        fake.reset()
        fake.push(Reply.prompt_too_long(prompt_tokens=40_000, limit_tokens=20_000), times=2)
        other = {**headers, "x-claude-code-session-id": "tier5-refused"}
        refused = post(proxy, "/v1/messages", body, other)
        assert anthropic_error(refused, 400).startswith("prompt is too long")
        first, retry = fake.messages_requests()  # once, then the one retry: never a loop
        assert len(retry.raw) < len(first.raw)
        assert not (tmp_path / "data" / "sessions" / "tier5-refused.jsonl").exists()


def test_listening_beyond_loopback_needs_a_flag(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "compactd", "proxy", "--listen", "0.0.0.0:0"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        env={"COMPACTD_DATA_DIR": str(tmp_path), "PATH": "/usr/bin:/bin"},
    )
    assert done.returncode != 0
    assert "--allow-remote" in done.stderr


def test_the_client_s_history_rewritten_forks_a_branch(
    proxy: ProxyProcess, fakes: tuple[FakeAnthropic, FakeOpenAI]
) -> None:
    """A client that compacted or edited its history shares a prefix with the session and
    then differs: a new branch from where they part, said in the log; the old branch keeps
    everything it had."""
    fake = fakes[0]
    headers = {**HEADERS, "x-claude-code-session-id": "fork-session"}
    base = [
        {"role": "user", "content": "start here"},
        {"role": "assistant", "content": "started"},
        {"role": "user", "content": "keep going"},
    ]
    for messages in (base, [*base[:2], {"role": "user", "content": "go another way"}]):
        fake.push(Reply.answer("ok"))
        response = post(
            proxy,
            "/v1/messages",
            {"model": "claude-sonnet-4-5", "max_tokens": 16, "messages": messages},
            headers,
        )
        assert response.status_code == 200, response.text
    nodes = nodes_of(proxy.data_dir, "fork-session")
    assert [n["content"][0]["text"] for n in nodes] == [
        "start here",
        "started",
        "keep going",
        "go another way",
    ]
    assert "forked branch fork-1" in proxy.log
    sent = fake.last_request.body["messages"]
    assert "keep going" not in orjson.dumps(sent).decode()  # the fork renders its own thread
