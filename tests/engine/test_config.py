"""A session config is checked loudly: a misspelled key or a value out of range is a typed
error naming the key, never a silently ignored override."""

from __future__ import annotations

from typing import Any

import pytest
from compactd.context.errors import InvalidConfig
from compactd.context.policy import config_keys, policy_from_config


@pytest.mark.parametrize(
    ("config", "field", "words"),
    [
        ({"cascadeThresold": 0.8}, "cascadeThresold", "did you mean 'cascadeThreshold'"),
        ({"noSuchKnobAtAll": 1}, "noSuchKnobAtAll", "known: cascadeTarget"),
        ({"cascadeThreshold": 1.5}, "cascadeThreshold", "(0, 1]"),
        ({"cascadeTarget": 0}, "cascadeTarget", "(0, 1]"),
        ({"cascadeTarget": 0.95}, "cascadeTarget", "must not be above"),
        ({"microcompactEvery": 0}, "microcompactEvery", "at least 1"),
        ({"summaryKeepTurns": -1}, "summaryKeepTurns", "at least 0"),
        ({"summaryKeepTurns": 1.5}, "summaryKeepTurns", "whole number"),
        ({"snipEnabled": "yes"}, "snipEnabled", "wrong type"),
        ({"microcompactMode": "sometimes"}, "microcompactMode", "'time' or 'cache'"),
        ({"collapseMinTurns": 8, "collapseMaxTurns": 4}, "collapseMaxTurns", "at least"),
    ],
)
def test_bad_config_names_the_key(config: dict[str, Any], field: str, words: str) -> None:
    with pytest.raises(InvalidConfig) as info:
        policy_from_config(config)
    assert words in str(info.value)
    assert info.value.data.get("field") == field


def test_good_config_in_either_case_applies() -> None:
    policy = policy_from_config({"summaryKeepTurns": 1, "cascade_target": 0.5, "idleSeconds": 60})
    assert (policy.summary_keep_turns, policy.cascade_target, policy.idle_seconds) == (1, 0.5, 60.0)
    assert isinstance(policy.idle_seconds, float)
    assert "summaryKeepTurns" in config_keys() and "summary_keep_turns" not in config_keys()
