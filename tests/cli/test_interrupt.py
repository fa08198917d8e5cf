"""Ctrl-C as a person presses it: the CLI runs on a pseudo-terminal, `^C` typed on it sends the
terminal's SIGINT, and the command must stop the daemon's work, keep nothing, and exit 130."""

from __future__ import annotations

import json
import os
import pty
import select
import signal
import time
from pathlib import Path

from .test_cli import SCRIPT, Cli, env_for

CTRL_C = b"\x03"


def big_claude_code_session(path: Path, pairs: int) -> Path:
    """A long Claude Code session (one user and one assistant line per exchange), big enough
    that its import is still running when the ^C arrives."""
    with path.open("w") as out:
        for i in range(pairs):
            user = {"role": "user", "content": f"question {i}: " + "why " * 50}
            answer = [{"type": "text", "text": f"answer {i}: " + "because " * 50}]
            line = {"type": "user", "sessionId": "long", "uuid": f"u{i}", "message": user}
            out.write(json.dumps(line) + "\n")
            message = {"id": f"msg_{i}", "role": "assistant", "model": "m", "content": answer}
            line = {"type": "assistant", "sessionId": "long", "uuid": f"a{i}", "message": message}
            out.write(json.dumps(line) + "\n")
    return path


def run_on_a_terminal(
    argv: list[str], env: dict[str, str], cwd: Path, press_when: bytes
) -> tuple[int, str]:
    """Run `argv` with a pty as its controlling terminal; type ^C once `press_when` shows;
    return (exit code, everything it printed)."""
    pid, fd = pty.fork()
    if pid == 0:  # the child: the pty is its terminal, it is the foreground process group
        # as a shell gives a foreground command: a suite run as a background job (`make test &`)
        # has SIGINT ignored, which exec passes on, and Python then leaves ^C ignored
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.chdir(cwd)
        os.execve(argv[0], argv, env)
    seen = b""
    pressed = False
    deadline = time.monotonic() + 300
    try:
        while time.monotonic() < deadline:
            ready, _, _ = select.select([fd], [], [], 1.0)
            if not ready:
                continue
            try:
                chunk = os.read(fd, 4096)
            except OSError:  # EIO: the child closed the terminal
                break
            if not chunk:
                break
            seen += chunk
            if not pressed and press_when in seen:
                os.write(fd, CTRL_C)
                pressed = True
    finally:
        os.close(fd)
    _, status = os.waitpid(pid, 0)
    assert pressed, seen.decode(errors="replace")
    return os.waitstatus_to_exitcode(status), seen.decode(errors="replace")


def test_ctrl_c_during_an_import_keeps_nothing(tmp_path: Path) -> None:
    transcript = big_claude_code_session(tmp_path / "long.jsonl", 60_000)
    data = tmp_path / "data"
    code, shown = run_on_a_terminal(
        [SCRIPT, "import", str(transcript)], env_for(data), tmp_path, press_when=b"importing"
    )
    assert code == 130, shown
    assert "interrupted: nothing was imported" in shown
    assert "Traceback" not in shown
    listed = Cli(data, tmp_path)("sessions", "--json").stdout
    assert json.loads(listed)["sessions"] == []
    assert not [p for p in data.rglob("*") if p.is_file() and p.suffix == ".jsonl"]
