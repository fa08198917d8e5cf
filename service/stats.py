"""What the proxy did and saved: a row per request it relayed, per request it sent on unmanaged,
and per call compactd made itself — kept in the store's request log (both stores) — and the
sums `compactd stats`, `compactd sessions` and the proxy's page show.

Provider-neutral: each wire's adapter reads its own usage fields into a `Usage`; nothing here
knows a provider's shapes.

The saving is in input-token equivalents, priced as the economy notes price (cache reads 0.1×,
writes 1.25×, output 5×): what the client's own requests would have cost sent straight, less
what compactd's requests cost by the upstream's own count, less compactd's own calls (summaries,
collapses, tool evidence, recall follow-ups), output included. The client's requests are priced
under the cache the upstream showed it keeps: where the session's answers report cache reads or
writes, each of the client's requests reads the previous one of its branch while that is warm
(within the cache's TTL; a client that rewrites its history goes on a new branch) and writes
the rest; where they report none,
every token is counted once. The agent's own output is the same either way and is left out. In
money, each row at its model's published price (`context/prices.py`); a model without one makes
the figure unknown, and says which.
"""

from __future__ import annotations

import datetime as dt
import logging
import time
from collections import Counter as Tally
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

import attrs

from ..context.errors import CompactdError
from ..context.prices import price_of, usd
from ..context.replay.cache_model import OUTPUT, READ, TTL_SECONDS, WRITE_5M
from ..context.stores import SessionStore

if TYPE_CHECKING:
    import asyncio

log = logging.getLogger("compactd.stats")

REQUEST, PASSED, CALL = "request", "passed", "call"
RECALL = "recall"  # a call's purpose: the proxy asking again with compactd_recall's answers
ANTHROPIC_WIRE = "anthropic"


@attrs.frozen
class Usage:
    """What an upstream counted of one request, in every provider's terms: prompt tokens
    neither read from nor written to the cache, read from it, written to it; output."""

    input: int = 0
    cache_read: int = 0
    cache_write: int = 0
    output: int = 0

    @property
    def prompt(self) -> int:
        """Every prompt token the upstream counted."""
        return self.input + self.cache_read + self.cache_write

    def to_json(self) -> dict[str, int]:
        return {
            "input": self.input,
            "cacheRead": self.cache_read,
            "cacheWrite": self.cache_write,
            "output": self.output,
        }

    @classmethod
    def from_json(cls, data: Any) -> Usage | None:
        if not isinstance(data, dict):
            return None
        return cls(*(_int(data.get(k)) for k in ("input", "cacheRead", "cacheWrite", "output")))


