"""The `compactd` command's client side. Every subcommand that changes or computes something
talks to a daemon it spawns, through the Python client over stdio — so the CLI exercises the
real protocol; the read-only ones (`sessions`, `context` without `--cascade`) are given a
client that reads the store in this process (`compactd.main` passes it: this module imports
only `protocol`), so a look costs what Python's start and the look do, not a daemon's start.

Every option works before or after the command, and options and free text mix in any order;
a usage error is one line. Exit codes:
0 done, 1 done but not good (over the limit, nothing compacted or snipped, summaries
failed), 2 an error (bad input, unknown session, bad config), 3 the daemon died, 130
interrupted.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import functools
import os
import sys
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn, TypeVar

import orjson

from ..protocol.convert import structure, unstructure
from ..protocol.types import (
    CompactionEvent,
    ImportResult,
    ProxiedSession,
    RenderResult,
    SentRequest,
)
from .errors import RpcError

if TYPE_CHECKING:
    from rich.console import Console

    from .client import CompactdClient

T = TypeVar("T")
Command = Callable[[argparse.Namespace, "CompactdClient"], Awaitable[int]]
Connect = Callable[[argparse.Namespace], Any]
"""A client for a read-only command: what it calls of `CompactdClient` (`list_sessions`,
`measure`, `close`), answered without a daemon; an error is an `RpcError`."""

EXIT_OK, EXIT_NOT_GOOD, EXIT_ERROR, EXIT_DAEMON, EXIT_INTERRUPTED = 0, 1, 2, 3, 130
PROVIDERS = ("anthropic", "client", "digest")
GLOBAL_DEFAULTS: dict[str, Any] = {
    "data_dir": None,
    "store": None,
    "summary_provider": None,
    "summary_model": None,
    "set": [],
    "config": None,
    "verbose": 0,
    "quiet": False,
    "color": None,
}
SHOWN_WARNINGS = 5
CANCEL_WAIT_SECONDS = 30.0  # a second Ctrl-C does not wait


class Parser(argparse.ArgumentParser):
    """argparse, with a usage error in one line (what is wrong, and where help is) instead of
    the whole usage block above it."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (`{self.prog} -h` lists the options)\n")


class Interrupted(Exception):
    """Ctrl-C stopped the command after the daemon stopped its work; says what is left."""


class UsageError(Exception):
    """A mistake in the command line the parser could not see (a bad `--config`, an unknown
    session prefix): printed as one line, exit 2."""


# ---- output helpers ---------------------------------------------------------------------------


def _err(ns: argparse.Namespace) -> Console:
    from rich.console import Console  # here: `serve` and `proxy` parse with this module

    return Console(stderr=True, force_terminal=ns.color, highlight=False, soft_wrap=True)


def _warn(ns: argparse.Namespace, warnings: list[str], always: bool = False) -> None:
    """Warnings on stderr: the first few unless `-v`, none with `-q` (unless `always`)."""
    from rich.markup import escape

    if ns.quiet and not always:
        return
    shown = warnings if ns.verbose else warnings[:SHOWN_WARNINGS]
    console = _err(ns)
    for warning in shown:
        console.print(f"[yellow]warning:[/yellow] {escape(warning)}")
    if len(shown) < len(warnings):
        console.print(f"… {len(warnings) - len(shown)} more warning(s) (-v shows them)")


# the daemon's words for request parameters, and the flags that set them here
CLI_WORDS = {"window and maxOutputTokens": "--window and --max-output-tokens"}


def in_cli_words(warnings: list[str]) -> list[str]:
    """The daemon's warnings with its parameter names as this command's flags."""
    out = []
    for warning in warnings:
        for wire, flags in CLI_WORDS.items():
            warning = warning.replace(wire, flags)
        out.append(warning)
    return out


def _print_json(value: Any) -> None:
    sys.stdout.write(orjson.dumps(value, option=orjson.OPT_INDENT_2).decode() + "\n")


def _budget(ns: argparse.Namespace) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key in ("model", "window", "max_output_tokens"):
        value = getattr(ns, key, None)
        if value is not None:
            out[key] = value
    return out


@contextlib.asynccontextmanager
async def daemon_progress(
    ns: argparse.Namespace, client: CompactdClient, what: str
) -> AsyncIterator[str | None]:
    """A work-done token for one call, and a rich spinner on stderr fed by the daemon's
    `$/progress` for it (`None`, and nothing shown, with `-q`)."""
    console = _err(ns)
    if ns.quiet or not console.is_terminal:  # a log or a pipe gets no spinner frames
        yield None
        return
    import uuid

    from rich.markup import escape
    from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

    token = f"cli-{uuid.uuid4().hex[:12]}"
    with Progress(
        SpinnerColumn(),
        TextColumn("{task.description}"),
        TimeElapsedColumn(),
        console=console,
        transient=True,
    ) as bar:
        task = bar.add_task(what, total=None)

        def on_progress(params: dict[str, Any]) -> None:
            if params.get("token") != token:
                return
            value = params.get("value") or {}
            text = value.get("message") or value.get("title")
            if text and value.get("kind") != "end":
                bar.update(task, description=f"{what}: {escape(str(text))}")

        client.on_notification("$/progress", on_progress)
        yield token


