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
from ..context.stores import SessionCounts, SessionStat, open_store
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


def session_list(rows: list[Listed], loaded: set[str] | dict[str, Any]) -> t.ListResult:
    """`session/list`'s answer from the store's rows and their counts, newest first."""
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
        total=tokens["total"],
        window=tokens["window"],
        limit=tokens["limit"],
        free=tokens["free"],
        output_reserve=tokens["outputReserve"],
        categories=tokens["categories"],
        threshold=int(engine.policy(session).cascade_threshold * tokens["limit"]),
        advice=engine.measure_advice(session, rendered),
        turns=tokens["turns"],
        turns_shown=tokens["turnsShown"],
        warnings=assumptions(p, rendered.budget),
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
        return session_list(rows, self._engine.sessions if self._engine else {})

    def measure(self, p: t.RenderParams) -> t.MeasureResult:
        return measure(self.engine, self.engine.session(p.session_id), p)

    def close(self) -> None:
        self.store.close()
