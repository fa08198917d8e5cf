"""What recording each request costs the proxy: time to the first streamed byte with the request
log on against the same proxy with `--no-stats`, at a 100-turn session (each request's row —
the client's request counted, the cascade's events, the upstream's usage — is built after the
answer and written off the loop, so the next request is what could wait for it)."""

from __future__ import annotations

import statistics

from registry import Context, Measurement, case

from cases.proxy import RESULT_CHARS, TURNS, _body, _first_byte


@case("stats_first_byte_ratio", target=1.02)
def stats_first_byte_ratio(ctx: Context) -> Measurement:
    """Time to the first streamed byte through the proxy recording stats over the same
    request through one that records none, interleaved, at a 100-turn session (target: ≤
    1.02)."""
    from tests.support.fake_anthropic import FakeAnthropic
    from tests.support.proxy import ProxyProcess

    with ctx.scratch() as root, FakeAnthropic() as fake:
        proxies = {
            "stats": ProxyProcess(root / "stats", anthropic=fake.base_url, args=["--no-recall"]),
            "none": ProxyProcess(
                root / "none", anthropic=fake.base_url, args=["--no-recall", "--no-stats"]
            ),
        }
        for proxy in proxies.values():
            proxy.start()
        try:
            for steps in range(TURNS - 10):  # each session as an agent grew it
                for proxy in proxies.values():
                    _first_byte(proxy.port, _body(steps))
            times: dict[str, list[float]] = {name: [] for name in proxies}
            steps = TURNS - 10
            for _ in range(max(ctx.repeat, 10)):
                steps += 1
                body = _body(steps)
                for name, proxy in proxies.items():
                    times[name].append(_first_byte(proxy.port, body))
        finally:
            for proxy in proxies.values():
                proxy.stop()
    t = {name: statistics.median(v) for name, v in times.items()}
    note = (
        f"{steps} steps of {RESULT_CHARS:,}-character results; with stats "
        f"{t['stats'] * 1000:.1f} ms vs none {t['none'] * 1000:.1f} ms to the first byte"
    )
    return Measurement(t["stats"] / t["none"], t, note)
