"""The real opencode CLI (npm `opencode-ai`, pinned in tests/agents) through `compactd proxy`,
with a provider entry (`@ai-sdk/openai-compatible`, bundled in opencode) whose `baseURL` is the
proxy, against a loopback Chat Completions server as strict as the API where it matters: a 64K
window in its own count (400 `context_length_exceeded` over it), 400 on a tool message without
its call or a call without its tool message, SSE chunks and `[DONE]` as the API streams them,
and a scripted model making 64 shell calls whose outputs pass the window several times over.

Straight to the upstream, the model entry carries the window (`limit.context`), as it would for
a 64K model, and opencode manages it itself: it prunes old tool outputs and compacts the session
into an anchored summary. Through the proxy its own compaction is off (`"compaction": {"auto":
false, "prune": false}`): the session completes with no 400, every prompt under the window, no
compaction of opencode's own, and fewer input tokens in all. Then the same with `opencode run
--session` of that session.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.support.agent_runs import assert_key_never_written, both_ways, chat_tally
from tests.support.fake_openai import FakeOpenAIProcess
from tests.support.proxy import ProxyProcess

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
OPENCODE = ROOT / "tests" / "agents" / "node_modules" / ".bin" / "opencode"
WINDOW = 64_000
STEPS = 64
LINES = 300
API_KEY = "sk-proj-test-opencode-0123456789abcdef-secret"


def config(base_url: str, *, own_compaction: bool) -> dict[str, Any]:
    """opencode's config: one OpenAI-compatible provider at `base_url`, its model's window;
    its own compaction on (straight) or off (through the proxy)."""
    model = {"name": "gpt-4.1", "limit": {"context": WINDOW, "output": 8000}, "tool_call": True}
    out: dict[str, Any] = {
        "autoupdate": False,
        "share": "disabled",
        "provider": {
            "scripted": {
                "npm": "@ai-sdk/openai-compatible",
                "name": "scripted",
                "options": {"baseURL": f"{base_url}/v1", "apiKey": "{env:SCRIPTED_API_KEY}"},
                "models": {"gpt-4.1": model},
            }
        },
        "model": "scripted/gpt-4.1",
    }
    if not own_compaction:
        out["compaction"] = {"auto": False, "prune": False}
    return out


def opencode(own_compaction: bool) -> Any:
    def run(base_url: str, home: Path, workdir: Path, *args: str) -> dict[str, Any]:
        """One `opencode run --format json`: its session id and its last text, from its
        events."""
        path = home / "opencode.json"
        path.write_text(json.dumps(config(base_url, own_compaction=own_compaction)))
        env = {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "HOME": str(home),
            "OPENCODE_CONFIG": str(path),
            "SCRIPTED_API_KEY": API_KEY,
            "OPENCODE_DISABLE_MODELS_FETCH": "1",  # no models.dev: offline
            "OPENCODE_DISABLE_AUTOUPDATE": "1",
            "OPENCODE_DISABLE_LSP_DOWNLOAD": "1",
            "OPENCODE_DISABLE_DEFAULT_PLUGINS": "1",
        }
        output = home / "opencode-output.jsonl"
        with output.open("w") as sink:
            done = subprocess.run(
                [str(OPENCODE), "run", "--format", "json", *args],
                cwd=workdir,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=sink,
                stderr=subprocess.PIPE,
                text=True,
                timeout=600,
            )
        events = []
        for line in output.read_text().splitlines():
            if line.startswith("{"):
                events.append(json.loads(line))
        texts = [
            e["part"].get("text")
            for e in events
            if e.get("type") == "text" and isinstance(e.get("part"), dict)
        ]
        errors = [e for e in events if e.get("type") == "error"]
        return {
            "session": next((e.get("sessionID") for e in events if e.get("sessionID")), None),
            "last": texts[-1] if texts else None,
            "error": errors or (None if done.returncode == 0 else done.stderr[-2000:]),
        }

    return run


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    if not OPENCODE.exists():
        pytest.fail(f"{OPENCODE} is missing: `make agents` installs the pinned CLIs")
    base = tmp_path_factory.mktemp("opencode")
    script = {"default": {"kind": "agent", "steps": STEPS, "lines": LINES}}
    with FakeOpenAIProcess(script={**script, "context_window": WINDOW}) as fake:
        return both_ways(
            base,
            fake,
            lambda data, url: ProxyProcess(data, openai=url, window=WINDOW),
            {"direct": opencode(own_compaction=True), "proxy": opencode(own_compaction=False)},
            lambda first: ("--session", first["session"]),
            chat_tally,
            OPENCODE.name,
        )


def test_straight_to_the_upstream_opencode_compacts_the_session_itself(
    runs: dict[str, Any],
) -> None:
    direct = runs["direct"]["first_seen"]
    assert direct["agent_compactions"] or direct["rejected"], direct


@pytest.mark.parametrize("run", ["first", "resumed"])
def test_through_the_proxy_the_session_completes_under_the_window(
    runs: dict[str, Any], run: str
) -> None:
    result, upstream = runs["proxy"][run], runs["proxy"][f"{run}_seen"]
    assert result["error"] is None, result
    assert result["last"] == f"Done: ran {STEPS} commands."
    assert upstream["requests"] > STEPS
    assert upstream["rejected"] == []
    assert upstream["largest"] <= WINDOW
    assert upstream["agent_compactions"] == 0


def test_through_the_proxy_the_upstream_counts_fewer_input_tokens_in_all(
    runs: dict[str, Any],
) -> None:
    def total(way: str) -> int:
        return sum(runs[way][f"{run}_seen"]["input_tokens"] for run in ("first", "resumed"))

    assert total("proxy") < total("direct"), (total("proxy"), total("direct"))


def test_the_key_is_never_written(runs: dict[str, Any]) -> None:
    assert_key_never_written(runs["proxy"], API_KEY)