# ---- commands ---------------------------------------------------------------------------------


async def cmd_import(ns: argparse.Namespace, client: CompactdClient) -> int:
    import asyncio

    from .client import AnsweredDespiteCancel

    try:
        async with daemon_progress(ns, client, f"importing {Path(ns.path).name}") as token:
            result = await client.import_transcript(ns.path, new=ns.new, work_done_token=token)
    except AnsweredDespiteCancel as late:  # Ctrl-C came after the daemon had written it
        done = structure(late.result, ImportResult, "session/import", check_depth=False)
        for sid in done.session_ids:
            print(sid)
        raise Interrupted("the import had already finished; its session(s) are kept") from None
    except asyncio.CancelledError:
        raise Interrupted("nothing was imported") from None
    for sid in result.session_ids:
        print(sid)
    if result.existing:
        _err(ns).print(
            f"already imported: {', '.join(result.existing)} (pass --new to import it again)"
        )
    empty = [w for w in result.warnings if "the session is empty" in w]
    _warn(ns, [w for w in result.warnings if w not in empty])
    _warn(ns, empty, always=True)
    return EXIT_OK


async def cmd_sessions(ns: argparse.Namespace, client: CompactdClient) -> int:
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    result = await client.list_sessions()  # the daemon sorts newest first
    if ns.json:
        _print_json(unstructure(result))
        return EXIT_OK
    if not result.sessions:
        _err(ns).print("no sessions yet: `compactd import TRANSCRIPT` makes one")
        return EXIT_OK
    proxied = any(info.proxied for info in result.sessions)
    columns = ["session", "source", "title", "turns", "tokens", "modified"]
    if proxied:  # what the proxy did: whose session, still managed or not, what it saved
        columns[2:2] = ["agent", "state", "saved"]
    table = Table(*columns, box=None)
    for info in result.sessions:
        title = info.title or ""
        row = [
            info.session_id,
            info.source or "live",
            escape(title if len(title) <= 48 else title[:47] + "…"),
            str(info.turns),
            f"{info.tokens:,}",
            dt.datetime.fromtimestamp(info.modified).strftime("%Y-%m-%d %H:%M"),
        ]
        if proxied:
            row[2:2] = _proxied_cells(info.proxied)
        table.add_row(*row)
    Console(force_terminal=ns.color, width=max(140, Console().width)).print(table)
    return EXIT_OK


def _proxied_cells(proxied: ProxiedSession | None) -> list[str]:
    """Agent, state and saving of a session the proxy relayed (blank for any other)."""
    from rich.markup import escape

    if proxied is None:
        return ["", "", ""]
    saved = f"{proxied.saved_input_tokens:,} tokens"
    if proxied.saved_usd is not None:
        saved += f" (${proxied.saved_usd:,.2f})"
    return [escape(proxied.agent or ""), proxied.state, saved]


def _sent_panel(ns: argparse.Namespace, sent: SentRequest) -> int:
    """A proxied session's last request as the proxy sent it: its model, window, system
    prompt and tools, and the provider's count beside compactd's estimate."""
    from rich.console import Console

    from .panel import build_panel

    data = unstructure(sent)
    if ns.json:
        _print_json({"source": "proxy", **data})
        return EXIT_OK
    console = Console(force_terminal=ns.color)
    when = dt.datetime.fromtimestamp(sent.at).strftime("%Y-%m-%d %H:%M:%S")
    title = f"Context of {ns.session}: the last request the proxy sent ({when}, {sent.model})"
    console.print(build_panel(data, title=title))
    if sent.reported is not None:
        off = (sent.total - sent.reported) / sent.reported if sent.reported else 0.0
        console.print(
            f"The provider counted {sent.reported:,} tokens; compactd estimated {sent.total:,} "
            f"({off:+.1%}).",
            highlight=False,
        )
    console.print(
        "[dim]`--window N` (or `--model M`) measures the session now, without the client's "
        "system prompt and tools.[/dim]",
        highlight=False,
    )
    return EXIT_OK


async def cmd_context(ns: argparse.Namespace, client: CompactdClient) -> int:
    from rich.console import Console

    from .panel import build_panel

    if ns.cascade:  # the panel of the request the cascade makes (written unless --dry-run)
        result = await _cascade_render(ns, client)
        _warn(ns, in_cli_words(result.warnings), always=True)
        if ns.json:
            _print_json(unstructure(result.tokens) | {"events": unstructure(result.events)})
            return EXIT_OK
        console = Console(force_terminal=ns.color)
        if ns.dry_run:
            console.print("[bold]The cascade, as a preview: nothing was written[/bold]")
        _print_events(console, result.events)
        title = f"\nContext of {ns.session} after the cascade"
        console.print(build_panel(unstructure(result.tokens), title=title))
        return EXIT_OK
    measure = await client.measure(ns.session, branch=ns.branch, **_budget(ns))
    if measure.sent is not None and not _budget(ns) and ns.branch is None:
        return _sent_panel(ns, measure.sent)
    _warn(ns, in_cli_words(measure.warnings), always=True)
    data = unstructure(measure)
    if ns.json:
        _print_json(data)
        return EXIT_OK
    Console(force_terminal=ns.color).print(build_panel(data, title=f"Context of {ns.session}"))
    return EXIT_OK


