"""The real Claude Code CLI (npm `@anthropic-ai/claude-code`, pinned in tests/agents) through
`compactd proxy`, against a loopback upstream as strict as the API where it matters: a 64K window
in its own count (400 "prompt is too long" over it), 400 on broken tool_use/tool_result pairing,
SSE as the API streams it, and a scripted model that makes 160 `Bash` calls with large outputs.

Straight to that upstream the session overflows and Claude Code compacts it itself; through the
proxy it completes with no 400, every prompt under the window, no summary request of Claude
Code's own, and fewer input tokens in all. Then the same with `--resume` of that session.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.support.agent_runs import both_ways, compactd_json
from tests.support.fake_anthropic import (
    FakeAnthropicProcess,
    compute_applied_edits,
    estimate_prompt_tokens,
)
from tests.support.invariants import strip_cache_control
from tests.support.proxy import ProxyProcess, TappedProxy, client_bodies
from tests.support.scripted_agent import is_agent_summary, is_compactd_fork, offers_bash

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
CLAUDE = ROOT / "tests" / "agents" / "node_modules" / ".bin" / "claude"
WINDOW = 64_000
STEPS = 160
LINES = 800  # each listing is ~35,000 characters: Claude Code keeps up to 30,000 of it
API_KEY = "sk-ant-test-0123456789abcdef-secret"
RECALL = "compactd_recall"


def run_claude(base_url: str, home: Path, workdir: Path, *args: str) -> dict[str, Any]:
    """One headless `claude -p` run; its JSON result."""
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": str(home),
        "ANTHROPIC_BASE_URL": base_url,
        "ANTHROPIC_API_KEY": API_KEY,
        "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
    }
    done = subprocess.run(
        [str(CLAUDE), "-p", *args, "--output-format", "json", "--allowedTools", "Bash", "Read"],
        cwd=workdir,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert done.stdout.strip(), f"claude printed nothing (exit {done.returncode}): {done.stderr}"
    return json.loads(done.stdout)


def seen(body: dict[str, Any]) -> int:
    """The upstream's own count of a request's prompt, after the context edits it applies."""
    cleared = sum(
        int(e.get("cleared_input_tokens", 0))
        for e in (compute_applied_edits(body) if "context_management" in body else [])
    )
    return estimate_prompt_tokens(body) - cleared


def from_claude(request: dict[str, Any]) -> bool:
    """Claude Code's own request (compactd's summary calls come from its SDK)."""
    return request["headers"].get("user-agent", "").startswith("claude-cli/")


def tally(
    requests: list[dict[str, Any]], count: Callable[[dict[str, Any]], int] = seen
) -> dict[str, Any]:
    """What the upstream saw of one run (`count`: its count of a prompt)."""
    messages = [r for r in requests if r["path"] == "/v1/messages"]
    answered = [r for r in messages if r["status"] == 200]
    claude = [r for r in answered if from_claude(r)]
    edits = [  # of the agent's own requests
        [e["type"] for e in (r["body"].get("context_management") or {}).get("edits", [])]
        for r in messages
        if offers_bash(r["body"]) and from_claude(r)
    ]
    compactd_summaries = [r for r in messages if not from_claude(r)]
    forks = [r["body"] for r in compactd_summaries if is_compactd_fork(r["body"])]
    return {
        "edits": edits,
        "summary_keys": {  # the SDK compactd asks with sends the key as a bearer token
            r["headers"].get("x-api-key")
            or r["headers"].get("authorization", "").removeprefix("Bearer ")
            for r in compactd_summaries
        },
        "compactd_summaries": len(compactd_summaries),
        "requests": len(messages),
        "rejected": [r["status"] for r in messages if r["status"] != 200],
        "too_long": sum(r["status"] == 400 and count(r["body"]) > WINDOW for r in messages),
        "largest": max(count(r["body"]) for r in messages),
        "input_tokens": sum(count(r["body"]) for r in answered),
        "managed": sum(  # Claude Code's requests that carry compactd's tool: rendered by
            # the proxy (a summary forked from one carries it too, and is compactd's own call)
            RECALL in json.dumps(r["body"].get("tools") or []) and from_claude(r)
            for r in messages
        ),
        "agent_summaries": sum(is_agent_summary(r["body"]) for r in messages),
        "agent_steps": sum(offers_bash(r["body"]) and from_claude(r) for r in answered),
        # what the upstream reported of Claude Code's requests, and of its last one
        "agent_input_tokens": sum(max(1, seen(r["body"])) for r in claude),
        "last_agent_prompt": max(1, seen(claude[-1]["body"])) if claude else 0,
        "calls_of_compactd": sum(not from_claude(r) for r in messages),
        "forks": len(forks),
        "forks_of_a_sent_request": sum(
            forks_a_sent_request(f, [r["body"] for r in claude]) for f in forks
        ),
    }


def forks_a_sent_request(fork: dict[str, Any], sent: list[dict[str, Any]]) -> bool:
    """The fork continues a request the upstream was sent before: the same model, system,
    tools, thinking and context edits, and that request's messages, byte for byte (the
    breakpoints aside), are the start of the fork's — what the provider reads from its cache."""
    mine = strip_cache_control(fork)
    for body in sent:
        earlier = strip_cache_control(body)
        same = all(
            mine.get(k) == earlier.get(k)
            for k in ("model", "system", "tools", "thinking", "context_management")
        )
        n = len(earlier["messages"])
        if same and n < len(mine["messages"]) and mine["messages"][:n] == earlier["messages"]:
            return True
    return False


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The same scripted session straight to the upstream and through the proxy, each then
    resumed with a second prompt."""
    if not CLAUDE.exists():
        pytest.fail(f"{CLAUDE} is missing: `make agents` installs the pinned CLIs")
    base = tmp_path_factory.mktemp("claude")
    script = {"default": {"kind": "agent", "steps": STEPS, "lines": LINES}}
    tapped: list[TappedProxy] = []

    def proxy(data: Path, url: str) -> TappedProxy:
        # an upstream that applies context edits, as the Anthropic API does
        tapped.append(
            TappedProxy(data, anthropic=url, window=WINDOW, args=["--context-editing", "server"])
        )
        return tapped[-1]

    with FakeAnthropicProcess(script={**script, "context_window": WINDOW}) as fake:
        out = both_ways(
            base,
            fake,
            proxy,
            run_claude,
            lambda first: ("--resume", first["session_id"]),
            tally,
            CLAUDE.name,
        )
    out["proxy"]["client_bodies"] = client_bodies(tapped, "/v1/messages")
    return out


def test_straight_to_the_upstream_the_session_overflows_or_claude_code_compacts_it(
    runs: dict[str, Any],
) -> None:
    direct = runs["direct"]["first_seen"]
    assert direct["rejected"] or direct["agent_summaries"], direct


@pytest.mark.parametrize("run", ["first", "resumed"])
def test_through_the_proxy_the_session_completes_under_the_window(
    runs: dict[str, Any], run: str
) -> None:
    result = runs["proxy"][run]
    upstream = runs["proxy"][f"{run}_seen"]
    assert not result["is_error"], result
    assert result["result"] == f"Done: ran {STEPS} commands."
    assert upstream["agent_steps"] >= STEPS
    assert upstream["rejected"] == []  # no 400: neither over the window nor broken pairing
    assert upstream["largest"] <= WINDOW
    assert upstream["agent_summaries"] == 0  # Claude Code never had to compact it itself


def test_through_the_proxy_the_client_s_edits_are_kept_and_tier_1_s_merged(
    runs: dict[str, Any],
) -> None:
    """Claude Code's own `clear_thinking` edit rides on every request, first; compactd's
    server-side clear joins it once Tier 1 decides (the upstream refuses any other order)."""
    edits = runs["proxy"]["first_seen"]["edits"]
    assert all(e and e[0] == "clear_thinking_20251015" for e in edits)
    assert any("clear_tool_uses_20250919" in e for e in edits)


def test_compactd_s_summaries_go_to_the_upstream_with_the_client_s_key(
    runs: dict[str, Any],
) -> None:
    # over both runs: on Anthropic a summary runs only when Tier 1 cannot get the request
    # under its threshold, which may be in either
    seen = [runs["proxy"][f"{run}_seen"] for run in ("first", "resumed")]
    assert sum(s["compactd_summaries"] for s in seen) >= 1
    assert set().union(*(s["summary_keys"] for s in seen)) == {API_KEY}


def test_compactd_s_summaries_fork_a_request_the_upstream_was_sent(runs: dict[str, Any]) -> None:
    """Each summary goes out as a fork of Claude Code's own request: a request the upstream
    was sent before (its model, system prompt, tools, thinking and context edits, its messages
    byte for byte) with compactd's instruction after it, so the provider reads it from its
    cache. (The scripted model answers it with a checkpoint, as a model would.)"""
    seen = [runs["proxy"][f"{run}_seen"] for run in ("first", "resumed")]
    assert sum(s["forks"] for s in seen) >= 1
    assert all(s["forks_of_a_sent_request"] == s["forks"] for s in seen)


@pytest.mark.parametrize("run", ["first", "resumed"])
def test_through_the_proxy_the_upstream_counts_fewer_input_tokens(
    runs: dict[str, Any], run: str
) -> None:
    direct, proxied = runs["direct"][f"{run}_seen"], runs["proxy"][f"{run}_seen"]
    assert proxied["input_tokens"] < direct["input_tokens"], (proxied, direct)


def test_the_session_is_compactd_s_and_the_key_is_never_written(runs: dict[str, Any]) -> None:
    """The proxy kept Claude Code's session under its own id, stopped cleanly, and its log and
    store hold nothing of the client's API key."""
    proxy = runs["proxy"]
    assert proxy["returncode"] == 0, proxy["log"]
    session_id = proxy["first"]["session_id"]
    logs = list(Path(proxy["data"]).rglob("*.jsonl"))
    assert any(p.name == f"{session_id}.jsonl" for p in logs), logs
    for path in Path(proxy["data"]).rglob("*"):
        if path.is_file():
            assert API_KEY.encode() not in path.read_bytes(), path
    assert API_KEY not in proxy["log"]
    # changes are never silent: each names its session and what it took the request from and to
    assert re.search(
        rf"session {re.escape(session_id)}: microcompact applied \([\d,]+ → [\d,]+ tokens\)",
        proxy["log"],
    ), proxy["log"]


