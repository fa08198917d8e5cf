"""The proxy's sessions are compactd's: the CLI lists them and shows their panel, on the files
and on PostgreSQL, and the global options (`--set`, `--config`, `--store`) work on the proxy as on
every command."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import anthropic

from tests.support.fake_anthropic import FakeAnthropic, Reply
from tests.support.proxy import ROOT, ProxyProcess

KEY = "sk-ant-sessions"
RESULT = "\n".join(f"row {n}: value {n * 3}" for n in range(300))  # ~4,900 characters


def converse(proxy: ProxyProcess, fake: FakeAnthropic, session: str) -> dict[str, Any]:
    """Two requests of one conversation, the second with a long tool result; what went up."""
    client = anthropic.Anthropic(base_url=proxy.base_url, api_key=KEY, max_retries=0)
    headers = {"x-claude-code-session-id": session}
    messages: list[dict[str, Any]] = [{"role": "user", "content": "show me the table"}]
    call = {"type": "tool_use", "id": f"toolu_{session}", "name": "Bash", "input": {"c": "t"}}
    fake.push(Reply.blocks([call], stop_reason="tool_use"))
    client.messages.create(
        model="claude-sonnet-4-5", max_tokens=64, messages=messages, extra_headers=headers
    )
    messages += [
        {"role": "assistant", "content": [call]},
        {
            "role": "user",
            "content": [{"type": "tool_result", "tool_use_id": call["id"], "content": RESULT}],
        },
    ]
    fake.push(Reply.answer("Here it is."))
    client.messages.create(
        model="claude-sonnet-4-5", max_tokens=64, messages=messages, extra_headers=headers
    )
    return fake.last_request.body


def cli(*args: str, data_dir: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "compactd", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        env={"COMPACTD_DATA_DIR": str(data_dir), "PATH": "/usr/bin:/bin"},
    )


def test_the_cli_lists_the_proxy_s_session_and_shows_its_panel(tmp_path: Path) -> None:
    data = tmp_path / "data"
    with FakeAnthropic() as fake, ProxyProcess(data, anthropic=fake.base_url) as proxy:
        converse(proxy, fake, "cli-session-1")
        listed = cli("sessions", "--json", data_dir=data)  # while the proxy runs
    assert listed.returncode == 0, listed.stderr
    sessions = json.loads(listed.stdout)
    rows = sessions["sessions"] if isinstance(sessions, dict) else sessions
    mine = [s for s in rows if s["sessionId"] == "cli-session-1"]
    assert mine and mine[0]["source"] == "proxy", rows
    panel = cli("context", "cli-session-1", "--window", "64000", data_dir=data)
    assert panel.returncode == 0, panel.stderr
    assert "64,000" in panel.stdout


def test_set_and_config_reach_the_proxy_s_sessions(tmp_path: Path) -> None:
    with (
        FakeAnthropic() as fake,
        ProxyProcess(
            tmp_path / "data",
            anthropic=fake.base_url,
            args=["--set", "truncateHeadChars=300", "--config", '{"recall": false}'],
        ) as proxy,
    ):
        sent = converse(proxy, fake, "set-session")
    results = [b for m in sent["messages"] for b in m["content"] if b.get("type") == "tool_result"]
    result = results[0]["content"]
    text = result if isinstance(result, str) else result[0]["text"]
    assert len(text) < 2100 and "truncated by compactd" in text  # 300 + 1,600 kept, not 4,000
    assert "compactd_recall" not in [t["name"] for t in sent.get("tools") or []]


def test_the_proxy_keeps_its_sessions_on_postgresql(tmp_path: Path, pg_url: str) -> None:
    with (
        FakeAnthropic() as fake,
        ProxyProcess(tmp_path / "data", anthropic=fake.base_url, args=["--store", pg_url]) as proxy,
    ):
        converse(proxy, fake, "pg-session-1")
    assert proxy.returncode == 0, proxy.log
    assert not list((tmp_path / "data").rglob("*.jsonl"))  # nothing in the data dir
    listed = cli("--store", pg_url, "sessions", "--json", data_dir=tmp_path / "other")
    assert listed.returncode == 0, listed.stderr
    assert "pg-session-1" in listed.stdout
