"""The `compactd` command as a user types it: every command run as a subprocess of the installed
console script against the real daemon it spawns, with the failures a new user met and the
exit codes they must give (0 done, 1 not good, 2 error, 130 interrupted)."""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from compactd.clients.cli import parse, parser
from compactd.clients.client import CompactdClient
from compactd.protocol.convert import unstructure

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

    def __call__(
        self, *args: str, code: int = 0, env: dict[str, str] | None = None
    ) -> subprocess.CompletedProcess[str]:
        done = subprocess.run(
            [SCRIPT, *args],
            capture_output=True,
            text=True,
            env={**env_for(self.data_dir), **(env or {})},
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


def command_options() -> Iterator[tuple[str, str, str | None]]:
    """(command, option, a value for it or None) of every option of every command but help
    and version: each is tried before the command word and after it."""
    _top, commands = parser()
    for name, p in commands.items():
        for action in p._actions:
            option = next((o for o in action.option_strings if o.startswith("--")), None)
            if option in (None, "--help", "--version"):
                continue
            if action.nargs == 0:
                yield name, option, None
            elif action.choices:
                yield name, option, str(next(iter(action.choices)))
            elif action.type in (int, float):
                yield name, option, "7"
            elif option == "--config":
                yield name, option, '{"a": 1}'
            elif option == "--listen":
                yield name, option, "127.0.0.1:0"
            else:
                yield name, option, "a=1"


def positionals(name: str) -> list[str]:
    return {"import": ["t.jsonl"], "demo": ["t.jsonl"], "replay": ["t.jsonl"]}.get(
        name, ["S"] if name in ("context", "render", "snip", "compact") else []
    )


@pytest.mark.parametrize(("name", "option", "value"), list(command_options()))
def test_every_option_works_before_and_after_its_command(
    name: str, option: str, value: str | None
) -> None:
    """What the README says: options go before or after the command — the command's own
    (`--window 64000 context S`) as well as the global ones."""
    given = [option] if value is None else [option, value]
    other = ["--to", "postgresql://h/d"] if name == "migrate" and option != "--to" else []
    if name == "migrate" and option == "--from":
        other = []
    after = parse([name, *positionals(name), *given, *other])
    before = parse([*given, name, *positionals(name), *other])
    assert vars(before) == vars(after)
    joined = parse([f"{option}={value}", name, *positionals(name), *other]) if value else before
    assert vars(joined) == vars(after)


@pytest.mark.parametrize(
    ("argv", "words"),
    [
        (["migrate", "--to", ""], "argument --to: the URL is empty"),
        (["migrate", "--from", " "], "argument --from: the URL is empty"),
        (["--window", "64000", "sessions"], "unrecognized arguments: --window 64000"),
        (["context", "S", "--window", "many"], "argument --window: invalid int value"),
        (["--bogus", "context", "S"], "unrecognized arguments: --bogus"),
        (["frobnicate"], "unknown command 'frobnicate'"),
    ],
)
def test_a_bad_option_is_one_line_and_exit_2(
    argv: list[str], words: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exited:
        parse(argv)
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1 and words in err and "-h` lists the options" in err, err


def test_migrate_to_an_unset_variable_is_one_line(cli: Cli) -> None:
    """`migrate --to "$COMPACTD_STORE"` with the variable unset: one line, exit 2 (it was an
    AttributeError and exit 1), nothing written."""
    done = cli("migrate", "--to", "", code=2)
    assert done.stderr.startswith("compactd migrate: error: argument --to: the URL is empty")
    assert len(done.stderr.splitlines()) == 1 and done.stdout == ""


def test_a_commands_option_before_it(cli: Cli, session: str) -> None:
    measured = json.loads(cli("--window", "64000", "context", session, "--json").stdout)
    assert measured["window"] == 64_000


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


def test_sessions_and_context_answer_as_a_daemon_does_without_starting_one(
    cli: Cli, session: str
) -> None:
    """The read-only commands read the store in their own process (a daemon's start cost
    1.3 s of CPU per look): no daemon is started, and what they print is what a daemon over
    the same data dir answers (`session/list`, `context/measure`)."""
    listed = cli("-v", "sessions", "--json")
    measured = cli("-v", "context", session[:8], "--window", "64000", "--json")
    for done in (listed, measured):
        assert "daemon started" not in done.stderr, done.stderr

    async def ask() -> tuple[dict[str, Any], dict[str, Any]]:
        async with await CompactdClient.spawn(
            data_dir=str(cli.data_dir), args=["--no-idle-work"]
        ) as daemon:
            sessions = unstructure(await daemon.list_sessions())
            return sessions, unstructure(await daemon.measure(session, window=64_000))

    sessions, measure = asyncio.run(ask())
    assert json.loads(measured.stdout) == measure
    local = json.loads(listed.stdout)["sessions"]
    assert [{**s, "loaded": False} for s in local] == [
        {**s, "loaded": False} for s in sessions["sessions"]
    ]


# ---- session commands ----------------------------------------------------------------------


def test_context_by_prefix(cli: Cli, session: str) -> None:
    assert "tokens" in cli("context", session[:8], "--window", "200000").stdout
    assert "no session" in cli("context", "zzzz", code=2).stderr
    cli("import", str(SMALL), "--new")  # a second session, whichever tests ran before
    assert "give more of the id" in cli("context", "", code=2).stderr  # every id starts so


def test_render_json_and_typed_results(cli: Cli, session: str) -> None:
    out = json.loads(cli("render", session, "--window", "64000", "--cascade", "--json").stdout)
    assert {"request", "tokens", "events"} <= set(out)
    assert out["tokens"]["total"] <= out["tokens"]["limit"]


def test_render_over_the_limit_warns_and_fails(cli: Cli, session: str) -> None:
    done = cli("render", session, "--window", "100", code=1)
    assert "over the limit" in done.stderr and "--cascade" in done.stderr


def test_an_unknown_model_says_which_window_it_assumed(cli: Cli, session: str) -> None:
    """The warning names the window and the output reserve the panel shows, and the flags
    that say otherwise."""
    done = cli("context", session, "--model", "my-own-model")
    assert "unknown model 'my-own-model'" in done.stderr and "200,000-token window" in done.stderr
    reserve = next(line for line in done.stdout.splitlines() if "Output reserve" in line).split()
    assert f"a {reserve[3]}-token output reserve" in done.stderr, (reserve, done.stderr)
    assert "(--window and --max-output-tokens say otherwise)" in done.stderr


def test_an_over_full_panel_says_by_how_much(cli: Cli, session: str) -> None:
    """No negative free space: the panel says by how many tokens the request is over its
    limit, and the grid shows what fills it."""
    measured = json.loads(cli("context", session, "--window", "2000", "--json").stdout)
    over = measured["total"] - measured["limit"]
    assert over > 0
    panel = cli("context", session, "--window", "2000").stdout
    assert "Free space" not in panel and "-" + f"{over:,}" not in panel
    (row,) = [line for line in panel.splitlines() if "Over the limit by" in line]
    assert row.split()[5] == f"{over:,}", row
    assert f"The request is {over:,} tokens over its limit of {measured['limit']:,}" in panel
    assert "of its limit: a render with the cascade compacts it" in " ".join(panel.split())
    grid = "".join(panel.splitlines()[1:11])
    assert "⛝" in grid  # the output reserve has its cells: the grid is scaled to what fills it


def test_compact_with_config_from_the_command_line(cli: Cli) -> None:
    sid = cli("import", "--new", str(SMALL)).stdout.strip()
    # the defaults keep both turns of this session: the checkpoint cuts inside the latest
    inside = cli("compact", sid, "--window", "32000", "keep", "x", "--summary-provider", "digest")
    assert "; kept the request of the latest complete turn and its newest" in inside.stdout
    sid = cli("import", "--new", str(SMALL)).stdout.strip()
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


def data_bytes(data_dir: Path) -> dict[str, bytes]:
    """Every file under the data dir, by its path: what a command that writes nothing keeps."""
    return {
        str(f.relative_to(data_dir)): f.read_bytes() for f in data_dir.rglob("*") if f.is_file()
    }


def test_a_dry_run_writes_nothing(tmp_path: Path) -> None:
    """`render --cascade --dry-run` and `context --cascade --dry-run` on a session the cascade
    summarizes and that has been idle past its idle threshold: what the cascade would do is
    shown, the data dir's bytes stay as they were (the idle work a first use does is not
    done either); the same render without `--dry-run` writes."""
    cli = Cli(tmp_path / "data", tmp_path)
    sid = cli("import", str(SMALL)).stdout.strip()
    time.sleep(1.1)  # idle past `idleSeconds=1`
    cascade = ["--window", "6000", "--cascade", "--summary-provider", "digest"]
    cascade += ["--set", "idleSeconds=1"]
    before = data_bytes(cli.data_dir)
    cli("context", sid, "--set", "idleSeconds=1")
    preview = cli("render", sid, *cascade, "--dry-run")
    assert "a preview: nothing was written" in preview.stdout
    assert "✓ summary: " in preview.stdout, preview.stdout
    panel = cli("context", sid, *cascade, "--dry-run")
    assert "as a preview: nothing was written" in panel.stdout
    assert "✓ summary: " in panel.stdout and "after the cascade" in panel.stdout
    assert data_bytes(cli.data_dir) == before
    done = cli("render", sid, *cascade)
    assert "preview" not in done.stdout and "✓ summary: " in done.stdout
    assert data_bytes(cli.data_dir) != before


def test_snip_and_compact_that_change_nothing_exit_alike(cli: Cli) -> None:
    """Exit 1 when the command changed nothing (a snip already under its target, a compact
    with nothing to summarize), 0 when it did."""
    chat = cli.cwd / "chat.json"  # your own agent's log: ten turns of plain talk
    turns = [
        {"role": role, "content": f"{role} {t}: " + "words of the conversation " * 150}
        for t in range(10)
        for role in ("user", "assistant")
    ]
    chat.write_text(json.dumps(turns))
    sid = cli("import", str(chat)).stdout.strip()
    assert cli("snip", sid, "--target", "1000000", code=1).stdout.startswith("nothing snipped")
    short = cli(
        "compact", sid, "--set", "summaryKeepTurns=20", "--summary-provider", "digest", code=1
    )
    assert short.stdout.startswith("not compacted: short history")
    assert cli("snip", sid, "--target", "3000").stdout.startswith("snipped")


def test_compact_without_a_provider_names_the_option(cli: Cli, session: str) -> None:
    done = cli("compact", session, code=1)
    assert "no summary provider is configured" in done.stdout
    assert "--summary-provider digest|anthropic|client" in done.stdout


def test_an_anthropic_key_makes_anthropic_the_default_provider(tmp_path: Path) -> None:
    """With ANTHROPIC_API_KEY set and no provider named, `compact` asks Anthropic (here the
    loopback fake through the real SDK)."""
    from tests.support.fake_anthropic import FakeAnthropicProcess

    cli = Cli(tmp_path / "data", tmp_path)
    sid = cli("import", str(SMALL)).stdout.strip()
    compact = ("compact", sid, "--window", "32000", "--set", "summaryKeepTurns=1", "--json")
    with FakeAnthropicProcess() as fake:
        key = {"ANTHROPIC_API_KEY": "test-key", "ANTHROPIC_BASE_URL": fake.base_url}
        done = json.loads(cli(*compact, env=key).stdout)
        asked = [r for r in fake.requests() if r["path"].endswith("/messages")]
    assert done["applied"] is True and done["provider"] == "anthropic"
    assert asked, "the summary was not asked of Anthropic"
    # a provider named (the option or the variable) still wins over the key
    named = {**key, "COMPACTD_SUMMARY_PROVIDER": "digest"}
    again = cli("import", "--new", str(SMALL)).stdout.strip()
    assert json.loads(cli(*compact[:1], again, *compact[2:], env=named).stdout)["provider"] == (
        "digest"
    )


def test_compact_over_its_call_bound_says_what_to_do(cli: Cli) -> None:
    """A range that needs more summary calls than `summaryMaxCalls` allows fails before the
    first call — a compact that did nothing (exit 1) — and the CLI names the two ways out."""
    sid = cli("import", "--new", str(SMALL)).stdout.strip()
    bound = ["--set", "summaryInputMaxTokens=2000", "--set", "summaryMaxCalls=1"]
    done = cli(
        "compact",
        sid,
        *bound,
        "--set",
        "summaryKeepTurns=1",
        "--summary-provider",
        "digest",
        code=1,
    )
    assert "more than summaryMaxCalls (1); the provider was not called" in done.stdout
    assert f"compactd render {sid} --cascade` runs the cheaper tiers first" in done.stderr
    assert "--set summaryMaxCalls=N" in done.stderr


# ---- replay --------------------------------------------------------------------------------


def test_replay_json_and_plot(cli: Cli) -> None:
    plot = cli.cwd / "swe.png"
    done = cli("-q", "replay", str(SWE), "--window", "40000", "--json", "--plot", str(plot))
    report = json.loads(done.stdout)
    assert set(report["totals"]) == {
        "compactd",
        "baseline",
        "recorded",
        "codex",
        "opencode",
        "claude-code",
        "server",
    }
    assert plot.read_bytes()[:4] == b"\x89PNG"


def test_a_replay_where_requests_cannot_fit_is_not_good_and_says_why(cli: Cli) -> None:
    """At a 16K window the session's own system prompt (15K) leaves no room: every request
    cannot fit, which is exit 1 with one line saying why, the report still printed."""
    done = cli("-q", "replay", str(SMALL), "--window", "16000", code=1)
    assert "requests that cannot fit" in done.stdout
    [why] = done.stderr.strip().splitlines()
    assert why.startswith("compactd: 170 of 170 requests cannot fit the limit of 12,000 tokens")
    assert "the system prompt alone is 15,070 tokens" in why, why


def test_the_replay_table_fits_80_columns_with_its_savings(cli: Cli) -> None:
    """Every line of the report (steps too) within 80 columns, no header cut, the savings
    against no management and the recorded run as the JSON's costs give them, and each term
    explained in `replay -h`."""
    args = ("-q", "replay", str(SMALL), "--window", "48000")
    report = json.loads(cli(*args, "--json").stdout)
    text = cli(*args, "--steps", env={"COLUMNS": "80"}).stdout
    assert max(len(line) for line in text.splitlines()) <= 80
    assert "…" not in text
    costs = {name: t["cost"] for name, t in report["totals"].items()}
    saved = f"{1 - costs['compactd'] / costs['baseline']:.1%}"
    row = next(line for line in text.splitlines() if line.startswith("saved vs no management"))
    assert row.split()[4] == saved, row
    row = next(line for line in text.splitlines() if line.startswith("saved vs the recorded"))
    assert row.split()[5] == f"{1 - costs['compactd'] / costs['recorded']:.1%}", row
    assert "cost (input-token eq.)" in text and "no management" in text
    explained = cli("replay", "-h", env={"COLUMNS": "80"}).stdout
    for term in ("input-token equivalents", "cache rewrites", "over the limit", "unsummarized"):
        assert term in explained
    assert max(len(line) for line in explained.splitlines()) <= 80


def test_a_plot_into_a_missing_folder_is_one_line_before_the_replay(cli: Cli) -> None:
    done = cli("replay", str(SMALL), "--plot", "no/such/folder/replay.png", code=2)
    assert done.stderr.strip().splitlines() == [
        "compactd: --plot no/such/folder/replay.png: the folder 'no/such/folder' does not exist"
    ]
    assert done.stdout == ""  # no report: the replay did not run (it used to, then fail)


def test_replay_with_a_failing_provider_says_so_and_fails(cli: Cli) -> None:
    # at 32K the replay summarizes (the provider has no key: every summary fails)
    done = cli("replay", str(SMALL), "--window", "32000", "--summary-provider", "anthropic", code=1)
    assert "summary failed" in done.stderr and "API key" in done.stderr
    assert "failed" in done.stdout  # the table's column


def test_ctrl_c_exits_130_without_a_traceback(cli: Cli) -> None:
    proc = subprocess.Popen(
        [SCRIPT, "-v", "replay", str(SMALL), "--window", "48000"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env_for(cli.data_dir),
        # SIGINT as a foreground command has it (a suite run as a background job has it
        # ignored, and the child would inherit that)
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
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


def test_advice_to_install_fits_how_compactd_was_installed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Under pipx (its venv holds `pipx_metadata.json`) a missing package is added with
    `pipx inject compactd`; elsewhere with this interpreter's own pip — never `pip install
    '.[plot]'`, which only works from a clone and not at all under pipx."""
    from compactd.clients.replay import plot_needs
    from compactd.context.errors import StoreFailure
    from compactd.context.stores import open_store

    from compactd import install_advice

    here = plot_needs()
    assert here == f"needs matplotlib: {sys.executable} -m pip install 'matplotlib>=3.9'"
    pipx_venv = tmp_path / "pipx/venvs/compactd"
    pipx_venv.mkdir(parents=True)
    (pipx_venv / "pipx_metadata.json").write_text("{}")
    monkeypatch.setattr(sys, "prefix", str(pipx_venv))
    assert plot_needs() == "needs matplotlib: pipx inject compactd 'matplotlib>=3.9'"
    assert install_advice("psycopg-pool") == "pipx inject compactd psycopg-pool"
    monkeypatch.setitem(sys.modules, "compactd.context.stores.postgres", None)  # not installed
    with pytest.raises(StoreFailure, match=r"pipx inject compactd 'psycopg\[binary\]>=3.2'"):
        open_store("postgresql://db/agents", None)


def test_the_install_lines_say_what_works() -> None:
    readme = (ROOT / "README.md").read_text()
    assert ".venv/bin/compactd" in readme and "pipx install ." in readme
    for source in (
        ROOT / "README.md",
        ROOT / "clients/node/src/command.ts",
        ROOT / "clients/replay.py",
    ):
        assert "pip install compactd" not in source.read_text(), source
    node = (ROOT / "clients/node/README.md").read_text()
    example = node.split("```js\n", 1)[1].split("```", 1)[0]
    imported = set(re.findall(r'from "((?:@[\w-]+/)?[\w-]+)"', example)) - {"@compactd/client"}
    assert imported == {"@anthropic-ai/sdk"}, imported
    installs = [line for line in node.splitlines() if line.startswith("npm install ")]
    for package in imported:  # what the example imports, the README says to install
        assert any(package in line.split("#")[0] for line in installs), (package, installs)
    assert "rm -rf $(RUN_DATA)" in (ROOT / "Makefile").read_text()  # make run: the same each time