def test_stats_add_up_against_the_upstream_and_the_client(runs: dict[str, Any]) -> None:
    """What `compactd stats` says of both runs through the proxy: the upstream's own count of
    every request of Claude Code's, exactly; what Claude Code sent, within 5 % of the
    upstream's count of those very bodies (sent straight, they would count that); compactd's
    own calls one by one; nothing passed through unmanaged; a saving, in money too."""
    proxy = runs["proxy"]
    runs_seen = [proxy[f"{run}_seen"] for run in ("first", "resumed")]
    totals = compactd_json(proxy["data"], "stats")["totals"]
    assert totals["upstreamInputTokens"] == sum(s["agent_input_tokens"] for s in runs_seen)
    assert totals["requests"] == sum(s["requests"] - s["calls_of_compactd"] for s in runs_seen)
    assert totals["compactdCalls"] == sum(s["calls_of_compactd"] for s in runs_seen)
    assert totals["passedThrough"] == 0
    client = sum(max(1, seen(body)) for body in proxy["client_bodies"])
    print("clientInputTokens", totals["clientInputTokens"], "upstream's count", client)
    assert abs(totals["clientInputTokens"] - client) <= 0.05 * client
    assert totals["savedInputTokens"] > 0 and totals["savedUsd"] > 0


def test_context_shows_the_last_request_as_the_proxy_sent_it(runs: dict[str, Any]) -> None:
    """`compactd context --json` of the session: the last request the proxy sent, system
    prompt and tools included, at the window it used, within 2 % of the upstream's count."""
    proxy = runs["proxy"]
    session = proxy["resumed"]["session_id"]
    shown = compactd_json(proxy["data"], "context", session)
    last = proxy["resumed_seen"]["last_agent_prompt"]
    print("context total", shown["total"], "reported", shown["reported"], "upstream", last)
    assert shown["source"] == "proxy" and shown["window"] == WINDOW
    assert shown["categories"]["system"] > 0 and shown["categories"]["tools"] > 0
    assert shown["reported"] == last
    assert abs(shown["total"] - last) <= 0.02 * last


