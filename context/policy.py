"""Every threshold and tool list of the cascade, in one place.

Tiers read their numbers from a `Policy`; a session's `config` overrides any field by name
(`policy_from_config`). Nothing else in the engine hard-codes a threshold.
"""

from __future__ import annotations

from typing import Any

import attrs

from .errors import InvalidConfig

# Budget Reduction (spec §3): results over this many characters keep a head and a tail.
MAX_TOOL_RESULT_CHARS = 4000
TRUNCATE_HEAD_CHARS = 2400
TRUNCATE_TAIL_CHARS = 1600

# Tier 1: the tools whose old results may be cleared, by the names real agents use.
# Generic name -> names seen in agents (Claude Code, Codex, OpenHands, SWE-agent, …).
COMPACTABLE_TOOLS: dict[str, tuple[str, ...]] = {
    "FileRead": (
        "FileRead",
        "Read",
        "read_file",
        "view",
        "str_replace_editor",
        "NotebookRead",
        "open",
        "cat",
    ),
    "Shell": (
        "Shell",
        "Bash",
        "BashOutput",
        "shell",
        "exec_command",
        "local_shell",
        "execute_bash",
        "bash",
        "swe_agent_command",
        "run_command",
    ),
    "Grep": ("Grep", "grep", "search_dir", "search_file", "ripgrep", "rg"),
    "Glob": ("Glob", "glob", "LS", "list_dir", "find_file", "list_directory"),
    "WebSearch": ("WebSearch", "web_search", "browser"),
    "WebFetch": ("WebFetch", "web_fetch", "fetch"),
    "FileEdit": (
        "FileEdit",
        "Edit",
        "MultiEdit",
        "NotebookEdit",
        "apply_patch",
        "edit_file",
        "edit",
        "str_replace_based_edit_tool",
    ),
    "FileWrite": ("FileWrite", "Write", "write_file", "create", "create_file"),
}

# Input limits (docs/security.md): the most one request, one message and one imported file may
# weigh. Generous for real work, small enough that no input can make the daemon hang on it.
MAX_REQUEST_BYTES = 64 * 2**20
"""One JSON-RPC message's body (its Content-Length)."""
MAX_MESSAGE_BYTES = 16 * 2**20
"""One message, node, tool result or function output, as stored (JSON bytes)."""
MAX_IMPORT_BYTES = 256 * 2**20
"""One transcript file `session/import` or `session/replay` reads (and each file it refers to)."""
MAX_IMPORT_AMPLIFICATION = 4
"""An import writes at most this many times the bytes it read (the transcript and every file it
refers to), above `IMPORT_FLOOR_BYTES`: a crafted transcript cannot turn a little input into a
huge log."""
IMPORT_FLOOR_BYTES = 64 * 2**10
"""What any import may write whatever it read: a session's header and its first records cost a
few hundred bytes before the first message, so a 3-message log of 100 bytes writes 6 times
that; a ratio alone would refuse every small file."""
MAX_IMPORT_LOG_BYTES = 2**30
"""What one import may write in all (every session of the file), whatever it read."""

CLEARED_PLACEHOLDER = (
    "[Old tool result content cleared by compactd; the original is kept in the session graph.]"
)
"""What a time-based clear leaves (~20 tokens). Fixed bytes: every later render is identical."""

SUMMARY_LAST_ASSISTANT_CHARS = 2000
"""The most of the last assistant text a summary marker quotes verbatim (its head and tail
past it): a text-heavy turn's last message would otherwise keep most of what the summary
freed."""

RUNNING_FUNCTION_PLACEHOLDER = (
    "[This function is still running; its output will appear here when it completes.]"
)
NO_RESULT_PLACEHOLDER = "[no result recorded]"
HIDDEN_OUTPUT_PLACEHOLDER = "[This function's output is not exposed to its callers.]"


