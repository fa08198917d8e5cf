"""What an importer produces: a recorded session as an ordered list of operations.

Importers only parse; they never touch a store. Each one turns a transcript into
`ImportedSession`s whose `ops`, applied in order, rebuild the conversation the way the agent
lived it. The same ops drive `compactd import` (apply them all) and `compactd replay` (apply
them step by step and render at every `ModelCall`, as before a model request).

Messages are in Anthropic Messages format, the engine's canonical form: `{"role": "user" |
"assistant", "content": str | [blocks]}` with `text`, `thinking`, `redacted_thinking`,
`image`, `document`, `tool_use` and `tool_result` blocks. A message may carry `"meta": True`
for injected, non-human user content (reminders, hook output) so it does not start a turn.
"""

from __future__ import annotations

from typing import Any

import attrs

MAIN = None
"""The `thread` of an op that belongs to the top-level conversation."""


@attrs.frozen
class Messages:
    """Append these messages to a thread (the main one, or a function's internal thread).

    Within a thread, every `tool_use` must come before its `tool_result`, and the results of
    one assistant message come before the next assistant message. A call that never got a
    result is left without one (the renderer shows `[no result recorded]`).
    """

    messages: list[dict[str, Any]]
    thread: str | None = MAIN
    timestamp: float | None = None


@attrs.frozen
class FunctionStart:
    """A sub-agent (function) starts. `key` names its thread in later ops.

    When the model called it as a tool, `tool_use_id` is that call's id: the call's
    `tool_use` block must already have been appended (in `thread`), and its result is the
    function's output, given by `FunctionEnd` — never by a `tool_result` block.
    """

    key: str
    name: str
    input: Any
    tool_use_id: str | None = None
    thread: str | None = MAIN
    timestamp: float | None = None


@attrs.frozen
class FunctionEnd:
    """The function with this `key` finished; `output` is a string or a list of blocks."""

    key: str
    output: Any
    status: str = "completed"  # "completed" | "error"
    timestamp: float | None = None


@attrs.frozen
class ModelCall:
    """The agent sent a model request here (before the assistant message that follows).

    `usage` is what the provider reported for that request, in Anthropic's keys
    (`input_tokens`, `cache_creation_input_tokens`, `cache_read_input_tokens`,
    `output_tokens`) when the transcript records it; `None` otherwise.
    """

    thread: str | None = MAIN
    timestamp: float | None = None
    model: str | None = None
    usage: dict[str, int] | None = None


@attrs.frozen
class Note:
    """Data kept from the transcript that is not conversation (e.g. Claude Code's own
    `compact_boundary` and `isCompactSummary` records). Stored, never rendered."""

    kind: str
    data: dict[str, Any]
    timestamp: float | None = None


@attrs.frozen
class Compaction:
    """The agent compacted its own context here: from this point on it sent `summary` (the
    text it wrote) in place of everything of `thread` before it, followed by `user_requests`
    when it carried the user's messages over verbatim (Codex's replacement history) and by
    `restored` content it put back (the files Claude Code re-reads). An
    import writes it as a summary record covering what it replaced, so the session renders
    as the agent last saw it; the originals stay in the graph."""

    summary: str
    source: str  # the format that recorded it ("claude-code", "codex")
    user_requests: list[str] = attrs.field(factory=list)
    # what the agent put back after its summary (Claude Code re-reads its recent files)
    restored: list[str] = attrs.field(factory=list)
    thread: str | None = MAIN
    timestamp: float | None = None


Op = Messages | FunctionStart | FunctionEnd | ModelCall | Note | Compaction


@attrs.frozen
class ImportedSession:
    """One conversation read from a transcript file."""

    source_format: str  # "claude-code" | "codex" | "openhands" | "swe-agent"
    source_id: str  # the transcript's own id for this session
    ops: list[Op]
    system: str | None = None  # the system prompt the agent used, when recorded
    model: str | None = None  # the main model, when recorded
    title: str | None = None
    warnings: list[str] = attrs.field(factory=list)  # what was skipped or could not be mapped
    # results the importer restored beyond what the agent sent (a spilled output read back
    # from its file): tool_use_id -> the content the model actually got. A replay's "no
    # management" row renders these, so it is what the recorded run sent.
    sent: dict[str, Any] = attrs.field(factory=dict)