# ---- an Anthropic-compatible server that counts the body as sent ------------------------------


@pytest.fixture(scope="module")
def strict_runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The same session against an upstream as strict as the API — thinking signatures
    verified, at most four breakpoints, `clear_thinking` first and its beta header — that
    counts the window on the body as sent (a local server behind `--window`, which neither
    applies nor reports context edits): straight and through the proxy (`--context-editing`
    left to `auto`, which clears in the body for any upstream but the Anthropic API). Each way:
    the first run, then Claude Code's own `/compact`, then a resumed run."""
    if not CLAUDE.exists():
        pytest.fail(f"{CLAUDE} is missing: `make agents` installs the pinned CLIs")
    base = tmp_path_factory.mktemp("strict")
    script = {
        "default": {"kind": "agent", "steps": STEPS, "lines": LINES},
        "context_window": WINDOW,
        "applies_edits": False,
        "verify_signatures": True,
    }
    out: dict[str, Any] = {}
    with FakeAnthropicProcess(script=script) as fake:
        for way in ("direct", "proxy"):
            home, work = base / way / "home", base / way / "work"
            home.mkdir(parents=True)
            work.mkdir(parents=True)
            front = ProxyProcess(base / "data", anthropic=fake.base_url, window=WINDOW)
            url = front.start().base_url if way == "proxy" else fake.base_url
            runs: dict[str, Any] = {}
            try:
                steps = [("first", ["list the outputs"]), ("compact", ["/compact"])]
                steps.append(("resumed", ["list them again"]))
                session: str | None = None
                for name, args in steps:
                    fake.reset()
                    resume = ["--resume", session] if session else []
                    result = run_claude(url, home, work, *resume, *args)
                    session = result["session_id"]
                    runs[name] = result
                    runs[f"{name}_seen"] = tally(fake.requests(), estimate_prompt_tokens)
            finally:
                front.stop()
            runs["log"], runs["returncode"] = front.log if way == "proxy" else "", front.returncode
            out[way] = runs
    keys = ("requests", "rejected", "too_long", "largest", "input_tokens", "managed")
    for way in ("direct", "proxy"):  # the figures decisions.md quotes (`pytest -s`)
        for name in ("first", "compact", "resumed"):
            seen_ = out[way][f"{name}_seen"]
            print(f"strict {way} {name}:", {k: seen_[k] for k in keys})
    return out