def _int(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


# ---- what is recorded ----------------------------------------------------------------------


@attrs.frozen
class RequestRow:
    """One client request compactd managed: what the client sent (compactd's calibrated
    estimate), what went upstream, what the upstream counted, and the request as sent."""

    at: float
    session_id: str
    agent: str
    wire: str  # "anthropic" | "responses" | "chat"
    model: str
    branch: str  # a client that rewrites its history (compacts, edits) goes on a new one
    status: int  # the upstream's answer (200, or the error the client got)
    client_tokens: int
    sent_tokens: int  # compactd's estimate of what went upstream
    usage: Usage | None  # the upstream's count (None: it said nothing)
    window: int
    limit: int
    output_reserve: int
    categories: dict[str, int]
    ttl: str | None = None  # the client's cache TTL ("5m" | "1h"; None: the provider's)
    events: list[dict[str, Any]] = attrs.field(factory=list)
    ratios: tuple[float, float, float] | None = None  # `client_tokens`' (SplitFit's) terms

    def to_json(self) -> dict[str, Any]:
        return {
            "kind": REQUEST,
            "at": self.at,
            "sessionId": self.session_id,
            "agent": self.agent,
            "wire": self.wire,
            "model": self.model,
            "branch": self.branch,
            "status": self.status,
            "clientTokens": self.client_tokens,
            "sentTokens": self.sent_tokens,
            "usage": self.usage.to_json() if self.usage else None,
            "window": self.window,
            "limit": self.limit,
            "outputReserve": self.output_reserve,
            "categories": self.categories,
            "ttl": self.ttl,
            "events": self.events,
            "ratios": [round(r, 4) for r in self.ratios] if self.ratios else None,
        }


@attrs.frozen
class PassedRow:
    """A request sent upstream as the client wrote it, and why."""

    at: float
    session_id: str | None
    agent: str
    wire: str
    model: str
    reason: str

    def to_json(self) -> dict[str, Any]:
        return {
            "kind": PASSED,
            "at": self.at,
            "sessionId": self.session_id,
            "agent": self.agent,
            "wire": self.wire,
            "model": self.model,
            "reason": self.reason,
        }


@attrs.frozen
class CallRow:
    """A call compactd made itself: a summary, a collapse, tool evidence, a recall follow-up."""

    at: float
    session_id: str
    purpose: str
    model: str
    wire: str
    usage: Usage | None
    ok: bool = True

    def to_json(self) -> dict[str, Any]:
        return {
            "kind": CALL,
            "at": self.at,
            "sessionId": self.session_id,
            "purpose": self.purpose,
            "model": self.model,
            "wire": self.wire,
            "usage": self.usage.to_json() if self.usage else None,
            "ok": self.ok,
        }


Row = RequestRow | PassedRow | CallRow


# ---- pricing --------------------------------------------------------------------------------


@attrs.define
class Priced:
    """A row's share of the saving: in input-token equivalents, and in US$ (None: no price)."""

    tokens: float = 0.0
    usd: float | None = 0.0


def _write_factor(wire: str) -> float:
    """A cache write's price against an uncached token: Anthropic bills 1.25×, OpenAI none."""
    return WRITE_5M if wire == ANTHROPIC_WIRE else 1.0


def _usage_cost(usage: Usage, wire: str, model: str, output: bool) -> Priced:
    tokens = usage.input + usage.cache_read * READ + usage.cache_write * _write_factor(wire)
    if output:
        tokens += usage.output * OUTPUT
    price = price_of(model)
    if price is None:
        return Priced(tokens, None)
    money = (
        usd(usage.input, price.input)
        + usd(usage.cache_read, price.cache_read)
        + usd(usage.cache_write, price.cache_write)
    )
    if output:
        money += usd(usage.output, price.output)
    return Priced(tokens, money)


def _baseline(row: dict[str, Any], read: int, caching: bool) -> Priced:
    """What the client's own request would have cost sent straight (see the module's
    docstring): `read` tokens from the cache, the rest written, or every token once."""
    client = _int(row.get("clientTokens"))
    if not caching:
        return _usage_cost(Usage(input=client), row["wire"], row["model"], False)
    read = min(read, client)
    usage = Usage(cache_read=read, cache_write=client - read)
    return _usage_cost(usage, row["wire"], row["model"], False)


def row_savings(rows: list[dict[str, Any]]) -> list[Priced]:
    """Each row's share of its session's saving (rows of one session, in order): a request's
    baseline less its cost, minus each call of compactd's; a passed-through request none."""
    usages = [Usage.from_json(r.get("usage")) for r in rows]
    caching = any(u is not None and (u.cache_read or u.cache_write) for u in usages)
    previous: dict[str, dict[str, Any]] = {}  # branch -> its last request
    out: list[Priced] = []
    for row, usage in zip(rows, usages, strict=True):
        kind = row.get("kind")
        if kind == CALL:
            if usage is None:
                out.append(Priced())
                continue
            cost = _usage_cost(usage, row.get("wire", ANTHROPIC_WIRE), row["model"], True)
            out.append(Priced(-cost.tokens, None if cost.usd is None else -cost.usd))
            continue
        if kind != REQUEST:
            out.append(Priced())
            continue
        branch = str(row.get("branch"))
        before = previous.get(branch)
        previous[branch] = row
        if usage is None or row.get("status") != 200:
            out.append(Priced())
            continue
        ttl = TTL_SECONDS.get(row.get("ttl") or "5m", TTL_SECONDS["5m"])
        warm = before is not None and row["at"] - before["at"] < ttl
        read = _int(before.get("clientTokens")) if warm and before is not None else 0
        baseline = _baseline(row, read, caching)
        cost = _usage_cost(usage, row["wire"], row["model"], False)
        money = None if baseline.usd is None or cost.usd is None else baseline.usd - cost.usd
        out.append(Priced(baseline.tokens - cost.tokens, money))
    return out


# ---- the client's request in the provider's units ----------------------------------------


Features = tuple[float, float, float]
"""A request counted apart: tool results and the rest (estimated tokens), and its blocks."""


@attrs.define
class SplitFit:
    """The provider's count of a request from compactd's, fitted by relative least squares on
    every request of a session as sent: tokens per estimated token for tool results and for
    everything else, and the provider's framing per block (a call id, an item's keys).

    One ratio for a whole request was off by a fifth on a client's own request, which holds
    far more results than compactd sends (a listing tokenizes unlike prose) in far fewer,
    larger blocks (compactd's cleared results are many small ones). A tokenizer's ratio for a
    kind of content does not change over a session, so every request counts; each is weighed
    by its size, so a session's first requests — the system prompt and tools alone — pin the
    ratio of everything else. A session whose requests do not tell the features apart (too
    few, or always in the same proportion) falls back to fewer of them, then to none."""

    xx: list[list[float]] = attrs.field(factory=lambda: [[0.0] * 3 for _ in range(3)])
    xy: list[float] = attrs.field(factory=lambda: [0.0] * 3)
    n: int = 0

    def add(self, features: Features, reported: int) -> None:
        if reported <= 0:
            return
        w = 1.0 / (reported * reported)
        for i in range(3):
            self.xy[i] += w * features[i] * reported
            for j in range(3):
                self.xx[i][j] += w * features[i] * features[j]
        self.n += 1

    def coefficients(self) -> Features | None:
        """(results, rest, per block), or None; the block term only when the requests can
        tell it apart (else it is left at 0)."""
        if self.n < 3:
            return None
        for used in ((0, 1, 2), (0, 1)):
            solved = _solve(
                [[self.xx[i][j] for j in used] for i in used], [self.xy[i] for i in used]
            )
            if solved is not None and solved[0] > 0 and solved[1] > 0:
                out = [0.0, 0.0, 0.0]
                for k, i in enumerate(used):
                    out[i] = solved[k]
                return out[0], out[1], out[2]
        return None

    def estimate(self, features: Features) -> float | None:
        found = self.coefficients()
        return None if found is None else sum(c * f for c, f in zip(found, features, strict=True))


def _solve(a: list[list[float]], b: list[float]) -> list[float] | None:
    """`a x = b` by elimination with partial pivoting; None when `a` is near singular (a
    pivot under a thousandth of its column's scale)."""
    n = len(b)
    scale = [max(abs(a[i][i]), 1e-300) for i in range(n)]
    m = [[*row, rhs] for row, rhs in zip(a, b, strict=True)]
    for col in range(n):
        pivot = max(range(col, n), key=lambda r: abs(m[r][col]))
        if abs(m[pivot][col]) < 1e-3 * scale[col]:
            return None
        m[col], m[pivot] = m[pivot], m[col]
        for r in range(col + 1, n):
            f = m[r][col] / m[col][col]
            for c in range(col, n + 1):
                m[r][c] -= f * m[col][c]
    x = [0.0] * n
    for r in range(n - 1, -1, -1):
        x[r] = (m[r][n] - sum(m[r][c] * x[c] for c in range(r + 1, n))) / m[r][r]
    return x


# ---- the sums -------------------------------------------------------------------------------


@attrs.define
class Sums:
    """What one line of `compactd stats` adds up (a session, a day, or everything)."""

    requests: int = 0
    passed_through: int = 0
    reasons: Tally[str] = attrs.field(factory=Tally)
    client_input_tokens: int = 0
    upstream_input_tokens: int = 0
    cache_read_input_tokens: int = 0
    cache_creation_input_tokens: int = 0
    output_tokens: int = 0
    compactd_calls: int = 0
    compactd_input_tokens: int = 0
    compactd_output_tokens: int = 0
    saved_input_tokens: float = 0.0
    saved_usd: float = 0.0
    unpriced: set[str] = attrs.field(factory=set)

    def add(self, row: dict[str, Any], share: Priced) -> None:
        kind = row.get("kind")
        usage = Usage.from_json(row.get("usage"))
        if kind == PASSED:
            self.requests += 1
            self.passed_through += 1
            self.reasons[str(row.get("reason"))] += 1
            return
        if kind == CALL:
            self.compactd_calls += 1
            if usage is not None:
                self.compactd_input_tokens += usage.prompt
                self.compactd_output_tokens += usage.output
        elif kind == REQUEST:
            self.requests += 1
            self.client_input_tokens += _int(row.get("clientTokens"))
            if usage is not None:
                self.upstream_input_tokens += usage.prompt
                self.cache_read_input_tokens += usage.cache_read
                self.cache_creation_input_tokens += usage.cache_write
                self.output_tokens += usage.output
        else:
            return
        self.saved_input_tokens += share.tokens
        if share.usd is None:
            self.unpriced.add(str(row.get("model")))
        else:
            self.saved_usd += share.usd

    def to_json(self) -> dict[str, Any]:
        return {
            "requests": self.requests,
            "passedThrough": self.passed_through,
            "passedReasons": dict(sorted(self.reasons.items())),
            "clientInputTokens": self.client_input_tokens,
            "upstreamInputTokens": self.upstream_input_tokens,
            "cacheReadInputTokens": self.cache_read_input_tokens,
            "cacheCreationInputTokens": self.cache_creation_input_tokens,
            "outputTokens": self.output_tokens,
            "compactdCalls": self.compactd_calls,
            "compactdInputTokens": self.compactd_input_tokens,
            "compactdOutputTokens": self.compactd_output_tokens,
            "savedInputTokens": round(self.saved_input_tokens),
            "savedUsd": None if self.unpriced else round(self.saved_usd, 4),
            "unpricedModels": sorted(self.unpriced),
        }


@attrs.define
class SessionSums(Sums):
    session_id: str = ""
    agent: str | None = None
    models: Tally[str] = attrs.field(factory=Tally)
    first_at: float | None = None
    last_at: float | None = None

    def add(self, row: dict[str, Any], share: Priced) -> None:
        super().add(row, share)
        at = float(row["at"])
        self.first_at = at if self.first_at is None else min(self.first_at, at)
        self.last_at = at if self.last_at is None else max(self.last_at, at)
        if row.get("kind") in (REQUEST, PASSED):
            self.models[str(row.get("model"))] += 1
            if self.agent is None and row.get("agent"):
                self.agent = str(row["agent"])

    @property
    def state(self) -> str:
        """Managed, or how many of its requests went upstream unmanaged."""
        if not self.passed_through:
            return "managed"
        if self.passed_through == self.requests:
            return f"unmanaged ({self.passed_through} passed through)"
        return f"{self.passed_through} of {self.requests} passed through"

    def to_json(self) -> dict[str, Any]:
        return {
            "sessionId": self.session_id,
            "agent": self.agent,
            "model": self.models.most_common(1)[0][0] if self.models else None,
            "state": self.state,
            "firstAt": self.first_at,
            "lastAt": self.last_at,
            **super().to_json(),
        }


def local_day(at: float) -> str:
    return dt.datetime.fromtimestamp(at).strftime("%Y-%m-%d")


def summarize(
    rows: Iterable[dict[str, Any]], since: float | None = None, session: str | None = None
) -> dict[str, Any]:
    """`{"sessions": [...], "days": [...], "totals": {...}}` of the request log's rows (newest
    session first): each row priced within its session's rows (in order), then the rows from
    `since` on (of `session`, when given; a prefix of its id) summed."""
    by_session: dict[str, list[dict[str, Any]]] = {}
    for row in rows:
        sid = row.get("sessionId")
        by_session.setdefault(str(sid) if sid else "(unknown)", []).append(row)
    sessions: dict[str, SessionSums] = {}
    days: dict[str, Sums] = {}
    totals = Sums()
    for sid, own in by_session.items():
        if session is not None and not sid.startswith(session):
            continue
        own.sort(key=lambda r: r["at"])
        for row, share in zip(own, row_savings(own), strict=True):
            if since is not None and row["at"] < since:
                continue
            sessions.setdefault(sid, SessionSums(session_id=sid)).add(row, share)
            days.setdefault(local_day(row["at"]), Sums()).add(row, share)
            totals.add(row, share)
    ordered = sorted(sessions.values(), key=lambda s: -(s.last_at or 0))
    return {
        "sessions": [s.to_json() for s in ordered],
        "days": [{"date": day, **days[day].to_json()} for day in sorted(days)],
        "totals": {"sessions": len(ordered), **totals.to_json()},
    }


def session_summaries(store: SessionStore) -> dict[str, dict[str, Any]]:
    """Each session's sums, by id (what `compactd sessions` shows beside a proxied session)."""
    return {s["sessionId"]: s for s in summarize(store.read_requests())["sessions"]}


# ---- recording -------------------------------------------------------------------------------


class Recorder:
    """Takes rows on the event loop and writes them to the store's request log in the
    background, in order, off the loop: recording never holds a client's request up, and a
    write that fails is logged, never the client's failure. Listeners (the page) hear of each
    row as it is taken."""

    def __init__(
        self,
        store: SessionStore,
        run: Callable[[Callable[[], Any]], Any],
        *,
        enabled: bool = True,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.store = store
        self.enabled = enabled
        self.clock = clock
        self._run = run  # runs a blocking call off the loop; returns an awaitable
        self._pending: list[dict[str, Any]] = []
        self._flushing: asyncio.Task[None] | None = None
        self._lock: asyncio.Lock | None = None  # a write, or the first read, at a time
        self.listeners: list[Callable[[dict[str, Any]], None]] = []
        self._seen: list[dict[str, Any]] | None = None  # every row, once the page asked
        self._loading: list[dict[str, Any]] | None = None  # rows taken while reading

    @property
    def lock(self) -> asyncio.Lock:
        if self._lock is None:
            import asyncio  # here: a listing reads the sums, and loads no event loop

            self._lock = asyncio.Lock()
        return self._lock

    def take(self, row: Row) -> None:
        if not self.enabled:
            return
        data = row.to_json()
        self._pending.append(data)
        for held in (self._seen, self._loading):
            if held is not None:
                held.append(data)
        for listener in list(self.listeners):
            try:
                listener(data)
            except Exception:
                log.exception("a stats listener failed")
        if self._flushing is None or self._flushing.done():
            import asyncio

            self._flushing = asyncio.ensure_future(self._flush())

    async def _flush(self) -> None:
        while self._pending:
            async with self.lock:
                rows, self._pending = self._pending, []
                try:
                    await self._run(lambda rows=rows: self.store.log_requests(rows))
                except (CompactdError, OSError) as exc:
                    log.warning("%d request stat(s) not recorded: %s", len(rows), exc)

    async def drain(self) -> None:
        """Every row taken so far is written (at shutdown, or before a test reads them)."""
        import asyncio

        while self._flushing is not None and not self._flushing.done():
            await asyncio.shield(self._flushing)

    async def rows(self) -> list[dict[str, Any]]:
        """Every row: the request log as read once (off the loop; no write meanwhile), and
        every row taken since."""
        if self._seen is None:
            async with self.lock:
                if self._seen is None:
                    self._loading = list(self._pending)  # taken, not written yet
                    try:
                        read = await self._run(self.store.read_requests)
                        self._seen = [*read, *self._loading]
                    finally:
                        self._loading = None
        return self._seen

    def now(self) -> float:
        return self.clock()
