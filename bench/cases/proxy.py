"""The proxy's overhead: time to the first streamed byte through `compactd proxy` against the
same request straight to the same loopback upstream, at a 100-turn session.

A scripted agent's session is grown one step at a time, as Claude Code grows it (each request
the whole history plus one tool result); every timed round sends the next step both ways, so
each pair is the same request. The proxy does its whole work on that path — matching the
history, appending the tail, the cascade, rendering — before the upstream sees a byte.
"""

from __future__ import annotations

import http.client
import sys
import time
from typing import Any

import orjson
from registry import REPO, Context, Measurement, case

if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

TURNS = 100
RESULT_CHARS = 6_000
SYSTEM = "You are a coding agent. " * 400  # ~2.4K tokens, like an agent's own prompt


def _step(i: int) -> list[dict[str, Any]]:
    call = {
        "type": "tool_use",
        "id": f"toolu_bench_{i:04d}",
        "name": "Bash",
        "input": {"command": f"cat part-{i}.txt"},
    }
    output = "".join(f"line {n} of part {i}: some output text\n" for n in range(200))
    return [
        {"role": "assistant", "content": [{"type": "text", "text": f"Reading {i}."}, call]},
        {
            "role": "user",
            "content": [
                {"type": "tool_result", "tool_use_id": call["id"], "content": output[:RESULT_CHARS]}
            ],
        },
    ]


def _body(steps: int) -> bytes:
    messages: list[dict[str, Any]] = [{"role": "user", "content": "Read every part."}]
    for i in range(steps):
        messages.extend(_step(i))
    return orjson.dumps(
        {
            "model": "claude-sonnet-4-5",
            "max_tokens": 1024,
            "stream": True,
            "system": SYSTEM,
            "tools": [{"name": "Bash", "input_schema": {"type": "object"}}],
            "messages": messages,
        }
    )


MESSAGES = (
    "/v1/messages",
    {
        "content-type": "application/json",
        "x-api-key": "bench-key",
        "anthropic-version": "2023-06-01",
        "x-claude-code-session-id": "bench-proxy-session",
    },
)
GEMINI = (
    "/v1beta/models/gemini-2.5-pro:streamGenerateContent?alt=sse",
    {"content-type": "application/json", "x-goog-api-key": "bench-key"},
)


def _gemini_body(steps: int) -> bytes:
    """The same session in the Gemini API's contents (what Gemini CLI sends)."""
    contents: list[dict[str, Any]] = [{"role": "user", "parts": [{"text": "Read every part."}]}]
    for i in range(steps):
        assistant, user = _step(i)
        call = assistant["content"][1]
        output = user["content"][0]["content"]
        contents += [
            {
                "role": "model",
                "parts": [
                    {"text": f"Reading {i}."},
                    {"functionCall": {"name": call["name"], "args": call["input"]}},
                ],
            },
            {
                "role": "user",
                "parts": [{"functionResponse": {"name": "Bash", "response": {"output": output}}}],
            },
        ]
    return orjson.dumps(
        {
            "systemInstruction": {"parts": [{"text": SYSTEM}]},
            "tools": [{"functionDeclarations": [{"name": "Bash", "parameters": {}}]}],
            "contents": contents,
        }
    )


def _first_byte(port: int, body: bytes, wire: tuple[str, dict[str, str]] = MESSAGES) -> float:
    """Seconds from sending the request to the first byte of the streamed answer."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    path, headers = wire
    start = time.perf_counter()
    conn.request("POST", path, body=body, headers=headers)
    response = conn.getresponse()
    response.read1(1)
    elapsed = time.perf_counter() - start
    response.read()
    conn.close()
    return elapsed


@case("proxy_first_byte_ratio", target=1.2)
def proxy_first_byte_ratio(ctx: Context) -> Measurement:
    """(time to the first streamed byte through the proxy − 20 ms) over the same request
    straight to the loopback upstream, at a 100-turn session (target: ≤ 1.2× + 20 ms)."""
    from tests.support.fake_anthropic import FakeAnthropic
    from tests.support.proxy import ProxyProcess

    with ctx.scratch() as root, FakeAnthropic() as fake:
        proxy = ProxyProcess(root / "data", anthropic=fake.base_url, args=["--no-recall"])
        proxy.start()
        try:
            for steps in range(TURNS - 10):  # the session as an agent grew it
                _first_byte(proxy.port, _body(steps))
            step = iter(range(TURNS - 10, TURNS + 1000))
            current = {"steps": TURNS - 10}

            def both() -> None:
                current["steps"] = next(step)

            times: dict[str, list[float]] = {"proxy": [], "direct": []}
            for _ in range(max(ctx.repeat, 10)):
                both()
                body = _body(current["steps"])
                times["proxy"].append(_first_byte(proxy.port, body))
                times["direct"].append(_first_byte(fake.port, body))
        finally:
            proxy.stop()
    import statistics

    t = {name: statistics.median(v) for name, v in times.items()}
    ratio = max(0.0, t["proxy"] - 0.020) / t["direct"]
    note = (
        f"{current['steps']} steps of {RESULT_CHARS:,}-character results; proxy "
        f"{t['proxy'] * 1000:.1f} ms vs direct {t['direct'] * 1000:.1f} ms to the first byte"
    )
    return Measurement(ratio, t, note)


@case("proxy_gemini_first_byte_ratio", target=1.2)
def proxy_gemini_first_byte_ratio(ctx: Context) -> Measurement:
    """The same through the Gemini front: (time to the first streamed byte through the proxy −
    20 ms) over straight to the loopback Gemini API, at a 100-turn session (≤ 1.2× + 20 ms)."""
    import statistics

    from tests.support.fake_gemini import FakeGemini
    from tests.support.proxy import ProxyProcess

    fake = FakeGemini().start()
    times: dict[str, list[float]] = {"proxy": [], "direct": []}
    steps = 0
    try:
        with ctx.scratch() as root:
            proxy = ProxyProcess(root / "data", gemini=f"http://127.0.0.1:{fake.port}")
            proxy.start()
            try:
                for steps in range(TURNS - 10):  # the session as an agent grew it
                    _first_byte(proxy.port, _gemini_body(steps), GEMINI)
                for steps in range(TURNS - 10, TURNS - 10 + max(ctx.repeat, 10)):
                    body = _gemini_body(steps)
                    times["proxy"].append(_first_byte(proxy.port, body, GEMINI))
                    times["direct"].append(_first_byte(fake.port, body, GEMINI))
            finally:
                proxy.stop()
    finally:
        fake.stop()
    t = {name: statistics.median(v) for name, v in times.items()}
    ratio = max(0.0, t["proxy"] - 0.020) / t["direct"]
    note = (
        f"{steps} steps of {RESULT_CHARS:,}-character results on the Gemini API; proxy "
        f"{t['proxy'] * 1000:.1f} ms vs direct {t['direct'] * 1000:.1f} ms to the first byte"
    )
    return Measurement(ratio, t, note)