async def _cascade_render(ns: argparse.Namespace, client: CompactdClient) -> RenderResult:
    async with daemon_progress(ns, client, "rendering") as token:
        return await client.render(
            ns.session,
            branch=ns.branch,
            format=getattr(ns, "format", "anthropic"),
            cascade=ns.cascade,
            dry_run=ns.dry_run,
            work_done_token=token if ns.cascade else None,
            **_budget(ns),
        )


def _print_events(console: Console, events: list[CompactionEvent]) -> None:
    """One line per tier event: ✓ what it did (in a preview: would do), · why it did not."""
    from rich.markup import escape

    for event in events:
        mark = "✓" if event.applied else "·"
        console.print(
            f"{mark} {event.tier}: {escape(event.reason)} "
            f"({event.tokens_before:,} → {event.tokens_after:,})",
            highlight=False,
        )


async def cmd_render(ns: argparse.Namespace, client: CompactdClient) -> int:
    from rich.console import Console

    result = await _cascade_render(ns, client)
    _warn(ns, in_cli_words(result.warnings), always=True)
    tokens = result.tokens
    if ns.json:
        _print_json(unstructure(result))
    else:
        print(
            f"{len(result.request.get('messages', []))} messages, {tokens.total:,} tokens of "
            f"{tokens.limit:,} ({tokens.window:,} window − {tokens.output_reserve:,} "
            "output reserve)" + (" — a preview: nothing was written" if ns.dry_run else "")
        )
        _print_events(Console(soft_wrap=True, force_terminal=ns.color), result.events)
    if tokens.total > tokens.limit:
        _warn(
            ns,
            [
                f"the request is {tokens.total:,} tokens, over the limit of {tokens.limit:,} "
                f"({tokens.total / tokens.limit:.0%}); "
                + ("the cascade could not fit it" if ns.cascade else "--cascade compacts it")
            ],
            always=True,
        )
        return EXIT_NOT_GOOD
    return EXIT_OK


async def cmd_snip(ns: argparse.Namespace, client: CompactdClient) -> int:
    result = await client.snip(ns.session, ns.target, branch=ns.branch, **_budget(ns))
    if ns.json:
        _print_json(unstructure(result))
    else:
        print(
            f"{'snipped' if result.applied else 'nothing snipped'}: {result.reason} "
            f"({result.tokens_before:,} → {result.tokens_after:,} tokens)"
        )
    return EXIT_OK if result.applied else EXIT_NOT_GOOD  # as `compact`: nothing changed


async def cmd_compact(ns: argparse.Namespace, client: CompactdClient) -> int:
    instructions = " ".join(ns.instructions) or None
    try:
        async with daemon_progress(ns, client, "compacting") as token:
            result = await client.compact(
                ns.session, instructions, branch=ns.branch, work_done_token=token, **_budget(ns)
            )
    except RpcError as exc:
        if not over_call_limit(exc):
            raise
        print(f"compactd: {exc.message}", file=sys.stderr)
        print_call_limit_hint(ns.session)
        return EXIT_ERROR
    if ns.json:
        _print_json(unstructure(result))
    else:
        print(
            f"{'compacted' if result.applied else 'not compacted'}: {result.reason} "
            f"({result.tokens_before:,} → {result.tokens_after:,} tokens)"
        )
    if result.failure == "call_limit":
        print_call_limit_hint(ns.session)
    return EXIT_OK if result.applied else EXIT_NOT_GOOD


def print_call_limit_hint(session: str) -> None:
    """The two ways out of a summary that would need more calls than `summaryMaxCalls`."""
    print(
        f"compactd: `compactd render {session} --cascade` runs the cheaper tiers first "
        "(it clears old tool results), which leaves less to summarize; or allow more "
        "calls: --set summaryMaxCalls=N",
        file=sys.stderr,
    )


def over_call_limit(exc: RpcError) -> bool:
    """The summary would take more calls than `summaryMaxCalls` (a failure of its own, or
    the reason a `/compact` cannot fit)."""
    data = exc.data if isinstance(exc.data, dict) else {}
    events = [e for e in data.get("events") or [] if isinstance(e, dict)]
    return data.get("failure") == "call_limit" or any(
        (e.get("details") or {}).get("failure") == "call_limit" for e in events
    )


