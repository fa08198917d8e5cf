"""The real aider (PyPI `aider-chat`, pinned in its own virtualenv under tests/agents) through
`compactd proxy`, speaking Chat Completions through LiteLLM to the address in `OPENAI_API_BASE`
(`--model openai/gpt-4.1`), against a loopback Chat Completions server as strict as the API
where it matters: a 64K window in its own count (400 `context_length_exceeded` over it), SSE
chunks and `[DONE]` as the API streams them, and a scripted model that answers each "Show
listing N" with that listing, 300 lines long.

aider calls no tools: a session is its user's turns. One aider process reads 64 of them on its
standard input (`--no-fancy-input`, in `ask` mode, so nothing is edited) and its answers pass
the window several times over; then `--restore-chat-history` resumes it with 16 more. aider is
told the model's window (`--model-metadata-file`) both ways. Straight, it summarizes only the
history its edits moved behind it and the history it restores, so a chat of questions outgrows
the window and the upstream refuses it; through the proxy its own summaries are off
(`--max-chat-history-tokens`, as large as it gets) and every turn is answered under the window.
Input tokens are not compared: straight, most turns are refused, and a refused turn costs none.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.support.agent_runs import assert_key_never_written, both_ways, chat_tally
from tests.support.fake_openai import FakeOpenAIProcess
from tests.support.proxy import ProxyProcess

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
AIDER = ROOT / "tests" / "agents" / "aider-venv" / "bin" / "aider"
WINDOW = 64_000
LINES = 300
TURNS = {"list the outputs": range(64), "list them again": range(64, 80)}
API_KEY = "sk-proj-test-aider-0123456789abcdef-secret"
REFUSED = re.compile(r"has hit a token limit!|ContextWindowExceededError")


def metadata() -> dict[str, Any]:
    """The model's entry in aider's model metadata (LiteLLM's shape): the upstream's window."""
    return {
        "max_input_tokens": WINDOW,
        "max_tokens": WINDOW,
        "max_output_tokens": 8000,
        "input_cost_per_token": 0,
        "output_cost_per_token": 0,
        "litellm_provider": "openai",
        "mode": "chat",
    }


def aider(own_summaries: bool) -> Any:
    def run(base_url: str, home: Path, workdir: Path, *args: str) -> dict[str, Any]:
        """One aider process fed its turns on stdin: the last answer and every refusal it
        printed."""
        *options, prompt = args
        path = home / "model-metadata.json"
        path.write_text(json.dumps({"openai/gpt-4.1": metadata()}))
        caches = home / ".aider" / "caches"  # aider's copy of LiteLLM's model list: offline
        caches.mkdir(parents=True, exist_ok=True)
        (caches / "model_prices_and_context_window.json").write_text(
            json.dumps({"gpt-4.1": metadata()})
        )
        env = {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "HOME": str(home),
            "TERM": "dumb",
            "OPENAI_API_KEY": API_KEY,
            "OPENAI_API_BASE": f"{base_url}/v1",
            "LITELLM_LOCAL_MODEL_COST_MAP": "True",  # LiteLLM's bundled model list: offline
        }
        command = [
            str(AIDER),
            *options,
            "--model",
            "openai/gpt-4.1",
            "--model-metadata-file",
            str(path),
            "--chat-mode",
            "ask",
            "--yes-always",
            "--no-git",
            "--no-fancy-input",
            "--no-pretty",
            "--no-check-update",
            "--no-show-release-notes",
            "--analytics-disable",
            "--no-show-model-warnings",
            "--map-tokens",
            "0",
        ]
        if not own_summaries:
            command += ["--max-chat-history-tokens", str(10**9)]
        turns = "".join(f"Show listing {n}.\n" for n in TURNS[prompt])
        output = home / f"aider-{prompt.replace(' ', '-')}.txt"
        with output.open("w") as sink:
            done = subprocess.run(
                command,
                cwd=workdir,
                env=env,
                input=turns,
                stdout=sink,
                stderr=subprocess.PIPE,
                text=True,
                timeout=900,
            )
        printed = output.read_text()
        answers = re.findall(r"^Listing (\d+):$", printed, re.MULTILINE)
        return {
            "last": int(answers[-1]) if answers else None,
            "answers": len(answers),
            "refusals": len(REFUSED.findall(printed)),
            "error": None if done.returncode == 0 else done.stderr[-2000:],
        }

    return run


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    if not AIDER.exists():
        pytest.fail(f"{AIDER} is missing: `make agents` installs the pinned agents")
    base = tmp_path_factory.mktemp("aider")
    script = {"default": {"kind": "listings", "lines": LINES}, "context_window": WINDOW}
    with FakeOpenAIProcess(script=script) as fake:
        return both_ways(
            base,
            fake,
            lambda data, url: ProxyProcess(data, openai=url, window=WINDOW),
            {"direct": aider(own_summaries=True), "proxy": aider(own_summaries=False)},
            lambda first: ("--restore-chat-history",),
            chat_tally,
            AIDER.name,
        )


def test_straight_to_the_upstream_a_chat_of_questions_outgrows_the_window(
    runs: dict[str, Any],
) -> None:
    seen = runs["direct"]["first_seen"]
    assert seen["rejected"], seen
    assert runs["direct"]["first"]["refusals"] > 0


@pytest.mark.parametrize("run", ["first", "resumed"])
def test_through_the_proxy_every_turn_is_answered_under_the_window(
    runs: dict[str, Any], run: str
) -> None:
    result, upstream = runs["proxy"][run], runs["proxy"][f"{run}_seen"]
    prompt = "list the outputs" if run == "first" else "list them again"
    assert result["error"] is None, result
    assert result["refusals"] == 0, result
    assert result["answers"] == len(TURNS[prompt])
    assert result["last"] == TURNS[prompt][-1]
    assert upstream["rejected"] == []
    assert upstream["largest"] <= WINDOW
    assert upstream["agent_compactions"] == 0


def test_the_key_is_never_written(runs: dict[str, Any]) -> None:
    assert_key_never_written(runs["proxy"], API_KEY)
