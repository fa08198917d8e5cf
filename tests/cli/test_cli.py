"""The `compactd` command as a user types it: every command run as a subprocess of the installed
console script against the real daemon it spawns, with the failures a new user met and the
exit codes they must give (0 done, 1 not good, 2 error, 130 interrupted)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from compactd.clients.cli import parser

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = str(Path(sys.executable).with_name("compactd"))
TRANSCRIPTS = ROOT / "tests/data/transcripts"
SMALL = TRANSCRIPTS / "claude-code/fe5e1c67-53e7-4862-81ae-d0e013e3270b.jsonl"
SUBAGENT = (
    TRANSCRIPTS
    / "claude-code/64da7265-8f07-4967-b79f-0ae374c13330/subagents/agent-a29edc699187686ae.jsonl"
)
SWE = TRANSCRIPTS / "swe-agent/pydicom__pydicom-1458.traj"


def env_for(data_dir: Path) -> dict[str, str]:
    """No provider, no key, and a base URL nothing listens on: nothing leaves the machine."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ANTHROPIC_", "COMPACTD_"))}
    env["COMPACTD_DATA_DIR"] = str(data_dir)
    env["ANTHROPIC_BASE_URL"] = "http://127.0.0.1:9"
    return env


class Cli:
    """Runs `compactd ARGS` in a data dir of its own."""

    def __init__(self, data_dir: Path, cwd: Path) -> None:
        self.data_dir = data_dir
        self.cwd = cwd

    def __call__(self, *args: str, code: int = 0) -> subprocess.CompletedProcess[str]:
        done = subprocess.run(
            [SCRIPT, *args],
            capture_output=True,
            text=True,
            env=env_for(self.data_dir),
            cwd=self.cwd,
            timeout=300,
        )
        assert done.returncode == code, (args, done.returncode, done.stdout, done.stderr)
        assert "Traceback" not in done.stderr, done.stderr
        return done


@pytest.fixture(scope="module")
def cli(tmp_path_factory: pytest.TempPathFactory) -> Cli:
    return Cli(tmp_path_factory.mktemp("cli-data"), tmp_path_factory.mktemp("cli-cwd"))


@pytest.fixture(scope="module")
def session(cli: Cli) -> str:
    """The small Claude Code transcript, imported once for the read-only commands."""
    return cli("import", str(SMALL)).stdout.strip()


def parsers() -> Iterator[tuple[str, object]]:
    top, commands = parser()
    yield "compactd", top
    yield from commands.items()


# ---- the command line itself ---------------------------------------------------------------


def test_version_and_help(cli: Cli) -> None:
    assert cli("--version").stdout.startswith("compactd 0.")
    top = cli("--help").stdout
    for command in ("serve", "import", "sessions", "context", "render", "compact", "replay"):
        assert command in top
    assert "--summary-provider" in cli("compact", "-h").stdout
    cli(code=2)  # no command
    assert "unknown command" in cli("frobnicate", code=2).stderr


@pytest.mark.parametrize(("name", "p"), list(parsers()), ids=[name for name, _ in parsers()])
def test_every_option_has_help(name: str, p: object) -> None:
    actions = p._actions  # type: ignore[attr-defined]
    missing = [a.option_strings or a.dest for a in actions if a.dest != "command" and not a.help]
    assert missing == [], f"{name}: options without help"


