"""The README's commands, run as written (placeholders filled with the bundled transcripts), and
the examples the reference in docs/ gives, so the first thing a new user copies cannot drift
from the CLI."""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import sys
from pathlib import Path

from tests.support.fake_anthropic import FakeAnthropicProcess

from .test_cli import ROOT, SCRIPT, SMALL, SWE, Cli, data_bytes, env_for

README = (ROOT / "README.md").read_text()
RPC_DOC = (ROOT / "docs" / "rpc.md").read_text()
OFFLINE = "### Sessions from your agents' logs"


def block(language: str, after: str, text: str = README) -> str:
    """The first fenced block of `language` after the heading `after`."""
    found = re.search(rf"{re.escape(after)}.*?```{language}\n(.*?)```", text, re.S)
    assert found, f"no {language} block after {after!r}"
    return found.group(1)


def readme_commands(heading: str = OFFLINE) -> list[list[str]]:
    return [
        shlex.split(line, comments=True)
        for line in block("sh", heading).splitlines()
        if line.startswith("compactd ")
    ]


def test_the_first_screen_commands_are_the_cli_s() -> None:
    """What the guide's first sections tell a user to type parses as compactd's own command
    line: `compactd claude`'s own options before the agent's, then the agent's untouched."""
    from compactd.clients.cli import parse

    seen = set()
    for heading in ("## Run your agent through it", "## What you will see", "### Leave"):
        for argv in readme_commands(heading):
            args = [a.replace("<session>", "s1") for a in argv[1:] if not a.startswith(">")]
            if "--print-service" in args:
                args = args[: args.index("--print-service") + 1]
            ns = parse(args)
            seen.add(ns.command)
            if ns.command == "claude" and "-p" in args:
                assert ns.window == 64000 and ns.agent_args == ["-p", "fix the failing test"]
    assert {"claude", "codex", "stats", "sessions", "context", "proxy"} <= seen


def test_every_readme_command_runs(tmp_path: Path) -> None:
    cli = Cli(tmp_path / "data", tmp_path)
    commands = readme_commands()
    names = [argv[1] for argv in commands]
    for name in ("import", "sessions", "context", "render", "compact", "snip", "replay"):
        assert name in names, f"the README no longer shows `compactd {name}`"
    session = ""
    for argv in commands:
        args = []
        for arg in argv[1:]:
            if arg.startswith("~/.claude/"):
                arg = str(SMALL)
            arg = arg.replace("<transcript>", str(SWE)).replace("<session>", session[:10])
            args.append(arg)
        if argv[1] == "migrate":  # needs a database: the fleet tests run it on a real one
            assert "--to URL" in cli("migrate", "-h").stdout
            continue
        # the session is small once compacted: a snip to 40,000 changes nothing, and says so
        done = cli(*args, code=1 if argv[1] == "snip" else 0)
        if argv[1] == "snip":
            assert done.stdout.startswith("nothing snipped: already under the target")
        if argv[1] == "import":
            session = done.stdout.strip()
            assert re.fullmatch(r"[0-9a-f]{32}", session), done.stdout
        if argv[1] == "render" and "--json" in argv:
            assert {"request", "tokens", "events"} <= set(json.loads(done.stdout))
        if "--dry-run" in argv:
            assert "a preview: nothing was written" in done.stdout
        if argv[1] == "compact":
            assert done.stdout.startswith("compacted:")
    assert (tmp_path / "replay.png").stat().st_size > 0


def test_make_run_demo_shows_the_same_every_time(tmp_path: Path) -> None:
    """`make run` is `compactd demo` on a bundled transcript (here the smaller one, at a window
    its cascade summarizes in): the cascade is a preview and the panels are named by the
    transcript, so a second run shows the same, byte for byte, and writes nothing."""
    recipe = (ROOT / "Makefile").read_text()
    assert "compactd demo tests/data/transcripts/" in recipe
    cli = Cli(tmp_path / "data", tmp_path)
    demo = ("demo", str(SMALL), "--then-window", "6000", "--summary-provider", "digest")
    first = cli(*demo).stdout
    assert "after the cascade" in first and "✓ summary: " in first
    kept = data_bytes(cli.data_dir)
    assert cli(*demo).stdout == first
    assert data_bytes(cli.data_dir) == kept
    # `make run` starts from a fresh data dir: a new session id, and still the same output
    assert Cli(tmp_path / "fresh", tmp_path)(*demo).stdout == first


