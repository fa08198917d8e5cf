"""Wire types of every method: attrs classes with snake_case fields, camelCase on the wire.

`METHODS` maps each method (named once, in `methods.py`) to its params and result types; it is
the one method table: the JSON Schema export (`compactd.protocol.schema`) and the daemon's
handlers (which take their params type from it) are both driven by it, so they cannot
disagree. Free-form parts (messages, blocks, the rendered request) are plain JSON objects.
"""

from __future__ import annotations

from typing import Any, Literal

import attrs

from . import methods as m

Json = dict[str, Any]
Format = Literal["anthropic", "openai"]
Expose = Literal["io", "full", "none"]


# ---- sessions -----------------------------------------------------------------------------


@attrs.define
class OpenParams:
    """Open a session, creating it if needed (a new id when none is given)."""

    session_id: str | None = None
    config: Json | None = None


@attrs.define
class OpenResult:
    session_id: str
    branch: str
    head: str | None
    created: bool


@attrs.define
class ListParams:
    """`prefix`: only the sessions whose id starts with it (how a short id is resolved)."""

    prefix: str | None = None


@attrs.define
class ProxiedSession:
    """What the proxy recorded of a session it relayed (`compactd stats` has the rest)."""

    agent: str | None
    model: str | None
    state: str  # "managed", or how many of its requests went upstream unmanaged
    requests: int
    passed_through: int
    saved_input_tokens: int  # in input-token equivalents (`compactd stats` says how priced)
    saved_usd: float | None  # None: a model without a published price


@attrs.define
class SessionInfo:
    """One stored session: what `compactd sessions` shows (newest first)."""

    session_id: str
    size_bytes: int
    modified: float
    loaded: bool
    source: str | None = None  # the importer's format ("claude-code", …); None: made live
    title: str | None = None
    turns: int = 0
    tokens: int = 0  # the current branch rendered with the defaults, in compactd's estimate
    proxied: ProxiedSession | None = None  # a session the proxy relayed


@attrs.define
class ListResult:
    sessions: list[SessionInfo]


@attrs.define
class GetParams:
    """Inspect a session (its branch path and records), or one node with its children —
    a completed function's internals, a cleared or snipped tool result."""

    session_id: str
    branch: str | None = None
    node_id: str | None = None


@attrs.define
class AppendParams:
    """Append provider-format `messages` or raw `nodes` to a branch (or a running
    function's thread). `expectedHead` (null: an empty thread) guards against races."""

    session_id: str
    messages: list[Json] | None = None
    nodes: list[Json] | None = None
    format: Format = "anthropic"
    branch: str | None = None
    function_id: str | None = None
    expected_head: str | None = None


@attrs.define
class AppendResult:
    head: str | None
    node_ids: list[str]


@attrs.define
class ToolResultParams:
    session_id: str
    tool_use_id: str
    content: str | list[Json]
    is_error: bool = False


@attrs.define
class HeadResult:
    head: str | None


@attrs.define
class FunctionStartParams:
    """Start a function (sub-agent). With `toolUseId` the model called it as that tool and
    its output becomes that call's result."""

    session_id: str
    name: str
    input: Any = None
    tool_use_id: str | None = None
    parent: str | None = None
    expose: Expose = "io"
    branch: str | None = None
    function_id: str | None = None


@attrs.define
class FunctionStartResult:
    function_id: str


@attrs.define
class FunctionCompleteParams:
    session_id: str
    function_id: str
    output: str | list[Json] = ""
    status: Literal["completed", "error"] = "completed"


@attrs.define
class BranchParams:
    session_id: str
    name: str
    from_node: str | None = None


@attrs.define
class CheckoutParams:
    session_id: str
    branch: str


@attrs.define
class BranchResult:
    branch: str
    head: str | None


@attrs.define
class ImportParams:
    """Import a transcript file the daemon can read (Claude Code, Codex, OpenHands,
    SWE-agent); one session per conversation in it."""

    path: str
    new: bool = False  # import again even if this transcript was imported before
    work_done_token: str | None = None


@attrs.define
class ImportResult:
    """`existing`: the ids among `sessionIds` that were imported before from the same file
    (returned instead of a duplicate unless `new`)."""

    session_ids: list[str]
    warnings: list[str]
    existing: list[str] = attrs.field(factory=list)


# ---- context ------------------------------------------------------------------------------


@attrs.define
class ProviderError:
    """An error the model provider returned (for Tier 5): HTTP status and message."""

    status: int
    message: str


