"""The cache model on hand-made request sequences (Anthropic's rules, notes §4)."""

from __future__ import annotations

import pytest
from compactd.context.replay.cache_model import READ, WRITE_1H, WRITE_5M, CacheModel, price_recorded


def blocks(*sizes: int, tag: str = "b") -> list[tuple[bytes, int]]:
    return [(f"{tag}{i}".encode(), n) for i, n in enumerate(sizes)]


def test_first_request_writes_everything() -> None:
    cache = CacheModel("5m", min_prefix_tokens=0)
    charge = cache.request(blocks(1000, 2000), at=0)
    assert (charge.read, charge.written, charge.uncached) == (0, 3000, 0)
    assert charge.cost == pytest.approx(3000 * WRITE_5M)


def test_append_only_rereads_everything_but_the_new_tail() -> None:
    cache = CacheModel("5m", min_prefix_tokens=0)
    cache.request(blocks(1000, 2000), at=0)
    charge = cache.request(blocks(1000, 2000, 500), at=10)
    assert (charge.read, charge.written) == (3000, 500)
    assert charge.cost == pytest.approx(3000 * READ + 500 * WRITE_5M)
    third = cache.request(blocks(1000, 2000, 500, 700), at=20)
    assert (third.read, third.written) == (3500, 700)


def test_a_change_at_position_p_rewrites_from_p() -> None:
    cache = CacheModel("5m", min_prefix_tokens=0)
    cache.request(blocks(1000), at=0)  # the session grew request by request
    cache.request(blocks(1000, 2000), at=1)
    cache.request(blocks(1000, 2000, 3000), at=2)
    changed = blocks(1000, 2000, 3000)
    changed[1] = (b"cleared", 20)
    charge = cache.request(changed, at=5)
    assert (charge.read, charge.written) == (1000, 3020)


def test_the_system_breakpoint_sensitivity_reads_the_system_prompt_after_any_change() -> None:
    """economy.md reads only whole earlier requests: after a change in the first message no
    earlier request is a prefix, and the system prompt is written again. The sensitivity reads
    the leading `fixed` blocks back from any live request that began with them."""
    first = [(b"system", 20_000), (b"m0", 3000), (b"m1", 2000)]
    changed = [(b"system", 20_000), (b"summary", 1500), (b"m1", 2000)]
    plain = CacheModel("1h", min_prefix_tokens=0)
    plain.request(first, at=0, fixed=1)
    assert plain.request(changed, at=1, fixed=1).read == 0
    sensitive = CacheModel("1h", min_prefix_tokens=0, system_breakpoint=True)
    sensitive.request(first, at=0, fixed=1)
    charge = sensitive.request(changed, at=1, fixed=1)
    assert (charge.read, charge.written) == (20_000, 3500)
    other = [(b"another system", 20_000), (b"m1", 2000)]
    assert sensitive.request(other, at=2, fixed=1).read == 0  # a different prompt is not read
    grown = [*changed, (b"m2", 700)]  # a whole earlier request still wins when it is longer
    assert sensitive.request(grown, at=3, fixed=1).read == 23_500


def test_a_gap_longer_than_the_ttl_rewrites_all() -> None:
    cache = CacheModel("5m", min_prefix_tokens=0)
    cache.request(blocks(1000, 2000), at=0)
    charge = cache.request(blocks(1000, 2000, 10), at=301)
    assert (charge.read, charge.written) == (0, 3010)


def test_a_hit_refreshes_the_ttl() -> None:
    cache = CacheModel("5m", min_prefix_tokens=0)
    cache.request(blocks(1000), at=0)
    assert cache.request(blocks(1000, 5), at=250).read == 1000  # refreshes until 550
    assert cache.request(blocks(1000, 5, 5), at=500).read == 1005


def test_one_hour_ttl_costs_more_to_write_and_lives_longer() -> None:
    cache = CacheModel("1h", min_prefix_tokens=0)
    first = cache.request(blocks(1000), at=0)
    assert first.cost == pytest.approx(1000 * WRITE_1H)
    assert cache.request(blocks(1000, 1), at=3000).read == 1000
    with pytest.raises(ValueError):
        CacheModel("2h")


def test_short_prompts_are_not_cached() -> None:
    cache = CacheModel("5m", min_prefix_tokens=1024)
    charge = cache.request(blocks(100, 200), at=0)
    assert (charge.written, charge.uncached) == (0, 300)
    assert cache.request(blocks(100, 200, 5), at=1).read == 0


def test_summary_calls_pay_output_at_five_times() -> None:
    cache = CacheModel("5m", min_prefix_tokens=0)
    charge = cache.summary_call(blocks(400, tag="s"), at=0, output_tokens=100)
    assert charge.cost == pytest.approx(400 * WRITE_5M + 100 * 5)


def test_recorded_usage_prices_the_three_fields() -> None:
    usage = {
        "input_tokens": 10,
        "cache_creation_input_tokens": 100,
        "cache_read_input_tokens": 1000,
    }
    assert price_recorded(usage) == pytest.approx(10 + 125 + 100)
    assert price_recorded(usage, "1h") == pytest.approx(10 + 200 + 100)


def test_llm_calls_are_priced_as_the_economy_notes_say() -> None:
    """A summary at its input plus 5x its output, the output counted at no less than 2,000
    tokens (a collapse segment 100); tool evidence at what it reads plus 5x 200 a result."""
    from compactd.context.replay.cache_model import price_call

    assert price_call("rolling", 30_000, 800) == 30_000 + 5 * 2_000
    assert price_call("rolling", 30_000, 3_000) == 30_000 + 5 * 3_000
    assert price_call("collapse", 5_000, 40) == 5_000 + 5 * 100
    assert price_call("evidence", 12_000, 300, results=4) == 12_000 + 5 * 800


def test_a_cheaper_summary_model_is_priced_by_its_published_price() -> None:
    from compactd.context.replay.cache_model import summary_price

    assert summary_price("claude-haiku-4-5-20251001", "claude-opus-4-6") == 1.0 / 5.0
    assert summary_price(None, "claude-opus-4-6") == 1.0  # the request's own model
    assert summary_price("some-local-model", "claude-opus-4-6") == 1.0  # no price known
