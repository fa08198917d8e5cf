"""One scripted session run by a real agent CLI twice — straight to the loopback upstream and
through `compactd proxy` — each then resumed: what the agent tests compare."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from tests.support.proxy import ProxyProcess

Agent = Callable[..., dict[str, Any]]  # (base_url, home, workdir, *args) -> its result


def both_ways(
    base: Path,
    fake: Any,
    proxy: Callable[[Path, str], ProxyProcess],
    agent: Agent | dict[str, Agent],
    resume: Callable[[dict[str, Any]], Sequence[str]],
    tally: Callable[[list[dict[str, Any]]], dict[str, Any]],
    name: str,
) -> dict[str, Any]:
    """Per way ("direct", "proxy"): the first run and its resumption, with what the upstream
    saw of each (`tally`), and the proxy's log, exit code and data dir. `proxy(data_dir,
    upstream_url)` makes the proxy; `resume(first)` the arguments that resume the first run.
    `agent` may differ per way (`{"direct": …, "proxy": …}`): straight, an agent is told the
    upstream's window and manages it itself; through the proxy, compactd holds it."""
    out: dict[str, Any] = {}
    for way in ("direct", "proxy"):
        home, work = base / way / "home", base / way / "work"
        home.mkdir(parents=True)
        work.mkdir(parents=True)
        front = proxy(base / "data", fake.base_url) if way == "proxy" else None
        url = front.start().base_url if front is not None else fake.base_url
        run = agent[way] if isinstance(agent, dict) else agent
        try:
            fake.reset()
            first = run(url, home, work, "list the outputs")
            first_seen = tally(fake.requests())
            fake.reset()
            resumed = run(url, home, work, *resume(first), "list them again")
            resumed_seen = tally(fake.requests())
        finally:
            if front is not None:
                front.stop()
        out[way] = {
            "first": first,
            "first_seen": first_seen,
            "resumed": resumed,
            "resumed_seen": resumed_seen,
            "log": front.log if front else "",
            "returncode": front.returncode if front else 0,
            "data": base / "data",
        }
    for way in ("direct", "proxy"):  # the figures the README quotes (`pytest -s`)
        for run in ("first", "resumed"):
            seen = out[way][f"{run}_seen"]
            keys = (
                "requests",
                "rejected",
                "agent_compactions",
                "largest",
                "input_tokens",
                "cached_tokens",
            )
            print(f"{name} {way} {run}:", {k: seen[k] for k in keys if k in seen})
    return out


def headless(
    command: list[str], env: dict[str, str], workdir: Path, home: Path, timeout: float
) -> tuple[Any, subprocess.CompletedProcess[str]]:
    """One headless run of an agent CLI that prints its result as JSON: the JSON (None when it
    printed none) and the finished process (its stderr says why). The output goes to a file:
    node cuts a large write to a pipe at exit."""
    output = home / "agent-output.json"
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(home), **env}
    with output.open("w") as sink:
        done = subprocess.run(
            command,
            cwd=workdir,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=sink,
            stderr=subprocess.PIPE,
            text=True,
            timeout=timeout,
        )
    try:
        return json.loads(output.read_text()), done
    except json.JSONDecodeError:
        return None, done


def _chat_text(message: dict[str, Any]) -> str:
    content = message.get("content")
    if isinstance(content, str):
        return content
    return " ".join(
        str(p.get("text", "")) for p in content or [] if isinstance(p, dict) and "text" in p
    )


def chat_tally(requests: list[dict[str, Any]]) -> dict[str, Any]:
    """What a Chat Completions upstream saw: requests, refusals, the largest prompt and the
    prompts of the answered ones in its count, and the agent's own compactions (a request for
    its summary, asked in its last message or in its instructions, or one that carries
    results it cleared itself)."""
    from tests.support.fake_openai import chat_prompt
    from tests.support.scripted_agent import AGENT_CLEARING_MARKERS, AGENT_SUMMARY_MARKERS

    calls = [r for r in requests if r["path"] == "/v1/chat/completions"]
    answered = [r for r in calls if r["status"] == 200]
    own = 0
    for r in calls:
        messages = r["body"].get("messages") or []
        ends = [_chat_text(messages[0]), _chat_text(messages[-1])] if messages else []
        cleared = any(
            marker in _chat_text(m)
            for m in messages
            if m.get("role") == "tool"
            for marker in AGENT_CLEARING_MARKERS
        )
        own += any(m in end for end in ends for m in AGENT_SUMMARY_MARKERS) or cleared
    return {
        "requests": len(calls),
        "rejected": [r["status"] for r in calls if r["status"] != 200],
        "largest": max(chat_prompt(r["body"]) for r in calls),
        "input_tokens": sum(chat_prompt(r["body"]) for r in answered),
        "agent_compactions": own,
    }


def compactd_json(data: Path, *args: str) -> Any:
    """`compactd ARGS --json` on a proxy's data dir, read (`stats`, `context`)."""
    done = subprocess.run(
        [str(Path(sys.executable).with_name("compactd")), *args, "--json"],
        env={**os.environ, "COMPACTD_DATA_DIR": str(data)},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def assert_key_never_written(proxy: dict[str, Any], key: str) -> None:
    """The proxy's run (`both_ways(...)["proxy"]`) exited cleanly, stored sessions, and its key
    is in none of its files or its log."""
    assert proxy["returncode"] == 0, proxy["log"]
    assert any(Path(proxy["data"]).rglob("*.jsonl"))
    for path in Path(proxy["data"]).rglob("*"):
        if path.is_file():
            assert key.encode() not in path.read_bytes(), path
    assert key not in proxy["log"]