async def cmd_demo(ns: argparse.Namespace, client: CompactdClient) -> int:
    """`make run`: import a real transcript through the daemon, show its panel, then what the
    cascade would do to it in a smaller window (a preview, so a second run shows the same)."""
    from rich.console import Console

    from .panel import build_panel

    async with daemon_progress(ns, client, f"importing {Path(ns.path).name}") as token:
        result = await client.import_transcript(ns.path, work_done_token=token)
    console = Console(force_terminal=ns.color)
    count = len(result.session_ids)
    for i, sid in enumerate(result.session_ids):
        # named by the transcript, not by the id (new at each import): the same every time
        name = Path(ns.path).name + (f" ({i + 1} of {count})" if count > 1 else "")
        measure = await client.measure(sid, window=ns.window)
        console.print(build_panel(unstructure(measure), title=name))
        if ns.then_window:
            # a preview: the session stays as imported, so the demo shows the same every time
            out = await client.render(sid, window=ns.then_window, cascade=True, dry_run=True)
            console.print(
                f"\n[bold]The next request at a {ns.then_window:,}-token window[/bold] "
                "(a preview: nothing is written)"
            )
            _print_events(console, out.events)
            title = f"\n{name} after the cascade"
            console.print(build_panel(unstructure(out.tokens), title=title))
    return EXIT_OK


async def cmd_replay(ns: argparse.Namespace, client: CompactdClient) -> int:
    from .replay import run_replay

    async with daemon_progress(ns, client, f"replaying {Path(ns.path).name}") as token:
        return await run_replay(ns, client, token)


COMMANDS: dict[str, Command] = {
    "import": cmd_import,
    "sessions": cmd_sessions,
    "context": cmd_context,
    "render": cmd_render,
    "snip": cmd_snip,
    "compact": cmd_compact,
    "demo": cmd_demo,
    "replay": cmd_replay,
}
SESSION_COMMANDS = ("context", "render", "snip", "compact")
LAUNCHERS = ("claude", "codex")


# ---- the command line -------------------------------------------------------------------------


def _global_options(p: argparse.ArgumentParser, suppress: bool) -> None:
    """The options every command takes, before or after its name. After it they default to
    SUPPRESS so they never overwrite what was given before it."""
    default: Any = argparse.SUPPRESS if suppress else None
    p.add_argument(
        "--data-dir",
        default=default,
        metavar="DIR",
        help="where sessions live (default $COMPACTD_DATA_DIR or the platform's user data dir)",
    )
    p.add_argument(
        "--store",
        default=default,
        metavar="URL",
        help="where sessions live for a fleet of daemons: postgresql://… (default "
        "$COMPACTD_STORE, else the files in the data dir)",
    )
    p.add_argument(
        "--summary-provider",
        choices=PROVIDERS,
        default=default,
        help="who writes summaries: anthropic (needs ANTHROPIC_API_KEY), client, or digest "
        "(offline); default $COMPACTD_SUMMARY_PROVIDER, else anthropic when ANTHROPIC_API_KEY "
        "is set, else none (replay: digest)",
    )
    p.add_argument(
        "--summary-model",
        default=default,
        metavar="MODEL",
        help="the model summaries are written with (default $COMPACTD_SUMMARY_MODEL)",
    )
    p.add_argument(
        "--set",
        action="append",
        default=argparse.SUPPRESS if suppress else [],
        metavar="KEY=VALUE",
        help="a session config value (repeatable), e.g. --set summaryKeepTurns=1; VALUE is "
        "read as JSON when it parses, else as text (the keys: README, Configuration)",
    )
    p.add_argument(
        "--config",
        default=default,
        metavar="FILE|JSON",
        help="session config as a JSON object, inline or in a file; --set wins over it",
    )
    p.add_argument(
        "-v",
        "--verbose",
        action="count",
        default=argparse.SUPPRESS if suppress else 0,
        help="every warning; twice: the daemon's log too",
    )
    p.add_argument(
        "-q",
        "--quiet",
        action="store_true",
        default=argparse.SUPPRESS if suppress else False,
        help="no progress and no warnings that are only informative",
    )
    p.add_argument(
        "--color",
        action="store_true",
        default=default,
        help="force colour even when not on a terminal",
    )


def _session_args(p: argparse.ArgumentParser, budget: bool = True) -> None:
    p.add_argument("session", help="a session id, or any unique prefix of one")
    p.add_argument("--branch", help="the branch to use (default: the session's current)")
    if budget:
        p.add_argument("--model", help="model id: its window and output limit (default: 200K)")
        p.add_argument("--window", type=int, help="context window in tokens (overrides --model)")
        p.add_argument(
            "--max-output-tokens",
            type=int,
            dest="max_output_tokens",
            help="output reserve (default: min(model max, 20K, window/4))",
        )
    p.add_argument("--json", action="store_true", help="print the daemon's answer as JSON")


def _cascade_args(p: argparse.ArgumentParser, cascade: str) -> None:
    p.add_argument("--cascade", action="store_true", help=cascade)
    p.add_argument(
        "--dry-run",
        action="store_true",
        dest="dry_run",
        help="a preview: show what the cascade would do and write nothing (a summary is "
        "still asked of the summary provider)",
    )


def add_serve_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--stdio",
        action="store_true",
        help="talk JSON-RPC on stdin/stdout (the only transport; accepted as LSP clients pass it)",
    )
    parser.add_argument(
        "--no-idle-work",
        action="store_true",
        help="do no idle work and prepare no summaries in the background (the daemon of a "
        "CLI preview, which only looks)",
    )
    add_service_arguments(parser)


