"""The request budget (model table, per-call overrides) and calibration from reported usage."""

from __future__ import annotations

from typing import Any

import pytest
from compactd.context.budget import (
    MODELS,
    Budget,
    Calibration,
    make_budget,
    model_spec,
    prior_ratio,
    reported_prompt_tokens,
)
from compactd.context.engine import Engine
from compactd.context.errors import InvalidConfig
from compactd.context.stores.files import FileStore

from tests.engine.helpers import assistant, new_session, params, render, user


@pytest.mark.parametrize(
    ("model", "entry"),
    [
        ("claude-haiku-4-5-20251001", "claude-haiku-4-5"),
        ("claude-sonnet-4-5-20250929", "claude-sonnet-4-5"),
        ("claude-opus-4-1-20250805", "claude-opus-4-1"),
        ("claude-opus-4-6", "claude-opus-4-6"),
        ("gpt-4o-2024-08-06", "gpt-4o"),
        ("gpt-4.1-mini", "gpt-4.1"),
        ("gpt-4-0613", "gpt-4"),
    ],
)
def test_model_table_matches_dated_ids(model: str, entry: str) -> None:
    assert model_spec(model) == MODELS[entry]
    budget = make_budget(model)
    assert budget.model == model
    assert budget.window == MODELS[entry].window
    assert 0 < budget.output_reserve <= MODELS[entry].max_output
    assert budget.limit == budget.window - budget.output_reserve
    assert make_budget(entry).window == budget.window
    assert make_budget(entry).output_reserve == budget.output_reserve


def test_unknown_models_get_the_default() -> None:
    assert model_spec("some-local-llm") == model_spec(None)
    assert make_budget(None).window > 0


def test_per_call_overrides() -> None:
    assert make_budget("claude-haiku-4-5", window=50_000) == Budget(
        "claude-haiku-4-5", 50_000, make_budget("claude-haiku-4-5", window=50_000).output_reserve
    )
    b = make_budget("claude-haiku-4-5-20251001", window=50_000, max_output_tokens=1_000)
    assert (b.window, b.output_reserve, b.limit) == (50_000, 1_000, 49_000)
    b = make_budget("gpt-4", max_output_tokens=1)
    assert (b.window, b.output_reserve) == (8_192, 1)
    # a small window never defaults to reserving all of it
    b = make_budget("claude-opus-4-6", window=10_000)
    assert 0 < b.output_reserve < 10_000


@pytest.mark.parametrize(
    ("window", "max_output"),
    [
        (0, None),
        (-5, None),
        (1_000, 1_000),
        (1_000, 5_000),
        (1_000, -1),
        (1_000, 0),  # a request must allow an answer
        (2**53, None),  # more than a JSON peer holds exactly
        ("100000", None),
        (1.5e5, None),
        (True, None),
        (None, "1000"),
        (None, 2.5),
        (None, False),
    ],
)
def test_bad_budget_values(window: Any, max_output: Any) -> None:
    with pytest.raises(InvalidConfig) as err:
        make_budget("claude-haiku-4-5", window, max_output)
    assert err.value.data["field"] in ("window", "maxOutputTokens")


def test_bad_budget_values_through_render(engine: Engine) -> None:
    sid = new_session(engine, "bud")
    engine.append(sid, messages=[user("x"), assistant("y")])
    with pytest.raises(InvalidConfig):
        engine.render(sid, params(window=100, max_output_tokens=100))
    r = render(engine, sid, model="claude-haiku-4-5-20251001", window=30_000, max_output_tokens=500)
    assert r.tokens()["window"] == 30_000 and r.request["max_tokens"] == 500
    assert r.tokens()["limit"] == 29_500


def test_reported_prompt_tokens_adds_the_cache_fields() -> None:
    usage = {
        "input_tokens": 10,
        "cache_creation_input_tokens": 200,
        "cache_read_input_tokens": 3_000,
        "output_tokens": 99,
    }
    assert reported_prompt_tokens(usage) == 3_210
    assert reported_prompt_tokens({"input_tokens": 5, "cache_read_input_tokens": None}) == 5


def test_calibration_smooths_and_clamps() -> None:
    cal = Calibration()
    assert cal.ratio("m") == 1.0
    assert cal.observe("m", 150, 100) == 1.5
    assert cal.observe("m", 100, 100) == 1.25  # half way to the new sample
    assert cal.observe("x", 10_000, 100) == Calibration.MAX
    assert cal.observe("y", 1, 100) == Calibration.MIN
    assert cal.observe("m", 0, 100) == 1.25  # an empty report changes nothing
    assert cal.force("m", 300, 100) == 3.0 or cal.ratio("m") == Calibration.MAX
    assert cal.ratio("other") == 1.0


def test_a_family_prior_stands_until_the_first_report_replaces_it() -> None:
    cal = Calibration()
    assert cal.ratio("claude-opus-4-8") == cal.ratio("claude-haiku-4-5-20251001") == 1.36
    assert cal.ratio("gpt-5") == cal.ratio(None) == 1.0
    assert cal.observe("claude-opus-4-8", 130, 100) == 1.3  # the first sample, not a blend
    assert cal.ratio("claude-opus-4-8") == 1.3
    assert cal.ratio("claude-sonnet-4-5") == 1.36  # calibration is per family member


MODEL = "claude-sonnet-4-5-20250929"


def _usage(total: int) -> dict[str, int]:
    """A report whose prompt is split over Anthropic's three fields."""
    return {
        "input_tokens": total // 10,
        "cache_creation_input_tokens": total // 5,
        "cache_read_input_tokens": total - total // 10 - total // 5,
        "output_tokens": 7,
    }


def test_calibration_through_the_engine_survives_a_reload(engine: Engine, store: FileStore) -> None:
    sid = new_session(engine, "cal")
    engine.append(sid, messages=[user("please " * 300), assistant("done " * 200)])
    before = render(engine, sid, model=MODEL)
    estimate = before.estimate
    # before any report, Claude's prior: estimates in the provider's units from the start
    assert before.tokens()["calibration"] == prior_ratio(MODEL) == 1.36
    assert abs(before.total - 1.36 * estimate) <= len(before.tally.by_category)
    engine.record_usage(sid, MODEL, _usage(round(estimate * 1.5)))
    assert engine.calibration(engine.session(sid)).ratio(MODEL) == pytest.approx(1.5, abs=1e-3)

    after = render(engine, sid, model=MODEL)
    assert after.estimate == estimate  # the raw estimate is unchanged
    assert after.tokens()["calibration"] == pytest.approx(1.5, abs=1e-3)
    categories = after.tally.by_category
    assert after.total == sum(
        round(v * after.ratio) for k, v in categories.items() if k not in ("output_reserve", "free")
    )
    assert abs(after.total - 1.5 * estimate) <= len(categories)
    # another model is not affected: it keeps its family's prior
    other = render(engine, sid, model="claude-haiku-4-5")
    assert other.tokens()["calibration"] == prior_ratio("claude-haiku-4-5")
    assert render(engine, sid, model="gpt-4o").total == estimate  # no prior: 1.0

    # a new engine on the same data dir estimates exactly the same
    again = Engine(FileStore(store.root))
    reloaded = again.render(sid, params(model=MODEL))
    assert reloaded.total == after.total
    assert reloaded.tokens() == after.tokens()
