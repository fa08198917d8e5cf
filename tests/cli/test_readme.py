"""The README's commands, run as written (placeholders filled with the bundled transcripts), so
the first thing a new user copies cannot drift from the CLI."""

from __future__ import annotations

import json
import re
import shlex
import subprocess
from pathlib import Path

from .test_cli import ROOT, SCRIPT, SMALL, SWE, Cli, env_for

README = (ROOT / "README.md").read_text()


def block(language: str, after: str) -> str:
    """The first fenced block of `language` after the heading `after`."""
    found = re.search(rf"{re.escape(after)}.*?```{language}\n(.*?)```", README, re.S)
    assert found, f"no {language} block after {after!r}"
    return found.group(1)


def readme_commands() -> list[list[str]]:
    return [
        shlex.split(line, comments=True)
        for line in block("sh", "## Using it").splitlines()
        if line.startswith("compactd ")
    ]


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
        done = cli(*args)
        if argv[1] == "import":
            session = done.stdout.strip()
            assert re.fullmatch(r"[0-9a-f]{32}", session), done.stdout
        if argv[1] == "render":
            assert {"request", "tokens", "events"} <= set(json.loads(done.stdout))
        if argv[1] == "compact":
            assert done.stdout.startswith("compacted:")
    assert (tmp_path / "replay.png").stat().st_size > 0


def test_make_run_demo(tmp_path: Path) -> None:
    """`make run` is `compactd demo` on a bundled transcript (here the smaller one)."""
    recipe = (ROOT / "Makefile").read_text()
    assert "compactd demo tests/data/transcripts/" in recipe
    done = Cli(tmp_path / "data", tmp_path)("demo", str(SMALL), "--then-window", "32000")
    assert "after the cascade" in done.stdout


def test_the_neovim_snippet_talks_as_the_daemon_expects(tmp_path: Path) -> None:
    """What the Lua sends: `session/open` with `vim.empty_dict()` (encoded `{}`), then
    `context/measure` with the id; run over the wire as Neovim would."""
    lua = block("lua", "Neovim")
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