def add_service_arguments(parser: argparse.ArgumentParser) -> None:
    """What `serve` and `proxy` both run on: the store, idle work, summaries, the log."""
    parser.add_argument(
        "--idle-seconds",
        type=float,
        default=None,
        help="idle threshold for sessions without their own (default 5400)",
    )
    parser.add_argument(
        "--idle-check-seconds", type=float, default=30.0, help="how often idle timers are checked"
    )
    parser.add_argument(
        "--evict-after-seconds",
        type=float,
        default=600.0,
        help="how long an unused session stays in memory (its idle timer outlives it)",
    )
    parser.add_argument(
        "--summarize-timeout",
        type=float,
        default=120.0,
        help="seconds one summary may take before it counts as failed",
    )
    parser.add_argument(
        "--no-watch",
        action="store_true",
        help="do not watch the data dir for other daemons' appends",
    )
    parser.add_argument(
        "--log-level",
        default=None,
        help="daemon log level on stderr (default $COMPACTD_LOG_LEVEL or WARNING)",
    )


def add_proxy_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--listen",
        default="127.0.0.1:8788",
        metavar="HOST:PORT",
        help="where the proxy listens (default 127.0.0.1:8788; port 0 picks a free one)",
    )
    parser.add_argument(
        "--allow-remote",
        action="store_true",
        help="allow --listen on an address beyond loopback (the proxy relays API keys)",
    )
    parser.add_argument(
        "--anthropic-upstream",
        default="https://api.anthropic.com",
        metavar="URL",
        help="where Anthropic Messages requests go (default https://api.anthropic.com)",
    )
    parser.add_argument(
        "--openai-upstream",
        default="https://api.openai.com",
        metavar="URL",
        help="where OpenAI Responses / Chat Completions requests go (default "
        "https://api.openai.com)",
    )
    parser.add_argument(
        "--gemini-upstream",
        default="https://generativelanguage.googleapis.com",
        metavar="URL",
        help="where Gemini API requests go (default https://generativelanguage.googleapis.com)",
    )
    parser.add_argument(
        "--window",
        type=int,
        default=None,
        help="cap every request's context window at this many tokens (default: the model's)",
    )
    parser.add_argument(
        "--context-editing",
        choices=("auto", "server", "client"),
        default="auto",
        help="where old tool results are cleared on the Messages API: server (a context edit "
        "the upstream applies before the prompt reaches the model), client (in the body as "
        "sent: for an upstream that counts the body or drops the edits); auto (default): "
        "server for api.anthropic.com, client for any other upstream",
    )
    parser.add_argument(
        "--no-recall",
        action="store_true",
        help="do not offer the model compactd_recall (the proxy answers it by default)",
    )
    parser.add_argument(
        "--print-service",
        action="store_true",
        help="print a systemd user unit that keeps this proxy running (with these options) "
        "and how to install it, then exit",
    )
    parser.add_argument(
        "--no-stats",
        action="store_true",
        help="record nothing of the requests in the request log (`compactd stats` then has "
        "nothing new to show)",
    )
    parser.add_argument(
        "--upstream-idle-timeout",
        type=float,
        default=300.0,
        metavar="SECONDS",
        help="give up an upstream answer that falls silent this long once begun (a stream's "
        "events, a whole answer's body); the client gets the API's error (default 300)",
    )
    parser.add_argument(
        "--client-timeout",
        type=float,
        default=120.0,
        metavar="SECONDS",
        help="close a connection whose request headers, or refuse a request whose body, "
        "have not arrived in this long (default 120)",
    )