@attrs.define
class RenderParams:
    """Render the context for the next model request (with `cascade`, compacting first)."""

    session_id: str
    branch: str | None = None
    viewer: str | None = None
    callers: bool = False
    subcalls: bool = False
    expose: Expose | None = None
    model: str | None = None
    window: int | None = None
    max_output_tokens: int | None = None
    system: str | list[Json] | None = None
    tools: list[Json] | None = None
    response_schema: Json | None = None
    format: Format = "anthropic"
    cascade: bool = False
    # a preview: the cascade's changes are rendered and reported but nothing is written (no
    # record, no activity, a reported overflow is left for the next render)
    dry_run: bool = False
    cache: bool = True
    cache_ttl: Literal["5m", "1h"] | None = None
    overflow: ProviderError | None = None
    work_done_token: str | None = None
    # markers name recall handles and the request carries `compactd_recall` (default: the
    # session's `recall` config)
    recall: bool | None = None
    # the request must fit each of these models too; `tokens.models` reports every budget
    fallback_models: list[str] | None = None


@attrs.define
class ModelBudget:
    """One model's budget for the rendered request (`binding`: the tightest)."""

    model: str | None
    window: int
    limit: int
    output_reserve: int
    total: int
    binding: bool


@attrs.define
class RenderTokens:
    """The rendered request's size: `total` of `limit` (window − output reserve), by category,
    in the provider's units once calibrated (`estimate` is compactd's own count)."""

    total: int
    window: int
    limit: int
    output_reserve: int
    free: int
    estimate: int
    calibration: float
    categories: dict[str, int]
    turns: int
    turns_shown: int
    # what the provider will clear server-side (Tier 1's server path), not in `total`
    cleared_by_provider: int = 0
    models: list[ModelBudget] | None = None  # with `fallbackModels`: every model's budget


@attrs.define
class CompactionEvent:
    """What one tier did (or why it did not): `context/compacted` without the session."""

    tier: str
    applied: bool
    tokens_before: int
    tokens_after: int
    reason: str
    record_ids: list[str]
    details: Json


@attrs.define
class RenderResult:
    """`warnings`: what the daemon assumed (an unknown model's window, …)."""

    request: Json  # the HTTP body to send
    tokens: RenderTokens
    events: list[CompactionEvent]
    # HTTP headers the request needs — {"anthropic-beta": "context-management-2025-06-27"}
    # when it carries Tier 1's server-side edit; send them with it (the SDK's `extra_headers`)
    headers: dict[str, str] = attrs.Factory(dict)
    warnings: list[str] = attrs.field(factory=list)


@attrs.define
class SentRequest:
    """The last request a front sent for the session, as it measured it then: at the model and
    window it used, its system prompt and tools counted, beside the provider's own count."""

    at: float
    model: str | None
    total: int  # compactd's estimate, calibrated
    reported: int | None  # the provider's count of the same request
    window: int
    limit: int
    output_reserve: int
    free: int
    categories: dict[str, int]
    turns: int
    turns_shown: int


@attrs.define
class MeasureResult:
    total: int
    window: int
    limit: int
    free: int
    output_reserve: int
    categories: dict[str, int]
    threshold: int
    advice: str | None
    turns: int
    turns_shown: int
    warnings: list[str] = attrs.field(factory=list)
    sent: SentRequest | None = None  # a proxied session's last request, as sent


@attrs.define
class CompactParams:
    """/compact: summarize now (Tier 4), shaped by `instructions`."""

    session_id: str
    branch: str | None = None
    instructions: str | None = None
    model: str | None = None
    window: int | None = None
    max_output_tokens: int | None = None
    system: str | list[Json] | None = None
    tools: list[Json] | None = None
    format: Format = "anthropic"
    work_done_token: str | None = None


@attrs.define
class CompactResult:
    """`applied: false` for a /compact that did nothing: no provider, nothing to summarize,
    no gain, or a provider failure (`failure`: why the provider gave no summary — `empty`,
    `timeout`, `rate_limited`, `overloaded`, `auth`, `unavailable`, …); nothing was written
    then."""

    applied: bool
    tokens_before: int
    tokens_after: int
    reason: str | None
    provider: str | None
    covered_turns: int
    failure: str | None = None


@attrs.define
class SnipParams:
    session_id: str
    branch: str | None = None
    target_tokens: int | None = None
    model: str | None = None
    window: int | None = None
    max_output_tokens: int | None = None
    system: str | list[Json] | None = None
    tools: list[Json] | None = None
    format: Format = "anthropic"


@attrs.define
class SnipResult:
    applied: bool
    removed_turns: int
    tokens_before: int
    tokens_after: int
    reason: str | None


@attrs.define
class UncollapseParams:
    session_id: str
    collapse_id: str


@attrs.define
class UncollapseResult:
    applied: bool
    record_id: str | None


@attrs.define
class RecallParams:
    """Answer the model's `compactd_recall` call: lines of what a handle in a rendered
    marker stands for, at most `recallMaxChars` characters of whole lines — or, with
    `search`, the lines that contain it (plain text; `regex`: an RE2 regular expression),
    each with its number and `context` lines around it (default 1, at most 5); `startLine`
    and `endLine` then bound the lines searched."""

    session_id: str
    handle: str
    start_line: int | None = None
    end_line: int | None = None
    branch: str | None = None
    search: str | None = None
    regex: bool | None = None
    context: int | None = None


