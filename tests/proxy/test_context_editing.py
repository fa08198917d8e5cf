"""Server-side clearing only where the upstream is known to apply context edits. Against an
Anthropic-compatible server that counts the window on the body as sent (and drops
`context_management`), the proxy clears in the body itself (`--context-editing auto` does so for
any upstream but the Anthropic API): every body as sent is under the window and no prompt-too-long
reaches the client, on every wire, streamed or not. `--context-editing server` says an upstream
applies the edits: then the edit is sent and the body may be larger than the window."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson
import pytest

from tests.support.fake_anthropic import FakeAnthropic, estimate_prompt_tokens
from tests.support.fake_openai import chat_prompt, responses_prompt
from tests.support.proxy import ProxyProcess
from tests.support.wires import Call, Step, User, Wire, upstream_bodies, upstream_statuses

from .conftest import proxied

WINDOW = 16_000
STEPS = 45
OUTPUT = "".join(f"file{n:03d}.txt  {n * 131:>8} bytes  rw-r--r--\n" for n in range(70))


def _as_sent(wire: Wire, body: dict[str, Any]) -> int:
    """The upstream's count of a body as sent (these upstreams apply no edit)."""
    if wire.name == "messages":
        return estimate_prompt_tokens(body)
    return chat_prompt(body) if wire.name == "chat" else responses_prompt(body)


def _session(proxy: ProxyProcess, wire: Wire, session: str) -> list[int]:
    history: list[Step] = [User("list every folder")]
    statuses = []
    for n in range(STEPS):
        history.append(Call(f"call_{session}_{n}", OUTPUT, f"ls folder{n}"))
        statuses.append(wire.send(proxy.base_url, history, session).status_code)
    return statuses


@pytest.mark.parametrize(
    "wire",
    [Wire("messages"), Wire("messages", True), Wire("chat"), Wire("responses", True)],
    ids=str,
)
def test_an_upstream_that_counts_the_body_as_sent_gets_bodies_under_the_window(
    tmp_path: Path, wire: Wire
) -> None:
    digest = ["--summary-provider", "digest"]
    with proxied(tmp_path / "data", window=WINDOW, args=digest) as (proxy, fakes):
        anthropic, openai = fakes
        anthropic.context_window, anthropic.applies_edits = WINDOW, False
        openai.context_window = WINDOW
        statuses = _session(proxy, wire, "as-sent")
        sent = upstream_bodies(fakes, wire)
        answered = upstream_statuses(fakes, wire)
    assert statuses == [200] * STEPS  # no prompt-too-long reached the client
    assert answered == [200] * STEPS  # nor did the upstream refuse one
    assert max(_as_sent(wire, body) for body in sent) <= WINDOW
    assert not any(b"clear_tool_uses" in orjson.dumps(body) for body in sent)
    assert "microcompact applied" in proxy.log  # cleared, in the body


def test_server_side_clearing_where_the_upstream_applies_the_edits(tmp_path: Path) -> None:
    """`--context-editing server` (the default for the Anthropic API): the clear is an edit the
    upstream applies before the prompt reaches the model; the bytes sent stay as they were."""
    with FakeAnthropic() as anthropic:
        anthropic.context_window = WINDOW
        with ProxyProcess(
            tmp_path / "data",
            anthropic=anthropic.base_url,
            window=WINDOW,
            args=["--context-editing", "server", "--summary-provider", "digest"],
        ) as proxy:
            statuses = _session(proxy, Wire("messages"), "applied")
        sent = [r.body for r in anthropic.messages_requests()]
    assert statuses == [200] * STEPS
    assert any(b"clear_tool_uses_20250919" in orjson.dumps(body) for body in sent)
    assert max(estimate_prompt_tokens(body) for body in sent) > WINDOW  # as sent; seen: under
