"""Published per-token prices by model, with the date each was read from the provider's page:
what turns a saving in input-token equivalents into money (`compactd stats`, `replay --plot`)
and prices a cheaper summary model in a replay.

A model matches its own entry or a dated id of it (`claude-haiku-4-5-20251001`,
`gpt-5-2025-08-07`); anything else has no price, and whoever shows money says so rather than
guessing from a name that merely looks alike.
"""

from __future__ import annotations

import re

import attrs

ANTHROPIC_TAKEN = "2026-10"  # platform.claude.com's model pages
OPENAI_TAKEN = "2025-08"  # openai.com's API pricing page


@attrs.frozen
class Price:
    """US$ per million tokens of each kind a provider bills."""

    input: float
    output: float
    cache_read: float
    cache_write: float  # a 5-minute cache write (Anthropic); OpenAI bills no write premium
    taken: str  # when the figures were read (YYYY-MM)


def anthropic(input_price: float) -> Price:
    """Anthropic's rule on every model: output 5×, cache reads 0.1×, 5-minute writes 1.25×."""
    return Price(
        input_price, input_price * 5, input_price * 0.1, input_price * 1.25, ANTHROPIC_TAKEN
    )


def openai(input_price: float, cached: float, output: float) -> Price:
    """OpenAI's: cached input at its own price, no write premium."""
    return Price(input_price, output, cached, input_price, OPENAI_TAKEN)


# A model without a fixed price (Haiku 5.5's starts "from" one) is not listed.
PRICES: dict[str, Price] = {
    "claude-opus-5-5": anthropic(4.0),
    "claude-sonnet-5-5": anthropic(2.0),
    "claude-opus-5": anthropic(5.0),
    "claude-sonnet-5": anthropic(2.0),
    "claude-opus-4-8": anthropic(5.0),
    "claude-opus-4-7": anthropic(5.0),
    "claude-opus-4-6": anthropic(5.0),
    "claude-opus-4-5": anthropic(5.0),
    "claude-sonnet-4-6": anthropic(3.0),
    "claude-sonnet-4-5": anthropic(3.0),
    "claude-sonnet-4": anthropic(3.0),
    "claude-haiku-4-5": anthropic(1.0),
    "claude-opus-4-1": anthropic(15.0),
    "gpt-5": openai(1.25, 0.125, 10.0),
    "gpt-5-codex": openai(1.25, 0.125, 10.0),
    "gpt-5-mini": openai(0.25, 0.025, 2.0),
    "gpt-5-nano": openai(0.05, 0.005, 0.4),
    "gpt-4.1": openai(2.0, 0.5, 8.0),
    "gpt-4.1-mini": openai(0.4, 0.1, 1.6),
    "gpt-4o": openai(2.5, 1.25, 10.0),
}

_DATED = re.compile(r"-(\d{8}|\d{4}-\d{2}-\d{2})")


def price_of(model: str | None) -> Price | None:
    """The published price of `model` (or of the model a dated id names), else None."""
    if not model:
        return None
    found = PRICES.get(model)
    if found is not None:
        return found
    for key in sorted(PRICES, key=len, reverse=True):
        if model.startswith(key) and _DATED.fullmatch(model[len(key) :]):
            return PRICES[key]
    return None


def usd(tokens: float, per_million: float) -> float:
    return tokens * per_million / 1_000_000