def _subparsers(top: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    common = Parser(add_help=False)
    _global_options(common, suppress=True)
    sub = top.add_subparsers(dest="command", metavar="COMMAND", title="commands")

    def add(name: str, text: str) -> argparse.ArgumentParser:
        command = sub.add_parser(name, help=text, description=text, parents=[common])
        command.add_argument("--version", action=VersionAction)
        return command

    out: dict[str, argparse.ArgumentParser] = {}
    out["serve"] = p = add("serve", "run the daemon on stdio (JSON-RPC, LSP framing)")
    add_serve_arguments(p)
    out["proxy"] = p = add(
        "proxy",
        "run an HTTP proxy in front of the provider's API: point Claude Code "
        "(ANTHROPIC_BASE_URL) or Codex (base_url) at it",
    )
    add_service_arguments(p)
    add_proxy_arguments(p)
    out["schema"] = add("schema", "print the JSON Schema of the RPC surface")
    out["migrate"] = p = add(
        "migrate",
        "copy the data dir's sessions into a store (--to URL) or back (--from URL); "
        "idempotent, verified by event counts and hashes",
    )
    way = p.add_mutually_exclusive_group(required=True)
    way.add_argument(
        "--to", metavar="URL", type=store_url, help="postgresql://… to copy the data dir into"
    )
    way.add_argument(
        "--from", dest="from_", metavar="URL", type=store_url, help="postgresql://… to copy from"
    )
    out["import"] = p = add("import", "import a transcript; prints the session id(s)")
    p.add_argument(
        "path",
        help="a transcript: Claude Code, Codex, Gemini CLI, Cline/Roo "
        "(api_conversation_history.json), aider (.aider.chat.history.md), OpenHands, SWE-agent, "
        "mini-swe-agent, or your own agent's messages (a JSON array of Anthropic or OpenAI "
        'messages, {"messages": [...]}, or chat JSONL)',
    )
    p.add_argument(
        "--new", action="store_true", help="import again even if this file was imported before"
    )
    out["stats"] = p = add(
        "stats",
        "what the proxy did and saved: per session and per day, from the request log",
    )
    p.add_argument(
        "--since",
        metavar="DATE",
        help="from this day on (2026-12-01, 2026-12-01T09:30, or 7d for the last seven days)",
    )
    p.add_argument("--session", metavar="S", help="one session (its id or a prefix of it)")
    p.add_argument("--json", action="store_true", help='{"sessions", "days", "totals"} as JSON')
    out["sessions"] = p = add("sessions", "list sessions, newest first")
    p.add_argument("--json", action="store_true", help="print the daemon's answer as JSON")
    out["context"] = p = add("context", "the context panel of a session")
    _session_args(p)
    _cascade_args(p, "the panel after the cascade has run (it writes its records)")
    out["render"] = p = add("render", "render the next request of a session")
    _session_args(p)
    p.add_argument(
        "--format",
        choices=("anthropic", "openai"),
        default="anthropic",
        help="the provider's request format",
    )
    _cascade_args(p, "run the cascade first (it writes its records)")
    out["snip"] = p = add("snip", "remove the oldest turns down to a target")
    _session_args(p)
    p.add_argument("--target", type=int, help="target tokens (default: the cascade target)")
    out["compact"] = p = add("compact", "/compact: summarize now, keeping what you ask")
    _session_args(p)
    p.add_argument("instructions", nargs="*", help="what the summary should keep (free text)")
    out["demo"] = p = add("demo", "import a transcript and show its context panel")
    p.add_argument("path", help="a transcript")
    p.add_argument("--window", type=int, default=200_000, help="the panel's window (200,000)")
    p.add_argument(
        "--then-window",
        type=int,
        default=64_000,
        dest="then_window",
        help="then run the cascade as for a model with this window (0: don't)",
    )
    from .launch import add_arguments as add_launch_arguments

    for name, who in (("claude", "Claude Code"), ("codex", "Codex")):
        out[name] = p = add(
            name,
            f"run {who} through compactd: a proxy on a free loopback port (or the one already "
            f"running on this data dir), {who} pointed at it, stopped with it. compactd's own "
            f"options come first; everything from the first other argument on is {who}'s "
            f"(`--` ends compactd's early): compactd {name} --window 64000 [{name} args…]",
        )
        add_launch_arguments(p)
    from .replay import add_arguments as add_replay_arguments

    out["replay"] = p = add(
        "replay", "replay a transcript under the cascade, priced with the provider's cache rules"
    )
    add_replay_arguments(p)
    return out


def store_url(text: str) -> str:
    """A store URL given on the command line: not empty (what `--to "$COMPACTD_STORE"` is
    with the variable unset); its scheme is checked where the store is opened."""
    if not text.strip():
        raise argparse.ArgumentTypeError(
            "the URL is empty (is the variable it came from set?); give postgresql://…"
        )
    return text


def parser() -> tuple[argparse.ArgumentParser, dict[str, argparse.ArgumentParser]]:
    """The top-level parser (global options, `--version`, the list of commands) and each
    command's own parser."""
    top = Parser(
        prog="compactd",
        description="compactd: keeps LLM agent conversations under the context window.",
        epilog="Every option works before or after the command. `compactd COMMAND -h` says more.",
    )
    top.add_argument("--version", action=VersionAction)
    _global_options(top, suppress=False)
    return top, _subparsers(top)


@functools.cache
def _version() -> str:
    import importlib.metadata  # only when asked: reading the metadata costs every command

    try:
        return importlib.metadata.version("compactd")
    except importlib.metadata.PackageNotFoundError:  # run from a source tree
        return "unknown"


class VersionAction(argparse.Action):
    """`--version`: prints `compactd VERSION` and exits, the version read only then."""

    def __init__(self, option_strings: list[str], dest: str, **kwargs: Any) -> None:
        kwargs.setdefault("help", "show the version and exit")
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS, **kwargs)

    def __call__(self, parser: argparse.ArgumentParser, *args: Any) -> None:
        sys.stdout.write(f"compactd {_version()}\n")
        parser.exit()


def _takes_value(p: argparse.ArgumentParser, option: str) -> bool | None:
    """Whether `option` (a bare `--name`, not `--name=value`) takes a value in `p`; None
    when `p` does not know it."""
    action = p._option_string_actions.get(option)  # argparse's own table of its options
    return None if action is None else action.nargs != 0


def _command_index(argv: list[str], parsers: list[argparse.ArgumentParser]) -> int | None:
    """Where the command word is: the first argument that is neither an option nor the value
    of an option (of any command: its options may come before it too)."""
    i = 0
    while i < len(argv):
        arg = argv[i]
        if arg == "--":
            return None
        if not arg.startswith("-"):
            return i
        if "=" not in arg and any(_takes_value(p, arg) for p in parsers):
            i += 1
        i += 1
    return None