def test_counted_as_sent_straight_the_window_refuses_and_claude_code_compacts(
    strict_runs: dict[str, Any],
) -> None:
    first = strict_runs["direct"]["first_seen"]
    assert first["too_long"] > 0 or first["agent_summaries"] > 0, first


@pytest.mark.parametrize("run", ["first", "resumed"])
def test_counted_as_sent_through_the_proxy_no_prompt_is_too_long(
    strict_runs: dict[str, Any], run: str
) -> None:
    result, upstream = strict_runs["proxy"][run], strict_runs["proxy"][f"{run}_seen"]
    assert not result["is_error"], result
    assert result["result"] == f"Done: ran {STEPS} commands."
    assert upstream["rejected"] == []  # no 400: signatures, breakpoints, edits, the window
    assert upstream["largest"] <= WINDOW  # the body as sent
    assert upstream["agent_summaries"] == 0  # Claude Code never had to compact it itself


def test_after_claude_code_s_own_compact_every_request_is_managed(
    strict_runs: dict[str, Any],
) -> None:
    """`/compact` rewrites the history Claude Code sends (a summary, then what it kept): a
    branch of its own, and every request after it — the compaction's own included — is
    rendered by compactd, none passed through."""
    proxy = strict_runs["proxy"]
    for run in ("compact", "resumed"):
        upstream = proxy[f"{run}_seen"]
        agent_requests = upstream["requests"] - upstream["compactd_summaries"]
        assert upstream["managed"] == agent_requests, (run, upstream)
        assert upstream["rejected"] == [], (run, upstream)
    assert proxy["compact_seen"]["agent_summaries"] == 1  # the /compact ran
    assert "cannot be kept" not in proxy["log"]
    assert "forked branch" in proxy["log"]
    assert proxy["returncode"] == 0