@attrs.frozen
class Policy:
    """The cascade's parameters (spec defaults). All overridable per session."""

    # Budget Reduction
    max_tool_result_chars: int = MAX_TOOL_RESULT_CHARS
    truncate_head_chars: int = TRUNCATE_HEAD_CHARS
    truncate_tail_chars: int = TRUNCATE_TAIL_CHARS
    # cascade threshold: fraction of the effective window (window - output reserve)
    cascade_threshold: float = 0.90
    # once over the threshold, the tiers free down to this fraction, so the next compaction
    # is many requests away (headroom, no thrash)
    cascade_target: float = 0.50
    # Tier 1 — Microcompact
    microcompact_first_at: int = 50
    microcompact_every: int = 25
    microcompact_keep_recent: int = 5
    # …fewer when those do not fit this share of the limit; the newest step's calls (whose
    # results the model has not read) are kept in every pass whatever they cost
    microcompact_keep_recent_share: float = 0.10
    microcompact_keep_last: int = 0  # the last resort before "cannot fit" keeps only these
    idle_seconds: float = 90 * 60.0
    # "cache": on the Anthropic format the provider clears server-side (context editing), the
    # messages never change; other formats and the idle pass take the time path anyway.
    # "time": always the client-side placeholder
    microcompact_mode: str = "cache"
    # the least a server-side clear must free (the edit's `clear_at_least`, in tokens): under
    # it a clear is not worth re-writing the cached prefix from the cleared point
    microcompact_cache_clear_at_least: int = 5000
    # count-triggered clears while the cache is warm and under threshold: "defer" | "apply"
    microcompact_warm: str = "economic"  # "economic" | "defer" | "apply"
    microcompact_horizon: int = 25  # requests expected to follow, for "economic"
    # a deferred count-triggered clear fires at the latest this many calls past its due point
    microcompact_defer_calls: int = 25
    # over threshold, clear old results even when the count trigger is not due (a forced change)
    microcompact_when_over: bool = True
    microcompact_min_gain: float = 0.02  # …but only for at least this share of the limit
    # also shorten the long arguments of those old calls (a written file's content, …)
    microcompact_clear_inputs: bool = True
    # results a newer one made stale (a file read again or edited since, a command run again)
    # go first, the newest kept calls' included, with a placeholder that says why: on every
    # pass of the time path, and on the server path when the window forces a change
    microcompact_clear_superseded: bool = True
    microcompact_input_chars: int = 200
    compactable_tools: tuple[str, ...] = tuple(
        sorted({name for names in COMPACTABLE_TOOLS.values() for name in names})
    )
    # Tier 2 — Snip
    snip_enabled: bool = True
    snip_keep_first_turn: bool = True
    # Tier 3 — Context Collapse
    collapse_enabled: bool = True
    collapse_block: float = 0.95
    collapse_min_turns: int = 5
    collapse_max_turns: int = 10
    collapse_summary_tokens: int = 300
    # Tier 4 — Auto-Compact
    summary_provider: str = ""  # "anthropic" | "client" | "digest"; "" = the daemon's default
    summary_model: str = ""
    summary_keep_turns: int = 2
    # a cut inside the latest complete turn (or one taking it whole before a cut in the active
    # turn) only when no other range gets the request under this share of the limit: between
    # the target (which the spec's "retain the latest complete turn" must not give way to) and
    # the threshold (under which a request sits and is compacted again a request or two later)
    summary_split_turn_above: float = 0.75
    summary_max_tokens: int = 5000
    # …and never more than this share of the limit (the marker rides in every request after)
    summary_limit_share: float = 0.05
    # an automatic summary is asked for only when its range frees at least this share of
    # the limit (by the marker's upper bound), unless the request is over its limit
    summary_min_gain: float = 0.05
    # when the LLM tiers (collapse, the rolling summary) run in an automatic cascade:
    # "threshold" — only while the cheaper ones leave the request over its threshold;
    # "pressed" — once over the threshold, while the request is over its target (headroom);
    # "auto" — "threshold" where the provider holds the cache explicitly (Tier 1's server
    # path: the Anthropic format in "cache" mode), "pressed" elsewhere (see docs/decisions.md)
    summary_when: str = "auto"
    # the rolling summary asked as a fork of the request just rendered, where the provider
    # caches it (the Anthropic format with breakpoints, the request's own model): its input
    # is read from the prompt cache instead of sent afresh as a transcript
    summary_fork: bool = True
    summary_last_assistant_chars: int = SUMMARY_LAST_ASSISTANT_CHARS
    # the spec's checkpoint is 2,000–5,000 tokens: the summary may use at least this many
    # (a small window lowers it to a fifth of its limit)
    summary_min_tokens: int = 2000
    summary_input_max_tokens: int = 60_000  # one summarizer call; longer ranges are chunked
    summary_max_calls: int = 8
    # one bound on the wall time of a whole summary (evidence, every chunk, every retry):
    # past it the summary fails and nothing is written
    summary_time_bound_seconds: float = 300.0
    manual_compact_advice: float = 0.60
    # Tool evidence (the spec's stage 2): before a checkpoint, every text-only tool result of
    # the range whose original is at least `evidence_min_tokens` long is condensed into an
    # evidence record of at most `evidence_summary_tokens` (one provider call per
    # `summary_input_max_tokens` of results); the checkpoint works from the evidence
    evidence_enabled: bool = True
    evidence_min_tokens: int = 1500
    evidence_summary_tokens: int = 200
    # …in the checkpoint's own call when the range with those results whole fits one call
    evidence_fold: bool = True
    # Background preparation of the Tier 4 summary while the session is idle, only when the
    # next compaction is near (occupancy within 0.10 of the 0.90 threshold)
    prepare_occupancy: float = 0.80
    prepare_idle_seconds: float = 20.0
    # Tier 5 — Reactive
    reactive_margin: float = 0.05
    # Recall: markers name handles and the request carries `compactd_recall` (off: the
    # request is byte-identical to one without recall)
    recall: bool = False
    # one recall's page; under `max_tool_result_chars` with room for the helper's note, so a
    # recalled page is never cut again on arrival
    recall_max_chars: int = 3800
    recall_list_max: int = 20  # a range marker lists this many of its results' handles

    # Input limits (the daemon's defaults come from its environment; see docs/security.md)
    max_message_bytes: int = MAX_MESSAGE_BYTES
    max_import_bytes: int = MAX_IMPORT_BYTES
    max_import_amplification: int = MAX_IMPORT_AMPLIFICATION
    import_floor_bytes: int = IMPORT_FLOOR_BYTES
    max_import_log_bytes: int = MAX_IMPORT_LOG_BYTES
    max_request_bytes: int = MAX_REQUEST_BYTES


