"""Typed errors of the engine.

Every error names the problem in words a person can act on and carries structured `data`.
The daemon maps each class to a JSON-RPC error code (`compactd.protocol.errors`); the engine
never knows about the wire. An error raised by an operation means nothing was written.
"""

from __future__ import annotations

from typing import Any


class CompactdError(Exception):
    """Base of every error the engine raises on purpose."""

    kind = "compactd_error"

    def __init__(self, message: str, **data: Any) -> None:
        super().__init__(message)
        self.message = message
        self.data: dict[str, Any] = data

    def __str__(self) -> str:
        return self.message


class UnknownSession(CompactdError):
    kind = "unknown_session"


class InvalidSessionId(CompactdError):
    """A session id that could name something outside the data dir, or is not well formed."""

    kind = "invalid_session_id"


class InvalidGraph(CompactdError):
    """Input that would make the graph invalid: unknown kind, duplicate id, unknown parent, …"""

    kind = "invalid_graph"


class InvalidContent(InvalidGraph):
    """A malformed content block or message."""

    kind = "invalid_content"


class InvalidPairing(InvalidGraph):
    """A tool result for an unknown or already answered `tool_use_id`, or a duplicate call id."""

    kind = "invalid_pairing"


class PendingToolResults(CompactdError):
    """The head still waits for tool results, so the thread cannot move on or be rendered."""

    kind = "pending_tool_results"


class HeadConflict(CompactdError):
    """`expectedHead` did not match: another writer moved the branch first."""

    kind = "head_conflict"


class UnknownNode(CompactdError):
    kind = "unknown_node"


class UnknownBranch(CompactdError):
    kind = "unknown_branch"


class UnknownHandle(CompactdError):
    """A recall handle this session did not render on this branch (unknown, foreign, other
    branch, or nothing to recall yet)."""

    kind = "unknown_handle"


class InvalidSearch(CompactdError):
    """A recall search compactd will not run: empty, over its length, a regular expression RE2
    does not take (backreferences, lookaround, a repetition over 1,000), or bad context."""

    kind = "invalid_search"


class InvalidConfig(CompactdError):
    kind = "invalid_config"


class CannotFit(CompactdError):
    """Nothing the cascade may do brings the request under its limit."""

    kind = "cannot_fit"


class Stopped(Exception):
    """Work told to stop (the client cancelled it) stopped before it wrote anything. Not a
    wire error: the front answers the cancelled request as cancelled."""


class ProviderFailure(CompactdError):
    """A summary provider failed; nothing was written."""

    kind = "provider_failure"


class StoreFailure(CompactdError):
    """The log could not be written or read; nothing was acknowledged."""

    kind = "store_failure"


class StoreUnavailable(StoreFailure):
    """The store could not be reached (a database connection lost mid-operation). Same wire
    code as `StoreFailure`, so clients need nothing new; `data.written` says whether the
    operation is known not to have landed (`false`) or could not be checked (`"unknown"`)."""


class TooLarge(CompactdError):
    """An input over one of the size limits (`limit` names the policy value)."""

    kind = "too_large"

    def __init__(self, what: str, limit: str, max_bytes: int, size: int | None = None) -> None:
        over = f"{size:,} bytes, over" if size is not None else "over"
        super().__init__(
            f"{what} is {over} the {limit} limit of {max_bytes:,} bytes "
            "(docs/security.md says how to raise it)",
            limit=limit,
            maxBytes=max_bytes,
            bytes=size,
        )


class InvalidPath(CompactdError):
    """A path the daemon will not read: not a regular file, a NUL byte, or a file a transcript
    refers to outside its own folder."""

    kind = "invalid_path"
