"""The daemon's ratios (issues "The daemon" and "The cascade"): RPC round trip, RPC render
overhead, startup, and the cascade's time per step of a real session."""

from __future__ import annotations

import asyncio
import statistics
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar

import orjson
from compactd.clients.client import CompactdClient
from compactd.context.engine import Engine, RenderParams
from compactd.context.importers import load_transcript
from compactd.context.importers.apply import steps
from compactd.context.importers.plan import FunctionEnd, FunctionStart, Messages, ModelCall, Note
from compactd.context.render.request import RequestSpec
from compactd.context.stores.files import FileStore
from registry import MEMORY_DIR, TRANSCRIPTS, Context, Measurement, case

HERE = Path(__file__).resolve().parent
ECHO_SERVER = HERE.parent / "echo_server.py"
BIG = TRANSCRIPTS / "claude-code" / "64da7265-8f07-4967-b79f-0ae374c13330.jsonl"
CALLS_PER_SAMPLE = 200
T = TypeVar("T")


def _run(loop: asyncio.AbstractEventLoop, coro: Awaitable[T]) -> T:
    return loop.run_until_complete(coro)


@case("rpc_roundtrip_ratio", target=1.3)
def rpc_roundtrip_ratio(ctx: Context) -> Measurement:
    """A trivial request's round trip (`daemon/status`) against a minimal hand-written asyncio
    JSON-RPC echo loop over the same framing, both driven by the same client."""
    loop = asyncio.new_event_loop()
    with ctx.scratch() as root:
        daemon = _run(loop, CompactdClient.spawn(data_dir=str(root), args=["--no-watch"]))
        echo = _run(loop, CompactdClient.spawn(command=[sys.executable, str(ECHO_SERVER)]))

        def calls(client: CompactdClient, method: str) -> Callable[[], None]:
            async def many() -> None:
                for _ in range(CALLS_PER_SAMPLE):
                    await client.request(method, {})

            return lambda: _run(loop, many())

        try:
            t = ctx.medians(
                {"compactd": calls(daemon, "daemon/status"), "echo loop": calls(echo, "echo")}
            )
        finally:
            _run(loop, daemon.close())
            _run(loop, echo.close())
    loop.close()
    per_call = {f"{k} per call": v / CALLS_PER_SAMPLE for k, v in t.items()}
    return Measurement(t["compactd"] / t["echo loop"], per_call)


def _big_session(root: Path) -> tuple[str, Engine]:
    """The largest transcript with nothing shortened: ~150K tokens of context."""
    engine = Engine(FileStore(root))
    ids = engine.import_file(str(BIG)).session_ids
    session, _ = engine.open(ids[0], {"maxToolResultChars": 10**15})
    return session.id, engine


@case("rpc_render_overhead", target=1.25)
def rpc_render_overhead(ctx: Context) -> Measurement:
    """`context/render` of a ~150K-token context over RPC (request out, answer decoded) against
    its floor: the same render in-process, plus a minimal asyncio loop encoding the same answer
    with orjson, piping it and the client decoding it (`echo/get`)."""
    loop = asyncio.new_event_loop()
    with ctx.scratch() as root:
        sid, engine = _big_session(root)
        params = RenderParams(spec=RequestSpec(window=1_000_000))
        tokens = engine.render(sid, params).total
        client = _run(loop, CompactdClient.spawn(data_dir=str(root), args=["--no-watch"]))
        echo = _run(loop, CompactdClient.spawn(command=[sys.executable, str(ECHO_SERVER)]))
        wire = {"sessionId": sid, "window": 1_000_000}
        answer = _run(loop, client.request("context/render", wire))
        _run(loop, echo.request("echo/set", {"reply": answer}))
        try:
            t = ctx.medians(
                {
                    "over RPC": lambda: _run(loop, client.request("context/render", wire)),
                    "in-process render": lambda: engine.render(sid, params),
                    "encode + pipe + decode (echo)": lambda: _run(loop, echo.request("echo/get")),
                }
            )
        finally:
            _run(loop, client.close())
            _run(loop, echo.close())
    loop.close()
    floor = t["in-process render"] + t["encode + pipe + decode (echo)"]
    note = (
        f"{tokens:,} tokens, {len(orjson.dumps(answer)) / 1e6:.2f} MB answer; against the "
        f"in-process render alone: {t['over RPC'] / t['in-process render']:.2f}"
    )
    return Measurement(t["over RPC"] / floor, t, note)


@case("startup_seconds", target=0.35)
def startup_seconds(ctx: Context) -> Measurement:
    """Spawning `compactd serve` to its first answer, in seconds."""
    loop = asyncio.new_event_loop()
    samples = []
    imports = []
    with ctx.scratch() as root:
        for _ in range(1 if ctx.quick else 5):
            start = time.perf_counter()
            client = _run(loop, CompactdClient.spawn(data_dir=str(root), args=["--no-watch"]))
            _run(loop, client.status())
            samples.append(time.perf_counter() - start)
            _run(loop, client.close())
        for _ in range(1 if ctx.quick else 3):
            proc = _run(
                loop,
                asyncio.create_subprocess_exec(
                    sys.executable,
                    "-c",
                    "import time; t = time.perf_counter(); "
                    "import lsprotocol.types; print(time.perf_counter() - t)",
                    stdout=asyncio.subprocess.PIPE,
                ),
            )
            out, _ = _run(loop, proc.communicate())
            imports.append(float(out))
    loop.close()
    value = statistics.median(samples)
    return Measurement(
        value,
        {
            "spawn to first answer": value,
            "import lsprotocol.types alone": statistics.median(imports),
        },
        "the front answers compactd's own methods before pygls (and lsprotocol's ~1,000 LSP "
        "types) is needed",
    )