def test_serve_accepts_stdio_as_lsp_clients_pass_it(cli: Cli) -> None:
    proc = subprocess.Popen(
        [SCRIPT, "serve", "--stdio"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=env_for(cli.data_dir),
    )
    assert proc.stdin is not None and proc.stdout is not None

    def send(message: dict[str, object]) -> None:
        body = json.dumps(message).encode()
        proc.stdin.write(b"Content-Length: %d\r\n\r\n%s" % (len(body), body))  # type: ignore[union-attr]
        proc.stdin.flush()  # type: ignore[union-attr]

    send({"jsonrpc": "2.0", "id": 1, "method": "daemon/status", "params": {}})
    length = int(proc.stdout.readline().split(b":")[1])
    proc.stdout.readline()
    answer = json.loads(proc.stdout.read(length))
    assert answer["result"]["version"]
    send({"jsonrpc": "2.0", "id": 2, "method": "shutdown"})
    send({"jsonrpc": "2.0", "method": "exit"})
    _out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0 and b"Traceback" not in err


def test_schema(cli: Cli) -> None:
    assert "session/open" in json.loads(cli("schema").stdout)["methods"]


# ---- import and sessions -------------------------------------------------------------------


def test_reimport_returns_the_existing_session_unless_new(cli: Cli, session: str) -> None:
    again = cli("import", str(SMALL))
    assert again.stdout.strip() == session
    assert "already imported" in again.stderr and "--new" in again.stderr
    fresh = cli("import", "--new", str(SMALL)).stdout.strip()
    assert fresh and fresh != session


def test_progress_on_a_terminal(cli: Cli) -> None:
    """`--color` makes stderr a terminal for rich: the spinner is drawn from `$/progress`."""
    done = cli("--color", "import", "--new", str(SWE))
    assert "importing" in done.stderr


def test_an_import_that_yields_an_empty_session_warns(cli: Cli) -> None:
    done = cli("-q", "import", str(SUBAGENT))  # warned even with -q
    assert done.stdout.strip()
    assert "the session is empty" in done.stderr


def test_import_of_a_missing_file_is_one_line(cli: Cli) -> None:
    done = cli("import", str(cli.cwd / "nope.jsonl"), code=2)
    assert done.stderr.startswith("compactd: ") and len(done.stderr.splitlines()) == 1


def test_sessions_newest_first_with_what_they_hold(cli: Cli, session: str) -> None:
    listed = json.loads(cli("sessions", "--json").stdout)["sessions"]
    modified = [s["modified"] for s in listed]
    assert modified == sorted(modified, reverse=True)
    (mine,) = [s for s in listed if s["sessionId"] == session]
    assert mine["source"] == "claude-code" and mine["title"] and mine["turns"] >= 1
    assert mine["tokens"] > 1000
    table = cli("sessions").stdout
    assert session in table and mine["title"][:20] in table and f"{mine['tokens']:,}" in table


# ---- session commands ----------------------------------------------------------------------


def test_context_by_prefix(cli: Cli, session: str) -> None:
    assert "tokens" in cli("context", session[:8], "--window", "200000").stdout
    assert "no session" in cli("context", "zzzz", code=2).stderr
    assert "give more of the id" in cli("context", "", code=2).stderr  # every id starts so


def test_render_json_and_typed_results(cli: Cli, session: str) -> None:
    out = json.loads(cli("render", session, "--window", "64000", "--cascade", "--json").stdout)
    assert {"request", "tokens", "events"} <= set(out)
    assert out["tokens"]["total"] <= out["tokens"]["limit"]


def test_render_over_the_limit_warns_and_fails(cli: Cli, session: str) -> None:
    done = cli("render", session, "--window", "100", code=1)
    assert "over the limit" in done.stderr and "--cascade" in done.stderr


def test_an_unknown_model_says_which_window_it_assumed(cli: Cli, session: str) -> None:
    done = cli("context", session, "--model", "my-own-model")
    assert "unknown model 'my-own-model'" in done.stderr and "200,000-token window" in done.stderr


def test_compact_with_config_from_the_command_line(cli: Cli) -> None:
    sid = cli("import", "--new", str(SMALL)).stdout.strip()
    short = cli(
        "compact", sid, "--window", "32000", "keep", "x", "--summary-provider", "digest", code=1
    )
    assert "short history" in short.stdout  # the defaults keep both turns of this session
    # options before, between and after the free text; --set after the command
    done = cli(
        "--summary-provider",
        "digest",
        "compact",
        sid,
        "keep",
        "--window",
        "32000",
        "the plan",
        "--set",
        "summaryKeepTurns=1",
    )
    assert done.stdout.startswith("compacted:"), done.stdout


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (["--set", "cascadeThresold=0.5"], "did you mean 'cascadeThreshold'"),
        (["--set", "cascadeThreshold=1.5"], "'cascadeThreshold' must be in (0, 1]"),
        (["--set", "summaryKeepTurns"], "expected KEY=VALUE"),
        (["--config", "notjson"], "neither a JSON object nor a readable file"),
        (["--config", "[1]"], "JSON object"),
    ],
)
def test_bad_config_is_one_line_and_exit_2(
    cli: Cli, session: str, args: list[str], words: str
) -> None:
    done = cli("context", session, *args, code=2)
    assert words in done.stderr


