"""`render_request`: graph → provider request + its measure, as one pure function.

Same graph, records, viewer, budget and config → the same bytes (DESIGN §3). The measure is
the tally of exactly the parts the formatter sent, calibrated per model, so the context panel,
compaction decisions and the final request always agree.
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from typing import Any

import attrs

from ..budget import Budget, Calibration, make_budget
from ..errors import InvalidContent
from ..graph import Graph, Record
from ..policy import Policy
from ..projection import Projection, project
from ..recall import with_recall_tool
from ..tokens import COUNTER, Counter
from ..visibility import View, ViewOptions, resolve_view
from .anthropic import anthropic_tally, to_anthropic
from .conversation import (
    ALL_CATEGORIES,
    FREE,
    OUTPUT_RESERVE,
    Conversation,
    build_conversation,
    seen_conversation,
)
from .openai import to_openai
from .tally import Tally

FORMATS = ("anthropic", "openai")

CACHE_TTL_SECONDS = {"5m": 300.0, "1h": 3600.0}
"""How long the provider keeps a cached prefix after its last use, by the breakpoints' `ttl`."""


@attrs.frozen
class RequestSpec:
    """What the client's request brings besides the history."""

    model: str | None = None
    window: int | None = None
    max_output_tokens: int | None = None
    system: str | list[dict[str, Any]] | None = None
    tools: list[dict[str, Any]] | None = None
    response_schema: dict[str, Any] | None = None
    format: str = "anthropic"
    cache: bool = True
    cache_ttl: str | None = None
    recall: bool | None = None  # None: the session's `recall` policy
    # the provider applies context edits before the model sees the prompt, so Tier 1 may
    # clear there (its server path); False for one that counts the body as sent, or drops
    # the edits: what is cleared is cleared in the body
    server_edits: bool = True
    # models the client may fall back to: the request must fit each of them (spec, final
    # table: the budget is recomputed for fallback models); each gets its table's budget
    fallback_models: tuple[str, ...] = ()

    def __attrs_post_init__(self) -> None:
        if self.format not in FORMATS:
            raise InvalidContent(f"format must be one of {list(FORMATS)}", field="format")
        if self.cache_ttl not in (None, "5m", "1h"):
            raise InvalidContent("cacheTtl must be '5m' or '1h'", field="cacheTtl")

    @property
    def cache_seconds(self) -> float:
        """How long the provider keeps this request's cached prefix: what its breakpoints ask
        (5 minutes unless 1h) on Anthropic; elsewhere the cache is the provider's best effort
        (OpenAI keeps a prefix 5–10 minutes, up to an hour), so the longest it may live — a
        cache counted cold that was warm would re-write it for a clear."""
        if self.format != "anthropic":
            return CACHE_TTL_SECONDS["1h"]
        return CACHE_TTL_SECONDS[self.cache_ttl or "5m"]

    def budget(self) -> Budget:
        """The budget of the model the request is for (`window`/`maxOutputTokens` apply)."""
        return make_budget(self.model, self.window, self.max_output_tokens)

    def budgets(self) -> list[Budget]:
        """The request's model's budget, then each fallback model's, from the model table."""
        return [self.budget(), *(make_budget(m) for m in self.fallback_models)]


@attrs.frozen
class RenderParams:
    """Everything a render depends on besides the graph."""

    view: ViewOptions = attrs.field(factory=ViewOptions)
    spec: RequestSpec = attrs.field(factory=RequestSpec)


@attrs.define
class ServerEdit:
    """Tier 1's server path on a rendered request: what is sent differs from what the model
    sees. `Rendered` measures what the model sees; this keeps the request as sent."""

    # the request after the provider's clears (what it caches): built when first asked for,
    # since only a replay's cache model reads it
    build_seen: Callable[[], dict[str, Any]]
    sent_estimate: int  # our count of the request as sent, before the provider clears
    headers: dict[str, str]  # HTTP headers the request needs (the context-management beta)
    sent: Rendered | None = None  # the render of the request as sent
    _seen: dict[str, Any] | None = None

    @property
    def seen_request(self) -> dict[str, Any]:
        if self._seen is None:
            self._seen = self.build_seen()
        return self._seen


