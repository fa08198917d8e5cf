"""The `compactd` command's client side. Every subcommand but `serve` and `schema` talks to a
daemon it spawns, through the Python client over stdio — so the CLI exercises the real
protocol. `compactd.main` routes `serve` to the daemon; this module imports only `protocol`."""

from __future__ import annotations

import argparse
import asyncio
import sys
from collections.abc import Awaitable, Callable
from typing import Any

import orjson
from rich.console import Console

from ..protocol.convert import unstructure
from .client import CompactdClient, RpcError
from .panel import build_panel

Command = Callable[[argparse.Namespace, CompactdClient], Awaitable[int]]


def _budget(ns: argparse.Namespace) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key in ("model", "window", "max_output_tokens"):
        value = getattr(ns, key, None)
        if value is not None:
            out[key] = value
    return out


def _print_json(value: Any) -> None:
    sys.stdout.write(orjson.dumps(value, option=orjson.OPT_INDENT_2).decode() + "\n")


async def cmd_import(ns: argparse.Namespace, client: CompactdClient) -> int:
    result = await client.import_transcript(ns.path)
    for sid in result.session_ids:
        print(sid)
    for warning in result.warnings if ns.verbose else []:
        print(f"warning: {warning}", file=sys.stderr)
    return 0


async def cmd_sessions(ns: argparse.Namespace, client: CompactdClient) -> int:
    result = await client.list_sessions()
    if ns.json:
        _print_json(unstructure(result))
        return 0
    for info in result.sessions:
        print(f"{info.session_id}\t{info.size_bytes:,} bytes")
    return 0


async def cmd_context(ns: argparse.Namespace, client: CompactdClient) -> int:
    measure = await client.measure(ns.session, branch=ns.branch, **_budget(ns))
    data = unstructure(measure)
    if ns.json:
        _print_json(data)
        return 0
    Console(force_terminal=ns.color).print(build_panel(data, title=f"Context of {ns.session}"))
    return 0


async def cmd_render(ns: argparse.Namespace, client: CompactdClient) -> int:
    result = await client.render(
        ns.session, branch=ns.branch, format=ns.format, cascade=ns.cascade, **_budget(ns)
    )
    if ns.json:
        _print_json({"request": result.request, "tokens": result.tokens, "events": result.events})
        return 0
    tokens = result.tokens
    print(
        f"{len(result.request.get('messages', []))} messages, {tokens['total']:,} tokens of "
        f"{tokens['limit']:,} ({tokens['window']:,} window − {tokens['outputReserve']:,} "
        "output reserve)"
    )
    for event in result.events:
        mark = "✓" if event["applied"] else "·"
        print(
            f"{mark} {event['tier']}: {event['reason']} "
            f"({event['tokensBefore']:,} → {event['tokensAfter']:,})"
        )
    return 0


async def cmd_snip(ns: argparse.Namespace, client: CompactdClient) -> int:
    result = await client.snip(ns.session, ns.target, branch=ns.branch, **_budget(ns))
    if ns.json:
        _print_json(unstructure(result))
    else:
        print(
            f"{'snipped' if result.applied else 'nothing snipped'}: {result.reason} "
            f"({result.tokens_before:,} → {result.tokens_after:,} tokens)"
        )
    return 0


async def cmd_compact(ns: argparse.Namespace, client: CompactdClient) -> int:
    instructions = " ".join(ns.instructions) or None
    result = await client.compact(ns.session, instructions, branch=ns.branch, **_budget(ns))
    if ns.json:
        _print_json(unstructure(result))
    else:
        print(
            f"{'compacted' if result.applied else 'not compacted'}: {result.reason} "
            f"({result.tokens_before:,} → {result.tokens_after:,} tokens)"
        )
    return 0 if result.applied else 1


async def cmd_demo(ns: argparse.Namespace, client: CompactdClient) -> int:
    """`make run`: import a real transcript through the daemon, show its panel, then what the
    cascade does to it in a smaller window."""
    result = await client.import_transcript(ns.path)
    console = Console(force_terminal=ns.color)
    for sid in result.session_ids:
        measure = await client.measure(sid, window=ns.window)
        console.print(build_panel(unstructure(measure), title=f"Session {sid}"))
        if ns.then_window:
            out = await client.render(sid, window=ns.then_window, cascade=True)
            console.print(f"\n[bold]The next request at a {ns.then_window:,}-token window[/bold]")
            for event in out.events:
                mark = "✓" if event["applied"] else "·"
                console.print(f" {mark} {event['tier']}: {event['reason']}")
            after = await client.measure(sid, window=ns.then_window)
            console.print(build_panel(unstructure(after), title=f"Session {sid} after the cascade"))
    return 0


