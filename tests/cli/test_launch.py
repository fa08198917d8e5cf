"""`compactd claude` and `compactd codex`: the real agent CLIs (pinned in tests/agents) through a
proxy the command starts, against the loopback upstreams — the agent's exit code is the
command's, no proxy is left behind, the user's Codex config is never touched, a proxy already
running on the data dir is used, an agent whose proxy dies is stopped at once, and a missing
agent gets one line on how to install it."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from tests.support.fake_anthropic import FakeAnthropic, FakeAnthropicProcess, Reply
from tests.support.fake_openai import FakeOpenAIProcess
from tests.support.proxy import ProxyProcess

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = str(Path(sys.executable).with_name("compactd"))
AGENTS = ROOT / "tests" / "agents" / "node_modules" / ".bin"
STARTED = re.compile(r"proxy at (http://127\.0\.0\.1:\d+) \(pid (\d+),")
STEPS = 3
TIMEOUT = 600


def environment(tmp: Path, path: Path | None = AGENTS, **extra: str) -> dict[str, str]:
    """A user's environment: the agents on PATH (or not), a home and a data dir of the test's."""
    home = tmp / "home"
    home.mkdir(exist_ok=True)
    dirs = [str(path)] if path is not None else []
    dirs += [str(Path(sys.executable).parent), "/usr/bin", "/bin"]
    return {
        "PATH": os.pathsep.join(dirs),
        "HOME": str(home),
        "COMPACTD_DATA_DIR": str(tmp / "data"),
        "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
        **extra,
    }


def compactd(
    tmp: Path, *args: str, env: dict[str, str], timeout: float = TIMEOUT
) -> subprocess.CompletedProcess[str]:
    work = tmp / "work"
    work.mkdir(exist_ok=True)
    return subprocess.run(
        [SCRIPT, *args],
        cwd=work,
        env=env,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def started_proxy(stderr: str) -> tuple[str, int]:
    found = STARTED.search(stderr)
    assert found, stderr
    return found.group(1), int(found.group(2))


def stats(env: dict[str, str]) -> dict[str, Any]:
    done = subprocess.run(
        [SCRIPT, "stats", "--json"], env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def fake_agent(folder: Path, name: str, code: int) -> Path:
    """An agent that checks what it was pointed at: the proxy's health, then exits `code`."""
    folder.mkdir(parents=True, exist_ok=True)
    agent = folder / name
    agent.write_text(
        f"#!{sys.executable}\n"
        "import json, os, sys, urllib.request\n"
        "url = os.environ['ANTHROPIC_BASE_URL']\n"
        "health = json.load(urllib.request.urlopen(url + '/healthz'))\n"
        "assert health['service'] == 'compactd proxy', health\n"
        "print('agent args:', json.dumps(sys.argv[1:]))\n"
        f"sys.exit({code})\n"
    )
    agent.chmod(0o755)
    return folder


def test_claude_through_compactd_exits_with_its_code_and_leaves_no_proxy(tmp_path: Path) -> None:
    if not (AGENTS / "claude").exists():
        pytest.fail("the pinned Claude Code is missing: `make agents` installs it")
    script = {"default": {"kind": "agent", "steps": STEPS, "lines": 40}}
    with FakeAnthropicProcess(script=script) as fake:
        env = environment(tmp_path, ANTHROPIC_API_KEY="sk-ant-launch-test")
        done = compactd(
            tmp_path,
            "claude",
            "--anthropic-upstream",
            fake.base_url,
            "-p",
            "list the outputs",
            "--output-format",
            "json",
            "--allowedTools",
            "Bash",
            env=env,
        )
        assert done.returncode == 0, done.stderr
        assert json.loads(done.stdout)["result"] == f"Done: ran {STEPS} commands."
        _, pid = started_proxy(done.stderr)
        assert not alive(pid)  # stopped with the agent
        assert not (tmp_path / "data" / "proxy.json").exists()
        [session] = stats(env)["sessions"]
        assert session["agent"].startswith("claude-cli/") and session["requests"] > STEPS
        assert session["state"] == "managed"

        # the agent's failure is the command's: a key the upstream refuses, exit 1
        refused = compactd(
            tmp_path,
            "claude",
            "--anthropic-upstream",
            fake.base_url,
            "-p",
            "list the outputs",
            env={**env, "ANTHROPIC_API_KEY": ""},
        )
    assert refused.returncode == 1, (refused.stdout, refused.stderr)
    assert not alive(started_proxy(refused.stderr)[1])


def test_the_agent_s_own_exit_code_and_arguments_pass_through(tmp_path: Path) -> None:
    folder = fake_agent(tmp_path / "bin", "claude", 42)
    done = compactd(
        tmp_path,
        "claude",
        "--window",
        "64000",
        "-p",
        "--window",
        "1",
        env=environment(tmp_path, folder),
    )
    assert done.returncode == 42, done.stderr
    # everything from the first argument that is not compactd's is the agent's, as given
    assert 'agent args: ["-p", "--window", "1"]' in done.stdout
    assert not alive(started_proxy(done.stderr)[1])


