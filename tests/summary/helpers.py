"""Sessions, reads of the daemon's state, and the agreement check for the summary tests."""

from __future__ import annotations

import asyncio
import io
from collections.abc import Callable
from typing import Any

from compactd.clients.client import CompactdClient
from compactd.clients.panel import build_panel
from compactd.context.tokens import Counter
from compactd.protocol.convert import unstructure
from rich.console import Console

from tests.cascade.helpers import assistant, blocks, results, tool_result, tool_use, user
from tests.support.fake_anthropic import FakeAnthropic
from tests.support.invariants import check_anthropic_pairing, recount_anthropic, server_view
from tests.support.logs import log_bytes  # noqa: F401 (re-exported)

WINDOW = 32_000
# no background preparation unless a test wants it; the checkpoint alone (tool evidence, an
# extra call before it, has its own tests: test_summary_stage.py)
BASE_CONFIG = {"prepareIdleSeconds": 3600, "evidenceEnabled": False}


def big_result(tag: str, chars: int = 6000) -> str:
    """A tool output over the Budget Reduction limit, with a recognizable head and tail."""
    lines, size, i = [], 0, 0
    while size < chars:
        line = f"{tag} line {i:04d}: value={i * 7 % 1000} status=ok"
        lines.append(line)
        size += len(line) + 1
        i += 1
    return "\n".join(lines)[:chars]


def turn(tag: str, result_chars: int = 6000, tool: str = "Read") -> list[dict[str, Any]]:
    """Four top-level messages: a request, a call, its (large) result, an answer."""
    use_id = f"toolu_{tag}"
    return [
        user(f"Request {tag}: inspect module {tag} and report what it does."),
        assistant(f"Looking at module {tag}.", tool_use(use_id, tool, file_path=f"/src/{tag}.py")),
        results(tool_result(use_id, big_result(tag, result_chars))),
        assistant(f"Module {tag} parses the {tag} records and writes a report."),
    ]


def sixteen(prefix: str) -> list[dict[str, Any]]:
    """Sixteen top-level messages: four complete turns with large tool results."""
    return [m for k in range(4) for m in turn(f"{prefix}{k}")]


async def open_session(client: CompactdClient, config: dict[str, Any] | None = None) -> str:
    opened = await client.open_session(None, {**BASE_CONFIG, **(config or {})})
    return opened.session_id


async def records(
    client: CompactdClient, sid: str, kind: str | None = None
) -> list[dict[str, Any]]:
    got = await client.get(sid)
    return [r for r in got["records"] if kind is None or r["kind"] == kind]


def prompts(fake: FakeAnthropic) -> list[str]:
    """The user prompt of every summary request the fake received."""
    out = []
    for req in fake.messages_requests():
        (message,) = req.body["messages"]
        content = message["content"]
        out.append(content if isinstance(content, str) else content[0]["text"])
    return out


def systems(fake: FakeAnthropic) -> list[str]:
    out = []
    for req in fake.messages_requests():
        system = req.body.get("system")
        out.append(system if isinstance(system, str) else system[0]["text"])
    return out


async def wait_until(check: Callable[[], bool], timeout: float = 60.0) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not check():
        if loop.time() > deadline:
            raise AssertionError("timed out waiting")
        await asyncio.sleep(0.02)


async def agree(client: CompactdClient, sid: str, **budget: Any) -> dict[str, Any]:
    """`context/measure`, the context panel built from it and the final request agree."""
    budget.setdefault("window", WINDOW)
    measure = await client.measure(sid, **budget)
    rendered = await client.render(sid, **budget)
    tokens = rendered.tokens
    assert measure.total == tokens.total
    assert measure.categories == tokens.categories
    assert measure.free == tokens.free and measure.limit == tokens.limit
    request = rendered.request
    check_anthropic_pairing(request)
    assert tokens.estimate == recount_anthropic(server_view(request), Counter())
    # the panel shows exactly those numbers
    console = Console(file=io.StringIO(), width=140, color_system=None)
    console.print(build_panel(unstructure(measure), title="ctx"))
    text = console.file.getvalue()  # type: ignore[attr-defined]
    assert f"{measure.total:,} / {measure.window:,} tokens" in text
    for key in ("markers", "tool_results", "user"):
        value = measure.categories[key]
        if value:
            assert f"{value:,}" in text
    # and the cascade, with nothing to do, hands back the very same request
    cascaded = await client.render(sid, cascade=True, **budget)
    if not any(e.applied for e in cascaded.events):
        assert cascaded.request == request
    return request


def wire_blocks(request: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """(role, block) for every block of the request, without cache breakpoints."""
    out = []
    for msg in request["messages"]:
        for block in blocks({"messages": [msg]}):
            out.append((msg["role"], block))
    return out