@case("cascade_turn_ratio", target=3.0)
def cascade_turn_ratio(ctx: Context) -> Measurement:
    """Replaying the largest Claude Code transcript step by step through the daemon at a 64K
    window (append the step, render with the cascade, digest summaries): the daemon's time per
    step against its RPCs' floor — the same requests to a minimal asyncio echo loop, which
    answers each render with the same rendered answer (encoded, piped, decoded)."""
    imported = load_transcript(str(BIG))[0]
    loop = asyncio.new_event_loop()
    runs: list[tuple[float, float, int, list[Any]]] = []
    # on tmpfs when there is one: an fsync's disk latency is not what the floor has either
    with ctx.scratch(memory=True) as root:
        for attempt in range(1 if ctx.quick else 3):
            client = _run(
                loop,
                CompactdClient.spawn(
                    data_dir=str(root / f"r{attempt}"),
                    args=["--no-watch", "--summary-provider", "digest"],
                ),
            )
            try:
                _run(loop, client.status())  # started; its tokenizer loads in the background
                _run(loop, asyncio.sleep(1.5))
                runs.append(_run(loop, _replay(client, imported)))
            finally:
                _run(loop, client.close())
        echo = _run(loop, CompactdClient.spawn(command=[sys.executable, str(ECHO_SERVER)]))
        try:
            floors = [_run(loop, _floor(echo, runs[0][3])) for _ in range(1 if ctx.quick else 3)]
        finally:
            _run(loop, echo.close())
    loop.close()
    appends, renders, count, _ = min(runs, key=lambda r: r[0] + r[1])  # least disturbed
    where = "on tmpfs (fsync excluded)" if str(root).startswith(MEMORY_DIR) else "on disk"
    floor = min(floors)
    return Measurement(
        (appends + renders) / floor,
        {
            "daemon per step": (appends + renders) / count,
            "  of which durable appends (fsync'd RPCs)": appends / count,
            "  of which render with the cascade (RPC)": renders / count,
            "echo floor per step (the same RPCs)": floor / count,
        },
        f"{count} model calls (main thread and sub-agents); the least disturbed of the runs; "
        f"data dir {where}",
    )


async def _replay(
    client: CompactdClient, imported: Any
) -> tuple[float, float, int, list[list[tuple[str, Any]]]]:
    """The transcript through the daemon; its time appending and rendering, and every step's
    requests (a render's with the answer it got, for the floor)."""
    sid = (await client.open_session()).session_id
    functions: dict[str, str] = {}
    appending = rendering = 0.0
    count = 0
    sent: list[tuple[str, Any]] = []
    steps_sent: list[list[tuple[str, Any]]] = []
    request = client.request

    async def recording(method: str, params: Any = None, timeout: float | None = None) -> Any:
        answer = await request(method, params, timeout)
        sent.append((method, answer if method == "context/render" else params))
        return answer

    client.request = recording  # type: ignore[method-assign]
    for step in steps(imported):
        sent = []
        start = time.perf_counter()
        for op in step.ops:
            if isinstance(op, Messages) and op.messages:
                await client.append(sid, op.messages, function_id=functions.get(op.thread or ""))
            elif isinstance(op, FunctionStart):
                started = await client.function_start(
                    sid,
                    op.name,
                    op.input,
                    tool_use_id=op.tool_use_id,
                    function_id=functions.get(op.thread or ""),
                )
                functions[op.key] = started.function_id
            elif isinstance(op, FunctionEnd):
                await client.function_complete(sid, functions[op.key], op.output, op.status)
            elif isinstance(op, Note | ModelCall):
                pass
        appending += time.perf_counter() - start
        call = step.call
        if call is not None:
            viewer = functions.get(call.thread) if call.thread else None
            start = time.perf_counter()
            await client.render(sid, window=64_000, cascade=True, viewer=viewer)
            rendering += time.perf_counter() - start
            count += 1
        steps_sent.append(sent)
    client.request = request  # type: ignore[method-assign]
    return appending, rendering, count, steps_sent


async def _floor(echo: CompactdClient, steps_sent: list[list[tuple[str, Any]]]) -> float:
    """The same requests, step by step, to the echo loop: a render's answer is set beforehand
    (untimed) and fetched by `echo/get`; every other request goes as sent."""
    spent = 0.0
    for sent in steps_sent:
        for method, payload in sent:
            if method == "context/render":
                await echo.request("echo/set", {"reply": payload})
        start = time.perf_counter()
        for method, payload in sent:
            if method == "context/render":
                await echo.request("echo/get", {})
            else:
                await echo.request(method, payload)
        spent += time.perf_counter() - start
    return spent