_FIELDS = {f.name: f for f in attrs.fields(Policy)}
_DEFAULTS = Policy()

# Fractions of the limit (or of a share) must lie in (0, 1]; counts that pace or size work
# must be at least 1. Everything else numeric must be at least 0.
_FRACTIONS = frozenset(
    {
        "cascade_threshold",
        "cascade_target",
        "collapse_block",
        "manual_compact_advice",
        "prepare_occupancy",
        "microcompact_min_gain",
        "reactive_margin",
        "summary_split_turn_above",
        "summary_limit_share",
        "microcompact_keep_recent_share",
        "summary_min_gain",
    }
)
_AT_LEAST_ONE = frozenset(
    {
        "microcompact_every",
        "collapse_min_turns",
        "collapse_max_turns",
        "summary_max_tokens",
        "summary_input_max_tokens",
        "summary_max_calls",
        "max_tool_result_chars",
        "recall_max_chars",
        "summary_last_assistant_chars",
    }
)
_CHOICES: dict[str, tuple[str, ...]] = {
    "summary_provider": ("", "anthropic", "client", "digest"),
    "microcompact_warm": ("economic", "defer", "apply"),
    "summary_when": ("auto", "threshold", "pressed"),
    "microcompact_mode": ("time", "cache"),
}


def config_keys() -> list[str]:
    """Every key a session config may hold, by its camelCase name (for help and errors)."""
    return sorted(_camel(name) for name in _FIELDS)


