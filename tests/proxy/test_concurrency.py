"""Many requests at once through one proxy, as a busy user's agents send them: sixteen sessions
side by side, and in one of them eight conversations at once (sub-agents run on their parent's
session id), on every wire, streamed and not. No request races another of its session: none
goes upstream unmanaged, none logs an error, and every one's usage is recorded."""

from __future__ import annotations

import re
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import orjson

from tests.support.fake_anthropic import FakeAnthropic
from tests.support.fake_openai import FakeOpenAI
from tests.support.wires import Call, Said, Step, User, Wire

from .conftest import events_of, proxied

TURNS = 25
SESSIONS = 16  # besides the shared one
SUB_AGENTS = 8  # conversations at once on the shared session
RESULT = "".join(f"row {n}: value {n * 7}\n" for n in range(60))
WIRES = [Wire("messages", True), Wire("messages"), Wire("chat"), Wire("responses", True)]


def _conversation(base_url: str, session: str, name: str, wire: Wire) -> list[int]:
    """One agent's conversation, a request per step; the statuses it got."""
    history: list[Step] = [User(f"task {name}: list the rows")]
    statuses = []
    for turn in range(TURNS):
        response = wire.send(base_url, history, session)
        statuses.append(response.status_code)
        if turn % 3 == 2:
            history += [Said(f"done {turn}"), User(f"{name}: more, {turn}")]
        else:
            history.append(Call(f"call_{name}_{turn}", RESULT, f"rows {turn}"))
    return statuses


def _usage_records(data: Path, session: str) -> int:
    return sum(
        1 for e in events_of(data, session) if e.get("t") == "record" and e["r"]["kind"] == "usage"
    )


def test_concurrent_sessions_and_sub_agents_never_race(tmp_path: Path) -> None:
    data = tmp_path / "data"
    with proxied(data, args=["--summary-provider", "digest"]) as (proxy, (anthropic, openai)):
        jobs: list[tuple[str, str, Wire]] = [
            (f"alone-{k}", f"a{k}", WIRES[k % len(WIRES)]) for k in range(SESSIONS)
        ]
        jobs += [("shared-parent", f"sub{k}", WIRES[k % len(WIRES)]) for k in range(SUB_AGENTS)]
        with ThreadPoolExecutor(len(jobs)) as pool:
            futures = [
                pool.submit(_conversation, proxy.base_url, session, name, wire)
                for session, name, wire in jobs
            ]
            statuses = [s for f in futures for s in f.result()]
        sent = [r.body for r in anthropic.messages_requests()]
        sent += [r["body"] for r in openai.records]
    assert statuses == [200] * len(jobs) * TURNS
    assert proxy.returncode == 0
    log = proxy.log
    assert not re.search(r"ERROR|Traceback|is not after|cannot be kept|not recorded", log), log
    # every request carried compactd's rendering: its recall tool, offered to each of them
    assert len(sent) == len(jobs) * TURNS
    assert all(b"compactd_recall" in orjson.dumps(body.get("tools")) for body in sent)
    requests: dict[str, int] = {}
    for session, _name, _wire in jobs:
        requests[session] = requests.get(session, 0) + TURNS
    for session, count in requests.items():
        assert _usage_records(data, session) == count, session
    branches = [e["name"] for e in events_of(data, "shared-parent") if e.get("t") == "branch"]
    assert len(branches) == SUB_AGENTS - 1  # each sub-agent on a branch of its own


def test_a_session_is_read_and_written_only_in_its_turn(tmp_path: Path) -> None:
    """The real proxy in this process, over HTTP, with every read and write of a session's
    graph watched: none may happen on the event loop, where it would run beside the worker
    that appends to the same session (what made the race above)."""
    import asyncio
    import threading

    from aiohttp import web
    from compactd.clients.cli import parse
    from compactd.context.session import Session
    from compactd.proxy.main import build

    on_loop: list[str] = []
    loop_thread: list[int] = []
    real_catch_up, real_commit = Session.catch_up, Session.commit

    def watched(real: Any) -> Any:
        def call(self: Session, *args: Any, **kwargs: Any) -> Any:
            if threading.get_ident() in loop_thread:
                on_loop.append(real.__name__)
            return real(self, *args, **kwargs)

        return call

    with FakeAnthropic() as anthropic:
        openai = FakeOpenAI().start()
        ns = parse(
            [
                "--data-dir",
                str(tmp_path / "data"),
                "proxy",
                "--anthropic-upstream",
                anthropic.base_url,
                "--openai-upstream",
                f"http://127.0.0.1:{openai.port}",
            ]
        )
        app, proxy = build(ns)
        started = threading.Event()
        stop = threading.Event()
        port: list[int] = []

        def serve() -> None:
            async def main() -> None:
                loop_thread.append(threading.get_ident())
                runner = web.AppRunner(proxy.application())
                await runner.setup()
                site = web.TCPSite(runner, "127.0.0.1", 0)
                await site.start()
                port.append(runner.addresses[0][1])
                started.set()
                while not stop.is_set():
                    await asyncio.sleep(0.02)
                await runner.cleanup()

            asyncio.run(main())

        Session.catch_up = watched(real_catch_up)  # type: ignore[method-assign]
        Session.commit = watched(real_commit)  # type: ignore[method-assign]
        server = threading.Thread(target=serve, daemon=True)
        server.start()
        try:
            assert started.wait(30)
            base = f"http://127.0.0.1:{port[0]}"
            with ThreadPoolExecutor(6) as pool:
                futures = [
                    pool.submit(_conversation, base, "watched", f"w{k}", WIRES[k % len(WIRES)])
                    for k in range(6)
                ]
                statuses = [s for f in futures for s in f.result()]
        finally:
            stop.set()
            server.join(30)
            Session.catch_up, Session.commit = real_catch_up, real_commit  # type: ignore[method-assign]
            app.close()
            app.engine.store.close()
            openai.stop()
    assert statuses == [200] * 6 * TURNS
    assert on_loop == [], f"the loop read or wrote a session {len(on_loop)} times"
