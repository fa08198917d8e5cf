"""The request budget: what a model request may hold, and how estimates are calibrated.

A budget counts the system prompt, tools, response schema, output reserve and history before
every request (spec, final table). Context windows and output limits come from `MODELS`,
overridable per call; a fallback model gets its own budget from the same table.
"""

from __future__ import annotations

from typing import Any

import attrs

from .errors import InvalidConfig
from .prices import price_of


@attrs.frozen
class ModelSpec:
    window: int
    max_output: int


# notes/anthropic-api.md §8 (2026-10); OpenAI windows for the transcripts we import.
MODELS: dict[str, ModelSpec] = {
    "claude-opus-5-5": ModelSpec(1_000_000, 128_000),
    "claude-sonnet-5-5": ModelSpec(1_000_000, 128_000),
    "claude-haiku-5-5": ModelSpec(1_000_000, 128_000),
    "claude-opus-5": ModelSpec(1_000_000, 128_000),
    "claude-sonnet-5": ModelSpec(1_000_000, 128_000),
    "claude-opus-4-8": ModelSpec(1_000_000, 128_000),
    "claude-opus-4-7": ModelSpec(1_000_000, 128_000),
    "claude-opus-4-6": ModelSpec(1_000_000, 128_000),
    "claude-sonnet-4-6": ModelSpec(1_000_000, 128_000),
    "claude-opus-4-5": ModelSpec(200_000, 64_000),
    "claude-sonnet-4-5": ModelSpec(200_000, 64_000),
    "claude-haiku-4-5": ModelSpec(200_000, 64_000),
    "claude-opus-4-1": ModelSpec(200_000, 32_000),
    "gpt-5": ModelSpec(400_000, 128_000),
    "gpt-5-codex": ModelSpec(400_000, 128_000),
    "gpt-4.1": ModelSpec(1_047_576, 32_768),
    "gpt-4o": ModelSpec(128_000, 16_384),
    "gpt-4": ModelSpec(8_192, 4_096),
}
DEFAULT_MODEL_SPEC = ModelSpec(200_000, 32_000)

# Provider tokens per cl100k token before any usage is reported, by model family: Claude
# counts real coding transcripts 1.30× (64da7265) to 1.36× (a held-out session) what cl100k
# does (docs/decisions.md); the upper end, so a first request is not under-counted.
# Unknown families: 1.0 until the first usage report calibrates them.
PRIOR_RATIOS: dict[str, float] = {"claude": 1.36}
DEFAULT_OUTPUT_RESERVE = 20_000  # never reserve more than this unless asked (as Claude Code)


def model_spec(model: str | None) -> ModelSpec:
    """The table entry for `model`, matching dated ids (`claude-haiku-4-5-20251001`) by prefix."""
    if not model:
        return DEFAULT_MODEL_SPEC
    if model in MODELS:
        return MODELS[model]
    best = max((k for k in MODELS if model.startswith(k)), key=len, default=None)
    return MODELS[best] if best else DEFAULT_MODEL_SPEC


def input_price(model: str | None) -> float | None:
    """The model's published input price per million tokens (`prices`), or None."""
    price = price_of(model)
    return price.input if price is not None else None


def known_model(model: str) -> bool:
    """Whether `model` (or its dated id) is in the table; otherwise its window is a guess."""
    return model in MODELS or any(model.startswith(k) for k in MODELS)


def model_key(model: str | None) -> str:
    """The name calibration is kept under: a dated id (`claude-haiku-4-5-20251001`) shares
    its family's entry of the model table, so reports for either calibrate both."""
    if not model:
        return ""
    best = max((k for k in MODELS if model.startswith(k)), key=len, default=None)
    return best or model


def prior_ratio(model: str | None) -> float:
    """The ratio an estimate for `model` starts from, before any report calibrates it."""
    name = (model or "").lower()
    return next((r for family, r in PRIOR_RATIOS.items() if name.startswith(family)), 1.0)


@attrs.frozen
class Budget:
    """The limits of one request. `limit` is what the prompt may use: window − reserve."""

    model: str | None
    window: int
    output_reserve: int

    @property
    def limit(self) -> int:
        return self.window - self.output_reserve


MAX_WINDOW = 2**53 - 1
"""The largest window a request may name: what every JSON peer holds exactly (a JavaScript
number), far beyond any model's."""


def make_budget(
    model: str | None, window: int | None = None, max_output_tokens: int | None = None
) -> Budget:
    """The budget for a request; explicit `window`/`max_output_tokens` override the table."""
    for field, value in (("window", window), ("maxOutputTokens", max_output_tokens)):
        if value is not None and (not isinstance(value, int) or isinstance(value, bool)):
            raise InvalidConfig(f"{field} must be an integer, got {value!r}", field=field)
    spec = model_spec(model)
    win = spec.window if window is None else window
    if max_output_tokens is not None:
        reserve = max_output_tokens
    else:  # the model's limit, capped, and never more than a quarter of a small window
        reserve = min(spec.max_output, DEFAULT_OUTPUT_RESERVE, max(1, win // 4))
    if win <= 0 or win > MAX_WINDOW:
        raise InvalidConfig(
            f"window must be positive and at most 2^53-1, got {win}", field="window"
        )
    if reserve < 1 or reserve >= win:
        raise InvalidConfig(
            f"maxOutputTokens ({reserve}) must be at least 1 (a request must allow an "
            f"answer) and below the window ({win})",
            field="maxOutputTokens",
        )
    return Budget(model=model, window=win, output_reserve=reserve)


class Calibration:
    """Per-model ratio of provider-reported prompt tokens to our estimate.

    Anthropic's total prompt is input + cache creation + cache read tokens (notes §4). The
    ratio is smoothed so one odd report does not swing every later estimate, and clamped to a
    sane range so a bad report cannot make us think nothing fits.
    """

    MIN, MAX, WEIGHT = 0.5, 2.5, 0.5

    def __init__(self, ratios: dict[str, float] | None = None) -> None:
        self.ratios: dict[str, float] = dict(ratios or {})

    def ratio(self, model: str | None) -> float:
        """The observed ratio, or the family's prior until one is observed."""
        return self.ratios.get(model_key(model), prior_ratio(model))

    def observe(self, model: str, reported: int, estimated: int) -> float:
        if reported <= 0 or estimated <= 0:
            return self.ratio(model)
        model = model_key(model)
        sample = min(self.MAX, max(self.MIN, reported / estimated))
        old = self.ratios.get(model)
        new = sample if old is None else old * (1 - self.WEIGHT) + sample * self.WEIGHT
        self.ratios[model] = round(new, 4)
        return self.ratios[model]

    def force(self, model: str, reported: int, estimated: int, *, clamp: bool = True) -> float:
        """Adopt a provider's own count outright. A prompt-too-long report is the truth for its
        request (`clamp=False`): held to the sane range, a count 4× ours (a document we
        under-counted) would make the same request look as if it fitted."""
        model = model_key(model)
        if reported > 0 and estimated > 0:
            ratio = reported / estimated
            if clamp:
                ratio = min(self.MAX, max(self.MIN, ratio))
            self.ratios[model] = round(ratio, 4)
        return self.ratio(model)


def reported_prompt_tokens(usage: dict[str, Any]) -> int:
    """The whole prompt a provider counted: Anthropic splits it over three fields."""
    return (
        int(usage.get("input_tokens") or 0)
        + int(usage.get("cache_creation_input_tokens") or 0)
        + int(usage.get("cache_read_input_tokens") or 0)
    )