def _split_before(
    top: argparse.ArgumentParser, command: argparse.ArgumentParser, before: list[str]
) -> tuple[list[str], list[str]]:
    """The arguments before the command word, as (global options, the command's own): an
    option the top-level parser does not know is the command's, with its value."""
    mine: list[str] = []
    theirs: list[str] = []
    i = 0
    while i < len(before):
        arg = before[i]
        name = arg.split("=", 1)[0]
        to = mine if _takes_value(top, name) is not None else theirs
        to.append(arg)
        if "=" not in arg and _takes_value(top if to is mine else command, name):
            to.extend(before[i + 1 : i + 2])
            i += 1
        i += 1
    return mine, theirs


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    """Parse a command line: every option before or after the command, a command's options
    and free text in any order (`compact S --window 32000 keep the plan`,
    `--window 64000 context S`). Exits 2 on a usage error, said in one line."""
    args = list(sys.argv[1:] if argv is None else argv)
    top, commands = parser()
    at = _command_index(args, [top, *commands.values()])
    if at is None or args[at] not in commands:
        top.parse_args(args[: at if at is not None else len(args)])  # -h, --version, bad options
        top.error(f"unknown command {args[at]!r}" if at is not None else "a command is required")
    ns = argparse.Namespace(**GLOBAL_DEFAULTS)
    globals_before, command_before = _split_before(top, commands[args[at]], args[:at])
    before = top.parse_args(globals_before)
    for key in GLOBAL_DEFAULTS:
        setattr(ns, key, getattr(before, key))
    if args[at] in LAUNCHERS:  # compactd's options, then the agent's arguments untouched
        from .launch import split_arguments

        valued = tuple(o for o in top._option_string_actions if _takes_value(top, o))
        ours, agent_args = split_arguments([*command_before, *args[at + 1 :]], valued)
        after = commands[args[at]].parse_args(ours)
        after.agent_args = agent_args
    else:
        after = commands[args[at]].parse_intermixed_args([*command_before, *args[at + 1 :]])
    for key, value in vars(after).items():
        if key == "set":
            ns.set = [*ns.set, *value]
        elif key == "verbose":
            ns.verbose += value
        else:
            setattr(ns, key, value)
    ns.command = args[at]
    try:
        ns.session_config = session_config(ns.config, ns.set)
    except UsageError as exc:
        commands[args[at]].error(str(exc))
    return ns


def session_config(config: str | None, settings: list[str]) -> dict[str, Any]:
    """`--config FILE|JSON` then each `--set KEY=VALUE`, as one object. The keys are checked
    by the daemon (it owns the list), so a misspelling gets the same error from every client."""
    out: dict[str, Any] = {}
    if config:
        text = config
        if not config.lstrip().startswith("{"):
            try:
                text = Path(config).read_text()
            except OSError as exc:
                raise UsageError(
                    f"--config {config!r} is neither a JSON object nor a readable file "
                    f"({exc.strerror or exc})"
                ) from None
        try:
            loaded = orjson.loads(text)
        except orjson.JSONDecodeError as exc:
            raise UsageError(f"--config {config!r} is not valid JSON: {exc}") from None
        if not isinstance(loaded, dict):
            raise UsageError(f"--config must be a JSON object, got {type(loaded).__name__}")
        out.update(loaded)
    for item in settings:
        key, sep, raw = item.partition("=")
        if not sep or not key.strip():
            raise UsageError(f"--set {item!r}: expected KEY=VALUE")
        try:
            value: Any = orjson.loads(raw)
        except orjson.JSONDecodeError:
            value = raw
        out[key.strip()] = value
    return out


# ---- running ------------------------------------------------------------------------------


async def _resolve_session(ns: argparse.Namespace, client: CompactdClient) -> None:
    """An id prefix names the one session it starts."""
    wanted = ns.session
    ids = [info.session_id for info in (await client.list_sessions(wanted)).sessions]
    if wanted in ids:
        return
    matches = [sid for sid in ids if sid.startswith(wanted)]
    if not matches:
        raise UsageError(f"no session {wanted!r} (`compactd sessions` lists them)")
    if len(matches) > 1:
        raise UsageError(
            f"{wanted!r} is the start of {len(matches)} sessions ({', '.join(matches[:4])}"
            f"{', …' if len(matches) > 4 else ''}); give more of the id"
        )
    ns.session = matches[0]


def default_provider(ns: argparse.Namespace) -> str | None:
    """The summary provider of the daemon a command spawns: `--summary-provider`, else
    $COMPACTD_SUMMARY_PROVIDER (the daemon reads it), else anthropic when ANTHROPIC_API_KEY
    is set — a user with a key expects `compact` to work — else none."""
    if ns.summary_provider or os.environ.get("COMPACTD_SUMMARY_PROVIDER"):
        return ns.summary_provider
    return "anthropic" if os.environ.get("ANTHROPIC_API_KEY") else None


