"""The real Gemini CLI (npm `@google/gemini-cli`, pinned in tests/agents) through `compactd
proxy`, speaking the Gemini API to the address in `GOOGLE_GEMINI_BASE_URL` with its API key,
against a loopback Gemini API as strict as the real one where it matters (`fake_gemini`): a
small window in its own count (400 "The input token count (N) exceeds the maximum number of
tokens allowed (W)." over it), 400 on a function response turn that does not answer the call
turn before it, thought signatures it issued and no other, SSE as the API streams it — and a
scripted model making 64 shell calls whose outputs pass the window more than twice over.

Straight to the upstream, Gemini CLI is told the window (`model.compressionThreshold`, the
fraction of its own 1M-token limit where it summarizes its history into a `<state_snapshot>`),
as a user of a small-window model would. Through the proxy it keeps its defaults: the session
completes with no 400, every prompt under the window, no compaction of Gemini CLI's own, and
fewer input tokens than straight. Gemini CLI also masks old tool outputs by itself once more than
80K tokens of them pile up (`tool_output_masked`; no setting turns that off), so the outputs
here stay under that in its count, and the window is sized for them to pass it.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.support.agent_runs import both_ways, headless
from tests.support.fake_gemini import FakeGeminiProcess
from tests.support.proxy import ProxyProcess
from tests.support.scripted_agent import AGENT_SUMMARY_MARKERS

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
GEMINI = ROOT / "tests" / "agents" / "node_modules" / ".bin" / "gemini"
WINDOW = 32_000
STEPS = 64
LINES = 75
MODEL = "gemini-2.5-pro"
TOKEN_LIMIT = 1_048_576  # what Gemini CLI takes the model's window to be
API_KEY = "AIzaSy-test-gemini-cli-0123456789abcdef"
MASKED = "tool_output_masked"  # Gemini CLI's own masking of old tool outputs


def settings(*, told_window: bool) -> dict[str, Any]:
    """Gemini CLI's `~/.gemini/settings.json`: API-key auth, the model fixed (no routing),
    no update checks or usage statistics; straight, compression at half the upstream's
    window."""
    model: dict[str, Any] = {"name": MODEL}
    if told_window:
        model["compressionThreshold"] = WINDOW / 2 / TOKEN_LIMIT
    return {
        "security": {"auth": {"selectedType": "gemini-api-key"}, "folderTrust": {"enabled": False}},
        "model": model,
        "general": {"disableAutoUpdate": True, "disableUpdateNag": True},
        "privacy": {"usageStatisticsEnabled": False},
        "telemetry": {"enabled": False},
    }


def gemini(told_window: bool) -> Any:
    def run(base_url: str, home: Path, workdir: Path, *args: str) -> dict[str, Any]:
        """One headless `gemini -p` run: its session id and its answer, from its JSON."""
        (home / ".gemini").mkdir(exist_ok=True)
        (home / ".gemini" / "settings.json").write_text(
            json.dumps(settings(told_window=told_window))
        )
        *options, prompt = args
        env = {
            "GEMINI_API_KEY": API_KEY,
            "GOOGLE_GEMINI_BASE_URL": base_url,
            "GEMINI_CLI_TRUST_WORKSPACE": "true",
        }
        command = [str(GEMINI), *options, "-p", prompt, "--approval-mode=yolo"]
        printed, done = headless([*command, "--output-format", "json"], env, workdir, home, 900)
        result = printed if isinstance(printed, dict) else {}
        return {
            "session": result.get("session_id"),
            "last": result.get("response"),
            "error": result.get("error") or (None if result else done.stderr[-2000:]),
            "code": done.returncode,
        }

    return run


def _last_text(body: dict[str, Any]) -> str:
    contents = body.get("contents") or [{}]
    parts = contents[-1].get("parts") or []
    return " ".join(str(p.get("text", "")) for p in parts if isinstance(p, dict))


def gemini_tally(requests: list[dict[str, Any]]) -> dict[str, Any]:
    """What the Gemini upstream saw: requests, refusals, the largest prompt and the prompts
    of the answered ones in its count, and Gemini CLI's own compactions (a request for its
    `<state_snapshot>`, or one carrying outputs it masked itself)."""
    calls = [r for r in requests if r["path"].endswith(("GenerateContent", "generateContent"))]
    own = sum(
        any(m.lower() in _last_text(r["body"]).lower() for m in AGENT_SUMMARY_MARKERS)
        or MASKED in json.dumps(r["body"].get("contents"))
        for r in calls
    )
    return {
        "requests": len(calls),
        "rejected": [r["status"] for r in calls if r["status"] != 200],
        "largest": max((r.get("prompt_tokens") or 0 for r in calls), default=0),
        "input_tokens": sum(r["prompt_tokens"] for r in calls if r["status"] == 200),
        "cached_tokens": sum(r.get("cached_tokens") or 0 for r in calls if r["status"] == 200),
        "agent_compactions": own,
    }


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    if not GEMINI.exists():
        pytest.fail(f"{GEMINI} is missing: `make agents` installs the pinned CLIs")
    base = tmp_path_factory.mktemp("gemini")
    script = {"default": {"kind": "agent", "steps": STEPS, "lines": LINES}}
    with FakeGeminiProcess(script={**script, "context_window": WINDOW}) as fake:
        out = both_ways(
            base,
            fake,
            lambda data, url: ProxyProcess(data, gemini=url, window=WINDOW),
            {"direct": gemini(told_window=True), "proxy": gemini(told_window=False)},
            lambda first: ("--resume", "latest"),
            gemini_tally,
            GEMINI.name,
        )
        # what the whole session costs straight where it fits: the same upstream, no window
        fake.reset()
        fake.load_script({"context_window": None})
        home, work = base / "unbounded" / "home", base / "unbounded" / "work"
        home.mkdir(parents=True)
        work.mkdir(parents=True)
        out["unbounded"] = {"first": gemini(told_window=False)(fake.base_url, home, work, "list")}
        out["unbounded"]["first_seen"] = gemini_tally(fake.requests())
        print(f"{GEMINI.name} unbounded first:", out["unbounded"]["first_seen"])
        return out


def test_through_the_proxy_the_session_completes_under_the_window(runs: dict[str, Any]) -> None:
    result, upstream = runs["proxy"]["first"], runs["proxy"]["first_seen"]
    assert result["error"] is None, result
    assert result["last"] == f"Done: ran {STEPS} commands."
    assert upstream["requests"] > STEPS
    assert upstream["rejected"] == []
    assert upstream["largest"] <= WINDOW
    assert upstream["agent_compactions"] == 0


def test_a_resumed_session_through_the_proxy_gets_no_400(runs: dict[str, Any]) -> None:
    """`--resume latest`: Gemini CLI sends each earlier function response twice (the API pairs
    by count and refuses it; compactd sends the first) and its calls' signatures as the API's
    documented stand-in; the run completes under the window. (Resumed, the history holds both
    runs' outputs, past the 80K tokens where Gemini CLI masks old ones itself.)"""
    result, upstream = runs["proxy"]["resumed"], runs["proxy"]["resumed_seen"]
    assert result["error"] is None, result
    assert result["last"] == f"Done: ran {STEPS} commands."
    assert upstream["rejected"] == []
    assert upstream["largest"] <= WINDOW


def test_straight_gemini_cli_cannot_keep_one_long_turn_under_the_window(
    runs: dict[str, Any],
) -> None:
    """Gemini CLI compresses only at a user turn's start, so one long agentic turn runs into
    the window however it is told: straight, the session is refused before it ends."""
    direct = runs["direct"]["first_seen"]
    assert 400 in direct["rejected"], direct
    assert runs["direct"]["first"]["last"] != f"Done: ran {STEPS} commands."


def test_through_the_proxy_the_upstream_counts_fewer_input_tokens(runs: dict[str, Any]) -> None:
    """Than the same session straight where it fits (no window upstream): the whole run, and
    every prompt of it under the window."""
    unbounded = runs["unbounded"]
    assert unbounded["first"]["last"] == f"Done: ran {STEPS} commands."
    assert unbounded["first_seen"]["largest"] > 2 * WINDOW  # the outputs pass the window
    through = runs["proxy"]["first_seen"]["input_tokens"]
    assert through < unbounded["first_seen"]["input_tokens"], (through, unbounded)


def test_the_key_is_never_written(runs: dict[str, Any]) -> None:
    proxy = runs["proxy"]
    assert proxy["returncode"] == 0, proxy["log"]
    assert any(Path(proxy["data"]).rglob("*.jsonl"))
    for path in Path(proxy["data"]).rglob("*"):
        if path.is_file():
            assert API_KEY.encode() not in path.read_bytes(), path
    assert API_KEY not in proxy["log"]