@attrs.define
class RecallResult:
    """`endLine`: the last line the answer covers (a cut one, `truncated`, goes on from the
    next); `matches`: for a search, how many lines matched in all."""

    text: str
    total_lines: int
    start_line: int
    end_line: int
    truncated: bool
    matches: int | None = None


@attrs.define
class ReportUsageParams:
    """What the provider said about the last rendered request: its usage, the context edits
    it applied, or the error it returned (a prompt-too-long error triggers Tier 5 on the next
    render)."""

    session_id: str
    model: str
    usage: Json | None = None
    error: ProviderError | None = None
    applied_edits: list[Json] | None = None
    branch: str | None = None


@attrs.define
class ReportUsageResult:
    calibration: float
    reported_tokens: int | None
    estimated_tokens: int | None
    overflow: bool
    limit_tokens: int | None


@attrs.define
class ReplayParams:
    """Replay a transcript under the cascade, in a scratch store (nothing is kept), and price
    every request with the provider's cache rules; also for "no management" and, when the
    transcript records usage, for the recorded run."""

    path: str
    window: int | None = None
    reserve: int | None = None
    ttl: Literal["5m", "1h"] = "5m"
    summary_provider: Literal["anthropic", "client", "digest"] | None = None
    config: Json | None = None
    baseline: bool = True
    index: int = 0
    work_done_token: str | None = None
    model: str | None = None  # default: the transcript's own model
    # the system prompt every request carries, in the provider's tokens (default: the
    # overhead fitted on the recorded calls, or 20,000 without a recording)
    system_tokens: int | None = None
    ratio: float | None = None  # provider tokens per estimated token (default: fitted)
    write_price: float | None = None  # a cache write's price (default: 1.25× 5 min, 2× 1 hour)


@attrs.define
class StatusParams:
    pass


@attrs.define
class StatusResult:
    version: str
    data_dir: str
    loaded_sessions: list[str]
    summary_provider: str | None
    idle_seconds: float


# ---- daemon -> client -----------------------------------------------------------------------


@attrs.define
class CompactedNotification:
    """A tier changed the context (or tried and said why not)."""

    session_id: str
    tier: str
    applied: bool
    tokens_before: int
    tokens_after: int
    reason: str
    record_ids: list[str]
    details: Json


@attrs.define
class SessionChangedNotification:
    """Another process appended to a session this daemon has loaded."""

    session_id: str
    seq: int
    events: int
    heads: dict[str, str | None]


@attrs.define
class SessionIdleNotification:
    session_id: str
    idle_seconds: float
    cleared: int


@attrs.define
class SummarizeParams:
    """The daemon asks its client to run a summary with the client's own model."""

    session_id: str
    purpose: str
    system: str
    prompt: str
    max_output_tokens: int


@attrs.define
class SummarizeResult:
    text: str
    model: str | None = None
    input_tokens: int | None = None
    output_tokens: int | None = None


METHODS: dict[str, tuple[type, type]] = {
    m.SESSION_OPEN: (OpenParams, OpenResult),
    m.SESSION_LIST: (ListParams, ListResult),
    m.SESSION_GET: (GetParams, dict),
    m.SESSION_APPEND: (AppendParams, AppendResult),
    m.SESSION_TOOL_RESULT: (ToolResultParams, HeadResult),
    m.SESSION_BRANCH: (BranchParams, BranchResult),
    m.SESSION_CHECKOUT: (CheckoutParams, BranchResult),
    m.SESSION_IMPORT: (ImportParams, ImportResult),
    m.FUNCTION_START: (FunctionStartParams, FunctionStartResult),
    m.FUNCTION_COMPLETE: (FunctionCompleteParams, HeadResult),
    m.CONTEXT_RENDER: (RenderParams, RenderResult),
    m.CONTEXT_MEASURE: (RenderParams, MeasureResult),
    m.CONTEXT_COMPACT: (CompactParams, CompactResult),
    m.CONTEXT_SNIP: (SnipParams, SnipResult),
    m.CONTEXT_UNCOLLAPSE: (UncollapseParams, UncollapseResult),
    m.CONTEXT_RECALL: (RecallParams, RecallResult),
    m.CONTEXT_REPORT_USAGE: (ReportUsageParams, ReportUsageResult),
    m.DAEMON_STATUS: (StatusParams, StatusResult),
    m.SESSION_REPLAY: (ReplayParams, dict),
}

NOTIFICATIONS: dict[str, type] = {
    m.NOTIFY_COMPACTED: CompactedNotification,
    m.NOTIFY_SESSION_CHANGED: SessionChangedNotification,
    m.NOTIFY_SESSION_IDLE: SessionIdleNotification,
}

SERVER_REQUESTS: dict[str, tuple[type, type]] = {
    m.REQUEST_SUMMARIZE: (SummarizeParams, SummarizeResult),
}