def test_config_from_a_file(cli: Cli, session: str) -> None:
    path = cli.cwd / "config.json"
    path.write_text(json.dumps({"cascadeThreshold": 0.5, "cascadeTarget": 0.4}))
    measured = json.loads(cli("context", session, "--config", str(path), "--json").stdout)
    assert measured["threshold"] == int(0.5 * measured["limit"])


def test_snip(cli: Cli) -> None:
    sid = cli("import", "--new", str(SWE)).stdout.strip()
    done = cli("snip", sid, "--target", "2000")
    assert done.stdout.startswith(("snipped", "nothing snipped"))


# ---- replay --------------------------------------------------------------------------------


def test_replay_json_and_plot(cli: Cli) -> None:
    plot = cli.cwd / "swe.png"
    done = cli("-q", "replay", str(SWE), "--window", "16000", "--json", "--plot", str(plot))
    report = json.loads(done.stdout)
    assert set(report["totals"]) == {"compactd", "baseline", "recorded"}
    assert plot.read_bytes()[:4] == b"\x89PNG"


def test_replay_with_a_failing_provider_says_so_and_fails(cli: Cli) -> None:
    done = cli("replay", str(SMALL), "--window", "48000", "--summary-provider", "anthropic", code=1)
    assert "summary failed" in done.stderr and "API key" in done.stderr
    assert "failed" in done.stdout  # the table's column


def test_ctrl_c_exits_130_without_a_traceback(cli: Cli) -> None:
    proc = subprocess.Popen(
        [SCRIPT, "-v", "replay", str(SMALL), "--window", "48000"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env_for(cli.data_dir),
    )
    assert proc.stderr is not None
    assert "daemon started" in proc.stderr.readline()  # the CLI is inside its call
    proc.send_signal(signal.SIGINT)
    _out, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err
    assert "interrupted" in err and "Traceback" not in err


async def test_import_reports_progress_on_the_callers_token(cli: Cli) -> None:
    """What the CLI's spinner is fed: `$/progress` begin, report, end on the given token."""
    from compactd.clients.client import CompactdClient

    heard: list[dict[str, object]] = []
    async with await CompactdClient.spawn(data_dir=str(cli.data_dir)) as daemon:
        daemon.on_notification("$/progress", heard.append)
        await daemon.import_transcript(str(SWE), new=True, work_done_token="tok-1")
        await daemon.status()  # notifications sent before the answer have been read by now
    kinds = [n["value"]["kind"] for n in heard if n["token"] == "tok-1"]  # type: ignore[index]
    assert kinds == ["begin", "report", "end"]


def test_version_and_store_work_on_every_command(cli: Cli) -> None:
    """`serve --version` answers like `--version`; `--store` is a global option, passed to
    the daemon a client command spawns (an unsupported URL is refused there, one line)."""
    version = cli("--version").stdout
    assert cli("serve", "--version").stdout == version == cli("sessions", "--version").stdout
    done = cli("sessions", "--store", "mysql://db/agents", code=2)
    assert "mysql://db/agents" in done.stderr and "postgresql://" in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1


def test_the_install_lines_say_what_works() -> None:
    readme = (ROOT / "README.md").read_text()
    assert ".venv/bin/compactd" in readme and "pipx install ." in readme
    for source in (
        ROOT / "README.md",
        ROOT / "clients/node/src/command.ts",
        ROOT / "clients/replay.py",
    ):
        assert "pip install compactd" not in source.read_text(), source
    assert "rm -rf $(RUN_DATA)" in (ROOT / "Makefile").read_text()  # make run: the same each time