def daemon_args(ns: argparse.Namespace) -> list[str]:
    """The `serve` options a client command passes on to the daemon it spawns."""
    args: list[str] = []
    provider = default_provider(ns)
    for flag, value in (
        ("--store", ns.store),
        ("--summary-provider", provider),
        ("--summary-model", ns.summary_model),
    ):
        if value:
            args += [flag, value]
    if ns.session_config:
        args += ["--config", orjson.dumps(ns.session_config).decode()]
    if ns.verbose >= 2:
        args += ["--log-level", "INFO"]
    if previews(ns):  # a view writes nothing: not even the idle work its first look would do
        args.append("--no-idle-work")
    return args


def previews(ns: argparse.Namespace) -> bool:
    """A command that only looks: `context`, `sessions`, `demo`'s panels, `--dry-run`."""
    if getattr(ns, "dry_run", False) or ns.command in ("sessions", "demo"):
        return True
    return ns.command == "context" and not ns.cascade


def reads_only(ns: argparse.Namespace) -> bool:
    """A command that only reads what is stored (`sessions`, `context` without `--cascade`):
    it needs no daemon, and one started for a look would cost more than the look."""
    return ns.command == "sessions" or (ns.command == "context" and not ns.cascade)


def _run_local(ns: argparse.Namespace, connect: Connect) -> int:
    """A read-only command, on the client `connect` gives: its calls never wait (the store
    is read in this process), so the command's coroutine runs to its end without an event
    loop — and asyncio, with the TLS library it loads, is never imported."""
    try:
        client = connect(ns)
    except RpcError as exc:
        print(f"compactd: {exc.message}", file=sys.stderr)
        return EXIT_ERROR
    try:
        return _finish(_command(ns, client))
    except UsageError as exc:
        print(f"compactd: {exc}", file=sys.stderr)
        return EXIT_ERROR
    except RpcError as exc:
        print(f"compactd: {exc.message}", file=sys.stderr)
        return EXIT_ERROR
    finally:
        _finish(client.close())


async def _command(ns: argparse.Namespace, client: CompactdClient) -> int:
    """The command on a client: its session resolved from the prefix given, then run."""
    if ns.command in SESSION_COMMANDS:
        await _resolve_session(ns, client)
    return await COMMANDS[ns.command](ns, client)


def _finish(coroutine: Coroutine[Any, Any, T]) -> T:
    """The result of a coroutine that never waits; one that does is a mistake here."""
    try:
        coroutine.send(None)
    except StopIteration as done:
        return done.value  # type: ignore[no-any-return]
    coroutine.close()
    raise RuntimeError("a command on the local client waited for something")


async def _run_client(ns: argparse.Namespace) -> int:
    import asyncio

    from .client import CompactdClient

    client = await CompactdClient.spawn(
        data_dir=ns.data_dir, args=daemon_args(ns), new_process_group=True
    )
    # Ctrl-C cancels the call in flight; the daemon answers once it has stopped the work
    # (and written nothing), and only then does the command end
    client.cancel_wait = CANCEL_WAIT_SECONDS
    if ns.verbose and client.process is not None:
        _err(ns).print(f"compactd: daemon started (pid {client.process.pid})")
    try:
        return await _command(ns, client)
    except UsageError as exc:
        print(f"compactd: {exc}", file=sys.stderr)
        return EXIT_ERROR
    except Interrupted as exc:
        print(f"compactd: interrupted: {exc}", file=sys.stderr)
        return EXIT_INTERRUPTED
    except asyncio.CancelledError:
        print("compactd: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except RpcError as exc:
        print(f"compactd: {exc.message}", file=sys.stderr)
        return EXIT_ERROR
    except ConnectionError as exc:
        code = await client.close()
        if code == EXIT_ERROR:  # the daemon refused its options and said why on stderr
            return EXIT_ERROR
        print(f"compactd: the daemon stopped unexpectedly ({exc})", file=sys.stderr)
        return EXIT_DAEMON
    finally:
        await client.close()


@contextlib.contextmanager
def _interruptible() -> Iterator[None]:
    """Ctrl-C ends the command with 130 and a short note, never a traceback."""
    try:
        yield
    except KeyboardInterrupt:
        print("compactd: interrupted", file=sys.stderr)
        raise SystemExit(EXIT_INTERRUPTED) from None


def run(ns: argparse.Namespace, connect: Connect | None = None) -> int:
    """Every command but `serve`, `proxy` and `migrate` (dispatched by `compactd.main`):
    through a daemon it spawns, or — `connect`, for a command that `reads_only` — through
    the client `connect` gives, which reads the store in this process."""
    if ns.command == "schema":
        from ..protocol.schema import schema_text

        sys.stdout.write(schema_text())
        return EXIT_OK
    if ns.data_dir is None and os.environ.get("COMPACTD_DATA_DIR"):
        ns.data_dir = os.environ["COMPACTD_DATA_DIR"]
    if ns.command in LAUNCHERS:  # no daemon: a proxy and the agent
        from .launch import run as launch

        return launch(ns)
    with _interruptible():
        if connect is not None:
            return _run_local(ns, connect)
        import asyncio

        return asyncio.run(_run_client(ns))
