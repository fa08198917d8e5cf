"""The real Qwen Code CLI (npm `@qwen-code/qwen-code`, pinned in tests/agents) through
`compactd proxy`, speaking Chat Completions to the address in `OPENAI_BASE_URL`, against a
loopback Chat Completions server as strict as the API where it matters: a 64K window in its own
count (400 `context_length_exceeded` over it), 400 on a tool message without its call or a call
without its tool message, SSE chunks and `[DONE]` as the API streams them, and a scripted model
making 64 shell calls whose outputs pass the window several times over.

Straight to the upstream, Qwen Code is told the window (`contextWindowSize`), as a user of a 64K
model would, and manages it itself: it clears old tool results and summarizes the conversation
into a `<state_snapshot>`. Through the proxy it keeps its defaults but for its own clearing, which
is compactd's job there (`toolResultsTotalCharsThreshold: -1`): the session completes with no
400, every prompt under the window, no compaction of Qwen Code's own, and fewer input tokens in
all. Then the same with `qwen --resume` of that session.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.support.agent_runs import both_ways, chat_tally, headless
from tests.support.fake_openai import FakeOpenAIProcess
from tests.support.proxy import ProxyProcess

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
QWEN = ROOT / "tests" / "agents" / "node_modules" / ".bin" / "qwen"
WINDOW = 64_000
STEPS = 64
LINES = 300
MODEL = "gpt-4.1"
API_KEY = "sk-proj-test-qwen-0123456789abcdef-secret"


def settings(*, told_window: bool) -> dict[str, Any]:
    """Qwen Code's `~/.qwen/settings.json`: OpenAI-compatible auth, no update checks or usage
    statistics; straight, the upstream's window; through the proxy, its own clearing off."""
    model: dict[str, Any] = {"name": MODEL}
    context: dict[str, Any] = {}
    if told_window:
        model["generationConfig"] = {"contextWindowSize": WINDOW}
    else:
        context["clearContextOnIdle"] = {"toolResultsTotalCharsThreshold": -1}
    return {
        "security": {"auth": {"selectedType": "openai"}, "folderTrust": {"enabled": False}},
        "model": model,
        "context": context,
        "general": {"disableAutoUpdate": True},
        "privacy": {"usageStatisticsEnabled": False},
        "telemetry": {"enabled": False},
    }


def qwen(told_window: bool) -> Any:
    def run(base_url: str, home: Path, workdir: Path, *args: str) -> dict[str, Any]:
        """One headless `qwen -p` run: its session id and its result, from its JSON output."""
        (home / ".qwen").mkdir(exist_ok=True)
        (home / ".qwen" / "settings.json").write_text(json.dumps(settings(told_window=told_window)))
        *options, prompt = args
        env = {
            "OPENAI_API_KEY": API_KEY,
            "OPENAI_BASE_URL": f"{base_url}/v1",
            "OPENAI_MODEL": MODEL,
            "QWEN_CODE_SUPPRESS_YOLO_WARNING": "1",
        }
        command = [str(QWEN), *options, "-p", prompt, "--approval-mode", "yolo"]
        printed, done = headless([*command, "--output-format", "json"], env, workdir, home, 600)
        events = printed if isinstance(printed, list) else []
        result = next((e for e in events if e.get("type") == "result"), {})
        return {
            "session": next((e.get("session_id") for e in events if e.get("session_id")), None),
            "last": result.get("result"),
            "error": result.get("error") or (None if result else done.stderr[-2000:]),
            "code": done.returncode,
        }

    return run


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    if not QWEN.exists():
        pytest.fail(f"{QWEN} is missing: `make agents` installs the pinned CLIs")
    base = tmp_path_factory.mktemp("qwen")
    script = {"default": {"kind": "agent", "steps": STEPS, "lines": LINES}}
    with FakeOpenAIProcess(script={**script, "context_window": WINDOW}) as fake:
        return both_ways(
            base,
            fake,
            lambda data, url: ProxyProcess(data, openai=url, window=WINDOW),
            {"direct": qwen(told_window=True), "proxy": qwen(told_window=False)},
            lambda first: ("--resume", first["session"]),
            chat_tally,
            QWEN.name,
        )


def test_straight_to_the_upstream_qwen_code_compacts_the_session_itself(
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
    """The first run and its resumption together: straight, Qwen Code summarizes at 31K of the
    64K window (it keeps 33K for its summary), so a resumed run alone may cost it less."""

    def total(way: str) -> int:
        return sum(runs[way][f"{run}_seen"]["input_tokens"] for run in ("first", "resumed"))

    assert total("proxy") < total("direct"), (total("proxy"), total("direct"))


def test_the_key_is_never_written(runs: dict[str, Any]) -> None:
    proxy = runs["proxy"]
    assert proxy["returncode"] == 0, proxy["log"]
    assert any(Path(proxy["data"]).rglob("*.jsonl"))
    for path in Path(proxy["data"]).rglob("*"):
        if path.is_file():
            assert API_KEY.encode() not in path.read_bytes(), path
    assert API_KEY not in proxy["log"]
