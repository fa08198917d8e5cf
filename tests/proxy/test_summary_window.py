"""Under `--window`, compactd's own summary calls fit the window too: the proxy's default for
one call's input is half the window (a session config that names its own keeps it)."""

from __future__ import annotations

from compactd.context.policy import Policy, policy_from_config
from compactd.proxy.main import summary_input

DEFAULT = Policy().summary_input_max_tokens


def test_a_small_window_bounds_a_summary_call_s_input() -> None:
    config = summary_input(32_000, {"recall": True})
    assert config == {"recall": True, "summaryInputMaxTokens": 16_000}
    assert policy_from_config(config).summary_input_max_tokens == 16_000


def test_a_large_window_or_none_leaves_the_default() -> None:
    assert policy_from_config(summary_input(1_000_000, {})).summary_input_max_tokens == DEFAULT
    assert summary_input(None, {}) == {}


def test_the_user_s_own_setting_wins() -> None:
    for key in ("summaryInputMaxTokens", "summary_input_max_tokens"):
        assert summary_input(32_000, {key: 24_000}) == {key: 24_000}