def test_a_proxy_already_running_on_the_data_dir_is_used_and_left_running(
    tmp_path: Path,
) -> None:
    folder = fake_agent(tmp_path / "bin", "claude", 0)
    env = environment(tmp_path, folder)
    with FakeAnthropic() as fake, ProxyProcess(tmp_path / "data", anthropic=fake.base_url) as up:
        done = compactd(
            tmp_path, "claude", "--anthropic-upstream", fake.base_url, "-p", "hi", env=env
        )
        assert done.returncode == 0, done.stderr
        assert f"using the proxy already running at {up.base_url}" in done.stderr
        assert up.process is not None and up.process.poll() is None
        # another upstream is another proxy's work: this one is not used for it
        other = compactd(
            tmp_path, "claude", "--anthropic-upstream", "http://127.0.0.1:9", "-p", "hi", env=env
        )
        assert other.returncode == 0, other.stderr
        assert started_proxy(other.stderr)[0] != up.base_url


def test_the_agent_is_stopped_at_once_when_its_proxy_dies(tmp_path: Path) -> None:
    """Claude Code would retry a dead address for minutes, printing nothing; the command
    stops it as soon as the proxy is gone, and says why."""
    if not (AGENTS / "claude").exists():
        pytest.fail("the pinned Claude Code is missing: `make agents` installs it")
    with FakeAnthropic() as fake:
        fake.push(Reply.stall(300))  # the answer never comes while the proxy is up
        env = environment(tmp_path, ANTHROPIC_API_KEY="sk-ant-launch-test")
        (tmp_path / "work").mkdir()
        launcher = subprocess.Popen(
            [SCRIPT, "claude", "--anthropic-upstream", fake.base_url, "-p", "hi"],
            cwd=tmp_path / "work",
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        try:
            assert launcher.stderr is not None
            _, pid = started_proxy(launcher.stderr.readline())
            deadline = time.monotonic() + TIMEOUT
            while not fake.pending() and time.monotonic() < deadline:
                time.sleep(0.2)  # Claude Code's request is waiting on the upstream
            os.kill(pid, signal.SIGKILL)
            launcher.wait(timeout=120)  # Claude Code alone would still be retrying
        finally:
            if launcher.poll() is None:
                launcher.kill()
                launcher.wait()
        rest = launcher.stderr.read()
    assert launcher.returncode == 3, rest
    assert "stopped, so claude was stopped too" in rest


def test_codex_through_compactd_leaves_its_config_as_it_was(tmp_path: Path) -> None:
    if not (AGENTS / "codex").exists():
        pytest.fail("the pinned Codex is missing: `make agents` installs it")
    codex_home = tmp_path / "codex-home"
    codex_home.mkdir()
    config = codex_home / "config.toml"
    config.write_text(
        'model = "gpt-5-codex"\ncheck_for_update_on_startup = false\n\n'
        "[analytics]\nenabled = false\n"
    )
    before = config.read_bytes()
    script = {"default": {"kind": "agent", "steps": STEPS, "lines": 40}}
    with FakeOpenAIProcess(script=script) as fake:
        env = environment(
            tmp_path, CODEX_HOME=str(codex_home), OPENAI_API_KEY="sk-proj-launch-test"
        )
        done = compactd(
            tmp_path,
            "codex",
            "--openai-upstream",
            fake.base_url,
            "exec",
            "--skip-git-repo-check",
            "--json",
            "list the outputs",
            env=env,
        )
        seen = [r for r in fake.requests() if r["path"] == "/v1/responses"]
    assert done.returncode == 0, done.stderr
    messages = [
        json.loads(line)["item"].get("text")
        for line in done.stdout.splitlines()
        if line.startswith("{") and json.loads(line).get("type") == "item.completed"
    ]
    assert f"Done: ran {STEPS} commands." in messages
    assert len(seen) > STEPS  # every request went through the proxy to the upstream
    assert config.read_bytes() == before
    assert not alive(started_proxy(done.stderr)[1])
    [session] = stats(env)["sessions"]
    assert session["requests"] == len(seen)


@pytest.mark.parametrize(
    "agent, package",
    [("claude", "@anthropic-ai/claude-code"), ("codex", "@openai/codex")],
)
def test_a_missing_agent_gets_one_line_on_how_to_install_it(
    tmp_path: Path, agent: str, package: str
) -> None:
    done = compactd(tmp_path, agent, "-p", "hi", env=environment(tmp_path, None))
    assert done.returncode == 127
    assert done.stderr.count("\n") == 1 and f"npm install -g {package}" in done.stderr
    assert not (tmp_path / "data" / "proxy.log").exists()  # no proxy was started for it