def test_the_neovim_snippet_talks_as_the_daemon_expects(tmp_path: Path) -> None:
    """What the Lua sends: `session/open` with `vim.empty_dict()` (encoded `{}`), then
    `context/measure` with the id; run over the wire as Neovim would."""
    lua = block("lua", "Neovim", RPC_DOC)
    assert '"serve", "--stdio"' in lua and 'request("session/open", vim.empty_dict()' in lua
    proc = subprocess.Popen(
        [SCRIPT, "serve", "--stdio"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        env=env_for(tmp_path),
    )
    assert proc.stdin is not None and proc.stdout is not None

    def call(msg_id: int, method: str, params: object) -> dict[str, object]:
        body = json.dumps({"jsonrpc": "2.0", "id": msg_id, "method": method, "params": params})
        proc.stdin.write(b"Content-Length: %d\r\n\r\n%s" % (len(body), body.encode()))  # type: ignore[union-attr]
        proc.stdin.flush()  # type: ignore[union-attr]
        while True:
            length = int(proc.stdout.readline().split(b":")[1])  # type: ignore[union-attr]
            proc.stdout.readline()  # type: ignore[union-attr]
            message = json.loads(proc.stdout.read(length))  # type: ignore[union-attr]
            if message.get("id") == msg_id:
                return message

    try:
        opened = call(1, "session/open", {})
        sid = opened["result"]["sessionId"]  # type: ignore[index]
        measured = call(2, "context/measure", {"sessionId": sid})
        assert measured["result"]["limit"] > 0  # type: ignore[index]
    finally:
        proc.stdin.close()
        proc.wait(timeout=60)


def test_the_python_agent_loop_runs_as_written(tmp_path: Path) -> None:
    """The README's Python block, run unchanged with the real anthropic SDK against the
    loopback fake: the model reads a file and calls compactd's own recall tool (with a handle
    it made up), then answers; every request the SDK sends must pass the fake's checks
    (pairing above all), and the session holds the whole loop."""
    code = block("python", "An agent uses it like this", RPC_DOC)
    (tmp_path / "agent.py").write_text(code)
    (tmp_path / "README.md").write_text("The answer is forty-two.\n")
    calls = [
        {"type": "text", "text": "Let me read it."},
        {
            "type": "tool_use",
            "id": "toolu_read",
            "name": "read_file",
            "input": {"path": "README.md"},
        },
        {
            "type": "tool_use",
            "id": "toolu_recall",
            "name": "compactd_recall",
            "input": {"handle": "recall:n1.00000000"},
        },
    ]
    script = {
        "messages": [{"kind": "text", "content": calls, "stop_reason": "tool_use"}],
        "default": {"kind": "text", "text": "README.md says the answer is forty-two."},
    }
    with FakeAnthropicProcess(script=script) as fake:
        env = {**env_for(tmp_path / "data"), "ANTHROPIC_BASE_URL": fake.base_url}
        env["ANTHROPIC_API_KEY"] = "test-key"
        done = subprocess.run(
            [sys.executable, "agent.py"],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        sent = [r for r in fake.requests() if r["path"].endswith("/messages")]
    assert done.returncode == 0, done.stderr
    assert "README.md says the answer is forty-two." in done.stdout
    assert re.search(r"^[\d,]+ of [\d,]+ tokens$", done.stdout, re.M), done.stdout
    assert len(sent) == 2
    second = sent[1]["body"]["messages"]
    results = {b["tool_use_id"]: b for b in second[-1]["content"] if b["type"] == "tool_result"}
    assert "forty-two" in str(results["toolu_read"]["content"])
    assert results["toolu_recall"].get("is_error") is True  # a made-up handle: the model reads why
    assert [m["role"] for m in second] == ["user", "assistant", "user"]
    assert "caller" not in str(second[1]["content"])


BUNDLED_LONG_TURNS = [
    # the bundled Claude Code session: 47,427 tokens, its earlier turns under the compaction it
    # recorded, then one long agentic turn; the Codex one: one turn of 39 tool calls
    ROOT / "tests/data/transcripts/claude-code/64da7265-8f07-4967-b79f-0ae374c13330.jsonl",
    next((ROOT / "tests/data/transcripts/codex").glob("rollout-*.jsonl")),
]


def test_the_readme_compact_example_compacts_a_long_agentic_turn(tmp_path: Path) -> None:
    """The README's own `compact` line, and a plain `compact`, on real sessions with nothing
    before their retained turns to summarize: each summarizes inside the turn and says what
    it kept (both said "short history" and changed nothing)."""
    [line] = [argv for argv in readme_commands() if argv[1] == "compact"]
    plain = ["compact", "<session>", "--summary-provider", "digest"]
    cli = Cli(tmp_path / "data", tmp_path)
    for transcript, argv in zip(BUNDLED_LONG_TURNS, (line[1:], plain), strict=True):
        session = cli("-q", "import", str(transcript)).stdout.split()[0]
        done = cli(*[a.replace("<session>", session) for a in argv])
        assert done.stdout.startswith("compacted: /compact: summarized "), done.stdout
        assert "; kept the request of the turn in progress and its newest" in done.stdout
        before, after = (
            int(n.replace(",", ""))
            for n in re.search(r"\(([\d,]+) → ([\d,]+) tokens\)", done.stdout).groups()
        )
        assert after < before / 2, done.stdout