@attrs.define
class Rendered:
    _request: dict[str, Any] | None  # the body to send (None: built when first asked for)
    tally: Tally  # of what the model sees (after a server-side clear, if any)
    ratio: float
    budget: Budget  # the budget the request must fit: the smallest of its models'
    conversation: Conversation
    projection: Projection
    view: View
    server: ServerEdit | None = None
    # with fallback models: every model's budget and calibration ratio, the request's first
    models: list[tuple[Budget, float]] = attrs.field(factory=list)
    build: Callable[[], dict[str, Any]] | None = None

    @property
    def request(self) -> dict[str, Any]:
        """The body to send."""
        if self._request is None:
            assert self.build is not None
            self._request = self.build()
        return self._request

    @request.setter
    def request(self, value: dict[str, Any]) -> None:
        self._request = value

    def request_builder(self) -> Callable[[], dict[str, Any]]:
        """What gives this render's request (built or not yet), kept before a caller
        replaces `request` (the server path sends another)."""
        built, build = self._request, self.build
        if built is not None:
            return lambda: built
        assert build is not None
        return build

    @property
    def headers(self) -> dict[str, str]:
        """HTTP headers to send with `request` (a beta it uses); empty for most requests."""
        return dict(self.server.headers) if self.server is not None else {}

    @property
    def seen_request(self) -> dict[str, Any]:
        """The request as the model (and the provider's cache) sees it."""
        return self.server.seen_request if self.server is not None else self.request

    @property
    def sent_estimate(self) -> int:
        """Our count of the request as sent (the provider's clears not taken off)."""
        return self.server.sent_estimate if self.server is not None else self.tally.prompt

    @property
    def categories(self) -> dict[str, int]:
        """Calibrated tokens per category; they add up to `total`."""
        cats = {
            k: round(v * self.ratio)
            for k, v in self.tally.by_category.items()
            if k not in (OUTPUT_RESERVE, FREE)
        }
        cats[OUTPUT_RESERVE] = self.budget.output_reserve
        cats[FREE] = (
            self.budget.window
            - self.budget.output_reserve
            - sum(v for k, v in cats.items() if k != OUTPUT_RESERVE)
        )
        return cats

    @property
    def total(self) -> int:
        """The calibrated prompt estimate (what the provider will count)."""
        cats = self.categories
        return sum(v for k, v in cats.items() if k not in (OUTPUT_RESERVE, FREE))

    def total_at(self, ratio: float) -> int:
        """The prompt estimate calibrated with `ratio` (rounded per category, as `total`)."""
        return sum(
            round(v * ratio)
            for k, v in self.tally.by_category.items()
            if k not in (OUTPUT_RESERVE, FREE)
        )

    @property
    def estimate(self) -> int:
        return self.tally.prompt

    def tokens(self) -> dict[str, Any]:
        cats = self.categories
        return {
            "total": sum(v for k, v in cats.items() if k not in (OUTPUT_RESERVE, FREE)),
            "window": self.budget.window,
            "limit": self.budget.limit,
            "outputReserve": self.budget.output_reserve,
            "free": cats[FREE],
            "estimate": self.tally.prompt,
            "calibration": self.ratio,
            "categories": {k: cats[k] for k in ALL_CATEGORIES},
            "turns": self.conversation.turns_total,
            "turnsShown": self.conversation.turns_shown,
            # what the provider will clear server-side (Tier 1's server path), not in `total`
            "clearedByProvider": round((self.sent_estimate - self.tally.prompt) * self.ratio),
            **({"models": self.model_budgets()} if self.models else {}),
        }

    def model_budgets(self) -> list[dict[str, Any]]:
        """Each model's budget and what the request costs it (its own calibration)."""
        return [
            {
                "model": b.model,
                "window": b.window,
                "limit": b.limit,
                "outputReserve": b.output_reserve,
                "total": self.total_at(ratio),
                "binding": b is self.budget,
            }
            for b, ratio in self.models
        ]


def render_request(
    graph: Graph,
    options: ViewOptions,
    spec: RequestSpec,
    policy: Policy,
    calibration: Calibration | None = None,
    *,
    counter: Counter = COUNTER,
    extra_records: list[Record] | None = None,
    as_seen: tuple[Collection[str], Collection[str]] | None = None,
    sent: Rendered | None = None,
    by_provider: bool = False,
) -> Rendered:
    """`as_seen` (tool node ids whose results, and whose inputs, the provider clears): render
    what the model sees once the provider applied Tier 1's server-side clear, those results
    and inputs replaced as the time path would. `sent`, the render of the same request as
    sent, lends it its conversation (only those calls' parts differ), and on the Anthropic
    format the seen request is measured and built only when asked for. `by_provider`: the
    provider clears them (Tier 1's server path), so the model sees its placeholder, which
    names no recall handle."""
    recall = policy.recall if spec.recall is None else spec.recall
    if as_seen is not None and sent is not None:
        view = sent.view
        own = sent.projection.as_seen(*as_seen)
        conversation = seen_conversation(
            graph,
            view,
            sent.conversation,
            as_seen,
            own,
            policy,
            counter,
            recall and not by_provider,
        )
    else:
        view = resolve_view(graph, options)
        own = project(graph, view.own, extra_records)
        if as_seen is not None:
            own = own.as_seen(*as_seen)
        caller = project(graph, view.caller) if view.caller is not None else None
        conversation = build_conversation(graph, view, own, caller, policy, counter, recall)
    own_budget = spec.budget()
    budget, ratio, models = own_budget, _ratio(calibration, spec.model), []
    if spec.fallback_models:
        # the request fits the smallest: the least room in compactd's own units (a model whose
        # tokenizer counts more has less), the request's own model on a tie
        models = [(b, _ratio(calibration, b.model)) for b in spec.budgets()]
        budget, ratio = min(models, key=lambda m: m[0].limit / m[1])
    common = dict(
        model=spec.model,
        max_tokens=own_budget.output_reserve,
        system=spec.system,
        tools=with_recall_tool(spec.tools) if recall else spec.tools,
        response_schema=spec.response_schema,
    )
    if spec.format == "anthropic" and as_seen is not None and sent is not None:
        # what the model sees on the server path is measured; its request (what the provider
        # caches) is built only if asked for
        seen = conversation
        tally = anthropic_tally(
            seen,
            counter,
            system=spec.system,
            tools=common["tools"],  # type: ignore[arg-type]
            response_schema=spec.response_schema,
        )

        def build() -> dict[str, Any]:
            return to_anthropic(
                seen, counter, cache=spec.cache, cache_ttl=spec.cache_ttl, **common
            )[0]

        return Rendered(
            None, tally, ratio, budget, conversation, own, view, models=models, build=build
        )
    if spec.format == "anthropic":
        request, tally = to_anthropic(
            conversation, counter, cache=spec.cache, cache_ttl=spec.cache_ttl, **common
        )
    else:
        request, tally = to_openai(conversation, counter, **common)
    return Rendered(request, tally, ratio, budget, conversation, own, view, models=models)


def _ratio(calibration: Calibration | None, model: str | None) -> float:
    return calibration.ratio(model) if calibration is not None else 1.0
