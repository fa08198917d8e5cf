"""Read-only answers, from the store in this process: a listing and a context panel exactly as
a daemon would give them (`session/list`, `context/measure`), without spawning one.

`compactd sessions` and `compactd context` (without `--cascade`) only look, so the CLI reads
the store itself through a `StoreReader` rather than paying for a daemon's start (its imports,
its tokenizer, its process) on every look; the daemon's handlers build their answers with the
same `session_list` and `measure`. Nothing here writes a session: the only file it may write
is a listing's kept counts, the cache a daemon's listing keeps too.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..context.policy import policy_from_config
from ..context.stores import SessionCounts, SessionStat, SessionStore, open_store
from ..protocol import types as t

if TYPE_CHECKING:
    from ..context.budget import Budget
    from ..context.engine import Engine
    from ..context.engine import RenderParams as EngineRenderParams
    from ..context.session import Session

WINDOW_PARAMS = "window and maxOutputTokens"  # a client may name them in its own words

Listed = tuple[str, SessionStat, SessionCounts]


def engine_params(p: t.RenderParams | t.CompactParams | t.SnipParams) -> EngineRenderParams:
    """A request's wire params as the engine's view and request spec."""
    from ..context.engine import RenderParams as EngineRenderParams
    from ..context.render.request import RequestSpec
    from ..context.visibility import ViewOptions

    view = ViewOptions(
        branch=p.branch,
        viewer=getattr(p, "viewer", None),
        callers=getattr(p, "callers", False),
        subcalls=getattr(p, "subcalls", False),
        expose=getattr(p, "expose", None),
    )
    spec = RequestSpec(
        model=p.model,
        window=p.window,
        max_output_tokens=p.max_output_tokens,
        system=p.system,
        tools=p.tools,
        response_schema=getattr(p, "response_schema", None),
        format=p.format,
        cache=getattr(p, "cache", True),
        cache_ttl=getattr(p, "cache_ttl", None),
        recall=getattr(p, "recall", None),
        fallback_models=tuple(getattr(p, "fallback_models", None) or ()),
    )
    return EngineRenderParams(view=view, spec=spec)


def assumptions(p: t.RenderParams, budget: Budget) -> list[str]:
    """What the budget assumed that the client did not say: an unknown model's window, and
    the output reserve the request was then measured with (the one the panel shows)."""
    from ..context.budget import known_model

    if p.model and p.window is None and not known_model(p.model):
        return [
            f"unknown model {p.model!r}: assumed a {budget.window:,}-token window and a "
            f"{budget.output_reserve:,}-token output reserve ({WINDOW_PARAMS} say otherwise)"
        ]
    return []


def panel_fields(tokens: dict[str, Any]) -> dict[str, Any]:
    """A rendered request's counts (`Rendered.tokens()`, or the proxy's record of one it sent)
    as the fields a context panel shows, by their wire types' names."""
    return {
        "total": int(tokens.get("total") or 0),
        "window": int(tokens.get("window") or 0),
        "limit": int(tokens.get("limit") or 0),
        "free": int(tokens.get("free") or 0),
        "output_reserve": int(tokens.get("outputReserve") or 0),
        "categories": dict(tokens.get("categories") or {}),
        "turns": int(tokens.get("turns") or 0),
        "turns_shown": int(tokens.get("turnsShown") or 0),
    }


def sent_request(sent: dict[str, Any] | None) -> t.SentRequest | None:
    """The last request as the proxy recorded it (`Engine.last_sent`), typed."""
    if sent is None:
        return None
    return t.SentRequest(
        at=float(sent.get("at") or 0.0),
        model=sent.get("model"),
        reported=sent.get("reported"),
        **panel_fields(sent),
    )


def proxied_session(sums: dict[str, Any] | None) -> t.ProxiedSession | None:
    """A session's sums in the request log (`service.stats`), as `session/list` shows them."""
    if sums is None:
        return None
    return t.ProxiedSession(
        agent=sums["agent"],
        model=sums["model"],
        state=sums["state"],
        requests=sums["requests"],
        passed_through=sums["passedThrough"],
        saved_input_tokens=sums["savedInputTokens"],
        saved_usd=sums["savedUsd"],
    )


def proxied_sums(store: SessionStore) -> dict[str, dict[str, Any]]:
    """Each proxied session's sums from the store's request log, by id."""
    from .stats import session_summaries

    return session_summaries(store)


def session_list(
    rows: list[Listed],
    loaded: set[str] | dict[str, Any],
    proxied: dict[str, dict[str, Any]] | None = None,
) -> t.ListResult:
    """`session/list`'s answer from the store's rows and their counts, newest first, with what
    the proxy did for each session it relayed."""
    proxied = proxied or {}
    out = [
        t.SessionInfo(
            sid,
            stat.size,
            stat.mtime,
            sid in loaded,
            source=counts.source,
            title=counts.title,
            turns=counts.turns,
            tokens=counts.tokens,
            proxied=proxied_session(proxied.get(sid)),
        )
        for sid, stat, counts in rows
    ]
    out.sort(key=lambda info: (-info.modified, info.session_id))
    return t.ListResult(out)


def measure(engine: Engine, session: Session, p: t.RenderParams) -> t.MeasureResult:
    """`context/measure`'s answer: the request as it would be rendered now, by category, with
    the cascade's threshold and the advice the panel shows; nothing is kept of the render."""
    rendered = engine.render(session.id, engine_params(p), remember=False)
    tokens = rendered.tokens()
    return t.MeasureResult(
        **panel_fields(tokens),
        threshold=int(engine.policy(session).cascade_threshold * tokens["limit"]),
        advice=engine.measure_advice(session, rendered),
        warnings=assumptions(p, rendered.budget),
        sent=sent_request(engine.last_sent(session.id)),
    )


class StoreReader:
    """The store of a data dir (or a database), read in this process: `list_sessions` and
    `measure` answer what a daemon over the same store would. A bad config or store URL is
    the engine's typed error (`CompactdError`), as a daemon's start would report it. The
    engine (and its tokenizer) is loaded only when a session must be rendered: a listing
    whose counts are kept reads them and nothing else."""

    def __init__(
        self,
        data_dir: Path | str | None,
        store_url: str | None = None,
        config: dict[str, Any] | None = None,
        limits: dict[str, int] | None = None,
    ) -> None:
        defaults = {**(config or {}), **(limits or {})}
        policy_from_config(defaults)  # a misspelled knob is refused before the store opens
        url = store_url or os.environ.get("COMPACTD_STORE") or None
        self.store = open_store(url, Path(data_dir) if data_dir else None)
        self.defaults = defaults
        self._engine: Engine | None = None

    @property
    def engine(self) -> Engine:
        if self._engine is None:
            from ..context.engine import Engine

            self._engine = Engine(self.store, defaults=self.defaults)
        return self._engine

    def list_sessions(self, prefix: str | None = None) -> t.ListResult:
        """Every session whose id starts with `prefix`; one whose counts are missing or older
        than its log is counted now and its counts kept, as a daemon's listing does."""
        rows: list[Listed] = []
        for sid, stat, counts in self.store.listing():
            if prefix is not None and not sid.startswith(prefix):
                continue
            if counts is None or counts.cursor != stat.cursor:
                counts = self.engine.keep_counts(sid)
            rows.append((sid, stat, counts))
        loaded = self._engine.sessions if self._engine else {}
        return session_list(rows, loaded, proxied_sums(self.store) if rows else None)

    def measure(self, p: t.RenderParams) -> t.MeasureResult:
        return measure(self.engine, self.engine.session(p.session_id), p)

    def close(self) -> None:
        self.store.close()