async def cmd_replay(ns: argparse.Namespace, client: CompactdClient) -> int:
    from .replay import run_replay

    return await run_replay(ns, client)


def _session_args(p: argparse.ArgumentParser, budget: bool = True) -> None:
    p.add_argument("session")
    p.add_argument("--branch")
    if budget:
        p.add_argument("--model")
        p.add_argument("--window", type=int)
        p.add_argument("--max-output-tokens", type=int, dest="max_output_tokens")
    p.add_argument("--json", action="store_true")


def add_serve_arguments(parser: argparse.ArgumentParser) -> None:
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
        "--summary-provider",
        choices=("anthropic", "client", "digest"),
        default=None,
        help="summary provider (default: $COMPACTD_SUMMARY_PROVIDER, else none)",
    )
    parser.add_argument(
        "--store",
        default=None,
        help="where sessions live for a fleet of daemons: postgresql://… (default "
        "$COMPACTD_STORE, else the files in the data dir)",
    )
    parser.add_argument("--summary-model", default=None)
    parser.add_argument("--summarize-timeout", type=float, default=120.0)
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


def parser() -> argparse.ArgumentParser:
    top = argparse.ArgumentParser(prog="compactd", description=__doc__)
    top.add_argument(
        "--data-dir",
        help="where sessions live (default $COMPACTD_DATA_DIR or the platform's user data dir)",
    )
    top.add_argument(
        "--color",
        action="store_true",
        default=None,
        help="force colour even when not on a terminal",
    )
    sub = top.add_subparsers(dest="command", required=True)
    serve = sub.add_parser("serve", help="run the daemon on stdio (JSON-RPC, LSP framing)")
    add_serve_arguments(serve)
    sub.add_parser("schema", help="print the JSON Schema of the RPC surface")
    p = sub.add_parser(
        "migrate",
        help="copy the data dir's sessions into a store (--to URL) or back (--from URL); "
        "idempotent, verified by event counts and hashes",
    )
    way = p.add_mutually_exclusive_group(required=True)
    way.add_argument("--to", metavar="URL", help="postgresql://… to copy the data dir into")
    way.add_argument("--from", dest="from_", metavar="URL", help="postgresql://… to copy from")
    p = sub.add_parser("import", help="import a transcript; prints the new session ids")
    p.add_argument("path")
    p.add_argument("-v", "--verbose", action="store_true")
    p = sub.add_parser("sessions", help="list sessions")
    p.add_argument("--json", action="store_true")
    _session_args(sub.add_parser("context", help="the context panel of a session"))
    p = sub.add_parser("render", help="render the next request of a session")
    _session_args(p)
    p.add_argument("--format", choices=("anthropic", "openai"), default="anthropic")
    p.add_argument("--cascade", action="store_true", help="run the cascade first")
    p = sub.add_parser("snip", help="remove the oldest turns down to a target")
    _session_args(p)
    p.add_argument("--target", type=int, help="target tokens (default: the cascade threshold)")
    p = sub.add_parser("compact", help="/compact: summarize now")
    _session_args(p)
    p.add_argument("instructions", nargs="*", help="what the summary should keep")
    p = sub.add_parser("demo", help="import a transcript and show its context panel")
    p.add_argument("path")
    p.add_argument("--window", type=int, default=200_000)
    p.add_argument(
        "--then-window",
        type=int,
        default=64_000,
        dest="then_window",
        help="then run the cascade as for a model with this window (0: don't)",
    )
    from .replay import add_arguments as add_replay_arguments

    add_replay_arguments(
        sub.add_parser(
            "replay",
            help="replay a transcript under the cascade, priced with the provider's cache rules",
        )
    )
    return top


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


async def _run_client(ns: argparse.Namespace) -> int:
    args: list[str] = []
    for flag in ("summary_provider", "summary_model"):
        value = getattr(ns, flag, None)
        if value:
            args += [f"--{flag.replace('_', '-')}", value]
    client = await CompactdClient.spawn(data_dir=ns.data_dir, args=args)
    try:
        return await COMMANDS[ns.command](ns, client)
    except RpcError as exc:
        print(f"compactd: {exc.message}", file=sys.stderr)
        return 2
    except ConnectionError as exc:
        print(f"compactd: the daemon stopped unexpectedly ({exc})", file=sys.stderr)
        return 3
    finally:
        await client.close()


def run(ns: argparse.Namespace) -> int:
    """Every command but `serve` (the daemon's, dispatched by `compactd.main`)."""
    if ns.command == "schema":
        from ..protocol.schema import schema_text

        sys.stdout.write(schema_text())
        return 0
    return asyncio.run(_run_client(ns))
