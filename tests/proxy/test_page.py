"""The proxy's page at its root, in a real browser: headless Chromium from the OS packages loads
it from a running `compactd proxy`, and the test reads what the browser rendered — the session's
id and saving as the request log has them, a new request arriving live while the page is open,
a recall handle's content one click away — and keeps a screenshot. Then what the page refuses:
anything but this machine's loopback."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import httpx2
import pytest

from tests.support.browser import Browser
from tests.support.fake_anthropic import FakeAnthropic
from tests.support.proxy import ProxyProcess

SESSION = "page-session-1"
HEADERS = {
    "x-api-key": "sk-ant-page-test",
    "anthropic-version": "2023-06-01",
    "x-claude-code-session-id": SESSION,
}
WINDOW = 12_000


def _step(i: int) -> list[dict[str, Any]]:
    call = {"type": "tool_use", "id": f"toolu_page_{i:04d}", "name": "Bash", "input": {"i": i}}
    output = "\n".join(f"line {n} of step {i}'s listing" for n in range(150))
    return [
        {"role": "assistant", "content": [call]},
        {
            "role": "user",
            "content": [{"type": "tool_result", "tool_use_id": call["id"], "content": output}],
        },
    ]


def _body(steps: int) -> dict[str, Any]:
    messages: list[dict[str, Any]] = [{"role": "user", "content": "list every step"}]
    for i in range(steps):
        messages += _step(i)
    return {
        "model": "claude-sonnet-4-5",
        "max_tokens": 1000,
        "system": "You are a careful coding agent. " * 40,
        "tools": [{"name": "Bash", "input_schema": {"type": "object"}}],
        "messages": messages,
    }


def _send(proxy: ProxyProcess, steps: int) -> None:
    answer = httpx2.post(
        f"{proxy.base_url}/v1/messages", json=_body(steps), headers=HEADERS, timeout=120
    )
    assert answer.status_code == 200, answer.text


def short(n: float) -> str:
    """The page's own short form of a token count."""
    sign, a = ("-" if n < 0 else ""), abs(n)
    if a >= 1e6:
        return f"{sign}{a / 1e6:.2f}M"
    if a >= 1e4:
        return f"{sign}{round(a / 1e3)}K"
    if a >= 1e3:
        return f"{sign}{a / 1e3:.1f}K"
    return f"{sign}{round(a)}"


def text_of(element_id: str) -> str:
    return f"(document.getElementById({element_id!r}) || {{}}).textContent"


async def test_the_page_shows_the_session_and_its_saving_live_in_chromium(
    tmp_path: Path,
) -> None:
    with (
        FakeAnthropic() as fake,
        ProxyProcess(
            tmp_path / "data",
            anthropic=fake.base_url,
            window=WINDOW,
            args=["--summary-provider", "digest"],
        ) as proxy,
    ):
        for steps in range(1, 14):  # past the window: Tier 1 clears old results
            await asyncio.to_thread(_send, proxy, steps)
        stats = httpx2.get(f"{proxy.base_url}/api/stats").json()
        [session] = stats["sessions"]
        assert session["sessionId"] == SESSION and session["savedInputTokens"] > 0
        async with Browser(tmp_path / "profile") as browser:
            await browser.goto(f"{proxy.base_url}/")
            assert await browser.wait_for(text_of("session-id")) == SESSION
            saved = await browser.evaluate(text_of("session-saved"))
            assert (
                saved == f"{short(session['savedInputTokens'])} tokens · ${session['savedUsd']:.2f}"
            )
            assert await browser.evaluate(text_of("session-requests")) == "13"
            listed = await browser.evaluate(
                f"document.querySelector('tr.session[data-session=\"{SESSION}\"] td.saved')"
                ".textContent"
            )
            assert listed == saved

            # live: a request through the proxy while the page is open shows up on its own
            await asyncio.to_thread(_send, proxy, 14)
            await browser.wait_for(f"{text_of('session-requests')} === '14'")
            fresh = httpx2.get(f"{proxy.base_url}/api/stats").json()["sessions"][0]
            await browser.wait_for(
                f"{text_of('session-saved')}.startsWith('{short(fresh['savedInputTokens'])} ')"
            )

            # the cascade's events, a cleared result's handle one click from its content
            tier = await browser.wait_for(
                "(document.querySelector('#events tr td:nth-child(2)') || {}).textContent"
            )
            assert tier == "microcompact"
            await browser.evaluate("document.querySelector('button.handle').click()")
            recalled = await browser.wait_for(
                f"{text_of('recall')}.includes('listing') && {text_of('recall')}"
            )
            assert "line 0 of step 0's listing" in recalled
            assert "line 149 of step 0's listing" in recalled

            shot = await browser.screenshot(tmp_path / "page.png")
    assert shot.startswith(b"\x89PNG") and len(shot) > 10_000


@pytest.mark.parametrize(
    "path", ["/", "/healthz", "/api/stats", f"/api/sessions/{SESSION}", "/api/events"]
)
def test_the_page_answers_only_a_loopback_host(proxy: ProxyProcess, path: str) -> None:
    """A browser sent here by a name that is not this machine's loopback (DNS rebinding from
    a page elsewhere) gets a 403, in the API's error shape, and nothing of the sessions."""
    answer = httpx2.get(f"{proxy.base_url}{path}", headers={"host": "evil.example:80"}, timeout=30)
    assert answer.status_code == 403
    assert answer.json()["error"]["type"] == "permission_error"


def test_healthz_names_the_proxy_and_its_store(proxy: ProxyProcess) -> None:
    health = httpx2.get(f"{proxy.base_url}/healthz", timeout=30).json()
    assert health["status"] == "ok" and health["service"] == "compactd proxy"
    assert health["store"] == str(proxy.data_dir)
    assert isinstance(health["pid"], int)