def policy_from_config(config: dict[str, Any] | None) -> Policy:
    """A `Policy` with the session config's overrides (keys are field names, snake or camel).

    Loud on purpose: a misspelled key or a value out of range is an `InvalidConfig` naming the
    key — silently ignoring `cascadeThresold` would leave the user wondering why nothing
    changed."""
    if not config:
        return _DEFAULTS
    overrides: dict[str, Any] = {}
    for key, value in config.items():
        name = _snake(key)
        if name not in _FIELDS:
            import difflib  # a misspelled key only: every process reads a policy

            hint = difflib.get_close_matches(_camel(name), config_keys(), n=1)
            raise InvalidConfig(
                f"unknown config key {key!r}: "
                + (f"did you mean {hint[0]!r}?" if hint else f"known: {', '.join(config_keys())}"),
                field=key,
            )
        overrides[name] = _checked(key, name, value)
    if "cascade_target" in overrides or "cascade_threshold" in overrides:
        target = overrides.get("cascade_target", _DEFAULTS.cascade_target)
        threshold = overrides.get("cascade_threshold", _DEFAULTS.cascade_threshold)
        if target > threshold:
            raise InvalidConfig(
                f"config 'cascadeTarget' ({target}) must not be above 'cascadeThreshold' "
                f"({threshold})",
                field="cascadeTarget",
            )
    low = overrides.get("collapse_min_turns", _DEFAULTS.collapse_min_turns)
    if overrides.get("collapse_max_turns", _DEFAULTS.collapse_max_turns) < low:
        raise InvalidConfig(
            "config 'collapseMaxTurns' must be at least 'collapseMinTurns'",
            field="collapseMaxTurns",
        )
    return attrs.evolve(_DEFAULTS, **overrides)


def _checked(key: str, name: str, value: Any) -> Any:
    """One override, type- and range-checked; returns it in the field's type."""
    default = getattr(_DEFAULTS, name)
    if isinstance(default, bool):
        ok = isinstance(value, bool)
    elif isinstance(default, int | float):
        ok = isinstance(value, int | float) and not isinstance(value, bool)
        if ok and isinstance(default, int) and not float(value).is_integer():
            raise InvalidConfig(f"config {key!r} must be a whole number, got {value}", field=key)
    elif isinstance(default, tuple):
        ok = isinstance(value, list | tuple) and all(isinstance(v, str) for v in value)
        value = tuple(value) if ok else value
    else:
        ok = isinstance(value, type(default))
    if not ok:
        raise InvalidConfig(
            f"config {key!r} has the wrong type ({type(value).__name__}, expected "
            f"{type(default).__name__})",
            field=key,
        )
    if name in _FRACTIONS and not 0 < value <= 1:
        raise InvalidConfig(f"config {key!r} must be in (0, 1], got {value}", field=key)
    if name in _AT_LEAST_ONE and value < 1:
        raise InvalidConfig(f"config {key!r} must be at least 1, got {value}", field=key)
    if isinstance(value, int | float) and not isinstance(value, bool) and value < 0:
        raise InvalidConfig(f"config {key!r} must be at least 0, got {value}", field=key)
    if name in _CHOICES and value not in _CHOICES[name]:
        allowed = " or ".join(repr(c) for c in _CHOICES[name] if c)
        raise InvalidConfig(f"config {_camel(name)!r} must be {allowed}", field=key)
    if isinstance(default, float):
        return float(value)
    if isinstance(default, int) and not isinstance(default, bool):
        return int(value)
    return value


def _snake(name: str) -> str:
    return "".join("_" + c.lower() if c.isupper() else c for c in name)


def _camel(name: str) -> str:
    head, *rest = name.split("_")
    return head + "".join(part.title() for part in rest)


def is_compactable(policy: Policy, tool_name: str | None) -> bool:
    return tool_name is not None and tool_name in policy.compactable_tools


DAEMON_WIDE = (
    "max_message_bytes",
    "max_import_bytes",
    "max_import_amplification",
    "import_floor_bytes",
    "max_import_log_bytes",
    "max_request_bytes",
)
"""Policy values that protect the daemon itself: set for the whole daemon (its environment,
`docs/security.md`), never by one session's config."""


def check_session_config(config: dict[str, Any]) -> None:
    """A session config may not set a daemon-wide limit."""
    for key in config:
        if _snake(key) in DAEMON_WIDE:
            raise InvalidConfig(
                f"config {key!r} is a daemon-wide limit; set it in the daemon's environment "
                f"(COMPACTD_{_snake(key).upper()})",
                field=key,
            )
