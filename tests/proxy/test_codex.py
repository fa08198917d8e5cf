"""The real Codex CLI (npm `@openai/codex`, pinned in tests/agents) through `compactd proxy`,
with a custom model provider whose base_url is the proxy (Responses API), against a loopback
Responses server as strict as the API where it matters: a 64K window in its own count (400
`context_length_exceeded` over it), 400 on a call without its output or an output without its
call, SSE as the API streams it, and a scripted model making 160 shell calls with large outputs.

Codex is told the window (`model_context_window`), as a user with a 64K model would: straight to
the upstream it compacts the session itself; through the proxy the session completes with no
400, every prompt under the window, no compaction of Codex's own, and fewer input tokens in all.
Then the same with `codex exec resume` of that session.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.support.agent_runs import both_ways, compactd_json
from tests.support.fake_openai import FakeOpenAIProcess, responses_prompt
from tests.support.proxy import TappedProxy, client_bodies
from tests.support.scripted_agent import AGENT_SUMMARY_MARKERS

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
CODEX = ROOT / "tests" / "agents" / "node_modules" / ".bin" / "codex"
WINDOW = 64_000
STEPS = 160
LINES = 800
API_KEY = "sk-proj-test-0123456789abcdef-secret"
CONFIG = """model = "gpt-5-codex"
model_provider = "scripted"
model_context_window = {window}
check_for_update_on_startup = false

[analytics]
enabled = false

[model_providers.scripted]
name = "scripted"
base_url = "{base_url}/v1"
wire_api = "responses"
env_key = "SCRIPTED_API_KEY"
request_max_retries = 0
stream_max_retries = 0
"""


def run_codex(base_url: str, home: Path, workdir: Path, *args: str) -> dict[str, Any]:
    """One `codex exec --json` run: its thread id and its last message, from its events."""
    (home / "config.toml").write_text(CONFIG.format(window=WINDOW, base_url=base_url))
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": str(home),
        "CODEX_HOME": str(home),
        "SCRIPTED_API_KEY": API_KEY,
    }
    done = subprocess.run(
        [str(CODEX), "exec", "--skip-git-repo-check", "--json", *args],
        cwd=workdir,
        env=env,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=900,
    )
    events = []
    for line in done.stdout.splitlines():
        if line.startswith("{"):
            events.append(json.loads(line))
    thread = next((e["thread_id"] for e in events if e.get("type") == "thread.started"), None)
    messages = [
        e["item"]["text"]
        for e in events
        if e.get("type") == "item.completed" and e["item"].get("type") == "agent_message"
    ]
    failed = [e for e in events if e.get("type") in ("turn.failed", "error")]
    return {"thread": thread, "last": messages[-1] if messages else None, "failed": failed}


def _last_text(body: dict[str, Any]) -> str:
    items = body.get("input")
    if isinstance(items, str):
        return items
    for item in reversed(items or []):
        content = item.get("content") if isinstance(item, dict) else None
        for part in content if isinstance(content, list) else []:
            if isinstance(part, dict) and "text" in part:
                return str(part["text"])
    return ""


def from_codex(request: dict[str, Any]) -> bool:
    """Codex's own request (compactd's summary calls come from its own HTTP client)."""
    return "codex" in request["headers"].get("user-agent", "").lower()


def tally(requests: list[dict[str, Any]]) -> dict[str, Any]:
    calls = [r for r in requests if r["path"] == "/v1/responses"]
    answered = [r for r in calls if r["status"] == 200]
    codex = [r for r in answered if from_codex(r)]
    return {
        "agent_input_tokens": sum(responses_prompt(r["body"]) for r in codex),
        "last_agent_prompt": responses_prompt(codex[-1]["body"]) if codex else 0,
        "calls_of_compactd": sum(not from_codex(r) for r in calls),
        "requests": len(calls),
        "rejected": [r["status"] for r in calls if r["status"] != 200],
        "largest": max(responses_prompt(r["body"]) for r in calls),
        "input_tokens": sum(responses_prompt(r["body"]) for r in answered),
        "agent_compactions": sum(
            any(m in _last_text(r["body"]) for m in AGENT_SUMMARY_MARKERS) for r in calls
        ),
    }


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    if not CODEX.exists():
        pytest.fail(f"{CODEX} is missing: `make agents` installs the pinned CLIs")
    base = tmp_path_factory.mktemp("codex")
    script = {"default": {"kind": "agent", "steps": STEPS, "lines": LINES}}
    tapped: list[TappedProxy] = []

    def proxy(data: Path, url: str) -> TappedProxy:
        tapped.append(TappedProxy(data, openai=url, window=WINDOW))
        return tapped[-1]

    with FakeOpenAIProcess(script={**script, "context_window": WINDOW}) as fake:
        out = both_ways(
            base,
            fake,
            proxy,
            run_codex,
            lambda first: ("resume", first["thread"]),
            tally,
            CODEX.name,
        )
    out["proxy"]["client_bodies"] = client_bodies(tapped, "/v1/responses")
    return out


def test_straight_to_the_upstream_codex_compacts_the_session_itself(
    runs: dict[str, Any],
) -> None:
    direct = runs["direct"]["first_seen"]
    assert direct["agent_compactions"] or direct["rejected"], direct


@pytest.mark.parametrize("run", ["first", "resumed"])
def test_through_the_proxy_the_session_completes_under_the_window(
    runs: dict[str, Any], run: str
) -> None:
    result, upstream = runs["proxy"][run], runs["proxy"][f"{run}_seen"]
    assert result["failed"] == [], result
    assert result["last"] == f"Done: ran {STEPS} commands."
    assert upstream["requests"] > STEPS
    assert upstream["rejected"] == []
    assert upstream["largest"] <= WINDOW
    assert upstream["agent_compactions"] == 0


@pytest.mark.parametrize("run", ["first", "resumed"])
def test_through_the_proxy_the_upstream_counts_fewer_input_tokens(
    runs: dict[str, Any], run: str
) -> None:
    direct, proxied = runs["direct"][f"{run}_seen"], runs["proxy"][f"{run}_seen"]
    assert proxied["input_tokens"] < direct["input_tokens"], (proxied, direct)


def test_the_key_is_never_written(runs: dict[str, Any]) -> None:
    proxy = runs["proxy"]
    assert proxy["returncode"] == 0, proxy["log"]
    assert any(Path(proxy["data"]).rglob("*.jsonl"))
    for path in Path(proxy["data"]).rglob("*"):
        if path.is_file():
            assert API_KEY.encode() not in path.read_bytes(), path
    assert API_KEY not in proxy["log"]


def test_stats_add_up_against_the_upstream_and_the_client(runs: dict[str, Any]) -> None:
    """What `compactd stats` says of both runs through the proxy: the upstream's own count of
    every request of Codex's, exactly; what Codex sent, within 5 % of the upstream's count of
    those very bodies; compactd's own calls one by one; nothing passed through unmanaged."""
    proxy = runs["proxy"]
    runs_seen = [proxy[f"{run}_seen"] for run in ("first", "resumed")]
    totals = compactd_json(proxy["data"], "stats")["totals"]
    assert totals["upstreamInputTokens"] == sum(s["agent_input_tokens"] for s in runs_seen)
    assert totals["requests"] == sum(s["requests"] - s["calls_of_compactd"] for s in runs_seen)
    assert totals["compactdCalls"] == sum(s["calls_of_compactd"] for s in runs_seen)
    assert totals["passedThrough"] == 0
    client = sum(responses_prompt(body) for body in proxy["client_bodies"])
    print("clientInputTokens", totals["clientInputTokens"], "upstream's count", client)
    assert abs(totals["clientInputTokens"] - client) <= 0.05 * client
    assert totals["savedInputTokens"] > 0 and totals["savedUsd"] > 0


def test_context_shows_the_last_request_as_the_proxy_sent_it(runs: dict[str, Any]) -> None:
    """`compactd context --json` of Codex's session: its last request as the proxy sent it,
    instructions and tools included, within 2 % of the upstream's count."""
    proxy = runs["proxy"]
    sessions = compactd_json(proxy["data"], "stats")["sessions"]
    session = sessions[0]["sessionId"]  # the newest: the resumed run's
    shown = compactd_json(proxy["data"], "context", session)
    last = proxy["resumed_seen"]["last_agent_prompt"]
    print("context total", shown["total"], "reported", shown["reported"], "upstream", last)
    assert shown["source"] == "proxy" and shown["window"] == WINDOW
    assert shown["categories"]["system"] > 0 and shown["categories"]["tools"] > 0
    assert shown["reported"] == last
    assert abs(shown["total"] - last) <= 0.02 * last


def test_codex_hanging_up_at_each_answer_s_end_logs_no_traceback(runs: dict[str, Any]) -> None:
    """Codex closes its connection on `response.completed`; the proxy may still be ending the
    stream: that is no error (it printed four `ClientConnectionResetError` tracebacks a run)."""
    log = runs["proxy"]["log"]
    assert "Traceback" not in log and " ERROR " not in log, log
