"""A loopback fake of the Anthropic Messages API, spoken through the real `anthropic` SDK in tests.

Why it exists: compactd's summary provider and its rendered requests must be proven against the
wire protocol the official SDK speaks (JSON and SSE shapes, the error envelope, retries), and
against the request rules the real API enforces (tool_use/tool_result pairing above all) — with no
network beyond 127.0.0.1. Shapes and error texts follow /work/shared/notes/anthropic-api.md §5–§7.

In-process use (one server per test)::

    with FakeAnthropic() as fake:
        fake.push(Reply.rate_limited(), times=3)   # the next three /v1/messages calls get a 429
        fake.push(Reply.text("the summary"))       # then one success
        client = AsyncAnthropic(base_url=fake.base_url, api_key="test-key")
        ...
        assert len(fake.messages_requests()) == 4

Subprocess use (daemon end-to-end tests)::

    python -m tests.support.fake_anthropic --port 0 [--script FILE] [--api-key KEY]

prints ``PORT=<n>`` on stdout and serves until killed; `FakeAnthropicProcess` wraps this, and the
control endpoints under ``/_fake/`` (see `FakeAnthropic.load_script`) script and inspect it.
"""

from __future__ import annotations

import argparse
import itertools
import json
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import urllib.request
from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field, fields, replace
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

from . import faults
from .scripted_agent import agent_content, thinking_signature

DEFAULT_ANSWER = "Fake summary: the user asked for work; the assistant did it."
DEFAULT_MODEL = "claude-haiku-4-5"
MESSAGES_PATH = "/v1/messages"
COUNT_TOKENS_PATH = "/v1/messages/count_tokens"
CONTROL_PREFIX = "/_fake/"

# Statuses the SDK retries; the fake tells it to wait 1 ms so retry tests stay fast.
RETRYABLE_STATUSES = frozenset({408, 409, 429, 500, 502, 503, 504, 529})

# `error.type` and a representative message per HTTP status (notes §5).
ERROR_DEFAULTS: dict[int, tuple[str, str]] = {
    400: ("invalid_request_error", "Invalid request"),
    401: ("authentication_error", "invalid x-api-key"),
    402: ("billing_error", "Your credit balance is too low to access the Anthropic API."),
    403: (
        "permission_error",
        "Your API key does not have permission to use the specified resource.",
    ),
    404: ("not_found_error", "Not found"),
    408: ("timeout_error", "Request timed out"),
    413: ("request_too_large", "Request exceeds the maximum allowed number of bytes."),
    429: ("rate_limit_error", "Number of request tokens has exceeded your per-minute rate limit."),
    500: ("api_error", "Internal server error"),
    503: ("api_error", "Service unavailable"),
    504: ("timeout_error", "Request timed out"),
    529: ("overloaded_error", "Overloaded"),
}

# Which HTTP status a non-streaming request gets for a scripted mid-stream error type.
STATUS_FOR_ERROR_TYPE = {
    "overloaded_error": 529,
    "api_error": 500,
    "rate_limit_error": 429,
    "timeout_error": 504,
    "invalid_request_error": 400,
}

CLIENT_TOOL_USE = "tool_use"  # server_tool_use / mcp_tool_use need no client-side result
CLEAR_TOOL_USES = "clear_tool_uses_20250919"
CLEAR_THINKING = "clear_thinking_20251015"
COMPACT_EDIT = "compact_20260112"
KNOWN_EDITS = frozenset({CLEAR_TOOL_USES, CLEAR_THINKING, COMPACT_EDIT})
MODELS_PATH = "/v1/models"
MODELS = ("claude-sonnet-4-5", "claude-haiku-4-5", "claude-opus-4-1")


# --------------------------------------------------------------------------------------------
# Scripted behaviours
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Reply:
    """One scripted behaviour for one request. Build it with the classmethods, not by hand.

    kinds: ``text`` (a message; `content` overrides the single text block), ``error`` (an HTTP
    error envelope), ``stall`` (wait `seconds`, then behave as `then` or the default),
    ``stream_error`` (a 200 SSE stream cut by an ``event: error`` after `text` was streamed),
    ``count`` (a count_tokens answer; `count=None` means the fake's own estimate), ``agent``
    (the scripted model of `scripted_agent`: `steps` Bash calls of `lines` output lines each,
    decided from the request; usually the `default`, so it answers every request).

    Any answer may break as networks do (`broken`): `fault` is ``reset`` (the connection reset,
    an RST), ``silence`` (nothing more is sent until the client leaves or the server stops),
    ``malformed`` (an event whose data is not JSON, then the rest; a whole answer whose body is
    not JSON) or ``end`` (the stream closed cleanly where it stands; a whole answer's body cut
    short of its length), after `fault_at` SSE events of a stream or bytes of a whole body.
    """

    kind: str = "text"
    text: str = DEFAULT_ANSWER
    content: list[dict[str, Any]] | None = None
    stop_reason: str = "end_turn"
    model: str | None = None
    input_tokens: int | None = None
    output_tokens: int | None = None
    cache_read_input_tokens: int = 0
    cache_creation_input_tokens: int = 0
    applied_edits: list[dict[str, Any]] | None = None
    chunks: int = 3
    chunk_delay: float = 0.0
    status: int = 200
    error_type: str | None = None
    message: str | None = None
    error_code: str | None = None
    headers: dict[str, str] | None = None
    seconds: float = 0.0
    steps: int = 0
    lines: int = 0
    then: Reply | None = None
    count: int | None = None
    original_input_tokens: int | None = None
    fault: str | None = None
    fault_at: int = 0

    # -- successes ---------------------------------------------------------------------------

    @classmethod
    def answer(cls, text: str = DEFAULT_ANSWER, **options: Any) -> Reply:
        """A normal answer whose only content block is `text`."""
        return cls(kind="text", text=text, **options)

    @classmethod
    def empty(cls, **options: Any) -> Reply:
        """A 200 answer with no content blocks at all (e.g. a refusal or an instant end_turn)."""
        return cls(kind="text", content=[], **options)

    @classmethod
    def blank(cls, text: str = "", **options: Any) -> Reply:
        """A 200 answer whose single text block is empty or whitespace only."""
        return cls(kind="text", text=text, **options)

    @classmethod
    def long_text(cls, chars: int = 20_000, **options: Any) -> Reply:
        """A long deterministic answer, streamed in many deltas."""
        words = itertools.cycle(["the", "agent", "read", "files", "ran", "tests", "and", "fixed"])
        pieces: list[str] = []
        size = 0
        for index, word in enumerate(words):
            piece = f"{word}{index % 97} "
            pieces.append(piece)
            size += len(piece)
            if size >= chars:
                break
        options.setdefault("chunks", 25)
        return cls(kind="text", text="".join(pieces)[:chars].rstrip() or "x", **options)

    @classmethod
    def blocks(
        cls, content: list[dict[str, Any]], stop_reason: str = "end_turn", **options: Any
    ) -> Reply:
        """A 200 answer with exactly these content blocks (text, tool_use, thinking, ...)."""
        return cls(kind="text", content=content, stop_reason=stop_reason, **options)

    @classmethod
    def count_tokens(
        cls, count: int | None = None, original_input_tokens: int | None = None
    ) -> Reply:
        """A count_tokens answer; None fields fall back to the fake's estimate."""
        return cls(kind="count", count=count, original_input_tokens=original_input_tokens)

    # -- failures ----------------------------------------------------------------------------

    @classmethod
    def error(
        cls,
        status: int,
        error_type: str | None = None,
        message: str | None = None,
        *,
        error_code: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> Reply:
        """An HTTP error with the real envelope; type and message default per status."""
        default_type, default_message = ERROR_DEFAULTS.get(status, ("api_error", "Error"))
        return cls(
            kind="error",
            status=status,
            error_type=error_type or default_type,
            message=message or default_message,
            error_code=error_code,
            headers=headers,
        )

    @classmethod
    def prompt_too_long(cls, prompt_tokens: int = 210_345, limit_tokens: int = 200_000) -> Reply:
        """The Tier 5 trigger: 400 with the exact wording clients parse."""
        text = f"prompt is too long: {prompt_tokens} tokens > {limit_tokens} maximum"
        return cls.error(400, "invalid_request_error", text)

    @classmethod
    def too_large(cls) -> Reply:
        return cls.error(413)

    @classmethod
    def rate_limited(cls) -> Reply:
        return cls.error(429)

    @classmethod
    def overloaded(cls) -> Reply:
        return cls.error(529)

    @classmethod
    def server_error(cls) -> Reply:
        return cls.error(500)

    @classmethod
    def unauthorized(cls) -> Reply:
        return cls.error(401)

    @classmethod
    def stall(cls, seconds: float, then: Reply | None = None) -> Reply:
        """Say nothing for `seconds` (interrupted when the server stops), then answer `then`."""
        return cls(kind="stall", seconds=seconds, then=then)

    @classmethod
    def stream_error(
        cls,
        partial_text: str = "Partial summ",
        error_type: str = "overloaded_error",
        message: str = "Overloaded",
    ) -> Reply:
        """A 200 stream that sends some text deltas, then ``event: error``."""
        return cls(kind="stream_error", text=partial_text, error_type=error_type, message=message)

    def broken(self, fault: str, at: int = 3) -> Reply:
        """This answer, breaking with `fault` after `at` events (a stream) or bytes (a whole
        body): see the class docstring."""
        return replace(self, fault=faults.check(fault), fault_at=at)

    # -- (de)serialisation for script files and the control endpoint ----------------------------

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Reply:
        """Accept a full dict (`to_dict`) or a shorthand like ``{"kind": "rate_limited"}``."""
        data = dict(data)
        data.pop("times", None)
        kind = data.pop("kind", "text")
        shorthand = _SHORTHANDS.get(kind)
        if shorthand is not None:
            if "then" in data and isinstance(data["then"], dict):
                data["then"] = cls.from_dict(data["then"])
            return shorthand(**data)
        known = {f.name for f in fields(cls)}
        unknown = set(data) - known
        if unknown:
            raise ValueError(f"unknown Reply fields: {sorted(unknown)}")
        if isinstance(data.get("then"), dict):
            data["then"] = cls.from_dict(data["then"])
        return cls(kind=kind, **data)


_SHORTHANDS: dict[str, Any] = {
    "empty": Reply.empty,
    "blank": Reply.blank,
    "long_text": Reply.long_text,
    "prompt_too_long": Reply.prompt_too_long,
    "too_large": Reply.too_large,
    "rate_limited": Reply.rate_limited,
    "overloaded": Reply.overloaded,
    "server_error": Reply.server_error,
    "unauthorized": Reply.unauthorized,
}


# --------------------------------------------------------------------------------------------
# Recorded requests
# --------------------------------------------------------------------------------------------


@dataclass
class Hold:
    """A gate one /v1/messages request waits at: `arrived` is set when the request reached
    it, `release()` lets it go on to its scripted reply."""

    arrived: threading.Event = field(default_factory=threading.Event)
    released: threading.Event = field(default_factory=threading.Event)

    def release(self) -> None:
        self.released.set()


@dataclass
class RecordedRequest:
    """One request as the fake saw it, for assertions."""

    method: str
    path: str
    query: dict[str, list[str]]
    headers: dict[str, str]  # names lower-cased
    body: Any  # parsed JSON, or None when the body was empty or not JSON
    raw: bytes = field(repr=False, default=b"")
    status: int = 200  # what the fake answered (an error's status, else 200)

    @property
    def endpoint(self) -> str:
        if self.path == MODELS_PATH or self.path.startswith(MODELS_PATH + "/"):
            return "models"
        return {MESSAGES_PATH: "messages", COUNT_TOKENS_PATH: "count_tokens"}.get(
            self.path, "other"
        )

    @property
    def is_beta(self) -> bool:
        """A beta call: SDK 2.14 marks it only by `anthropic-beta`; others add ``?beta=true``."""
        return "true" in self.query.get("beta", []) or bool(self.betas)

    @property
    def stream(self) -> bool:
        return isinstance(self.body, dict) and self.body.get("stream") is True

    @property
    def betas(self) -> list[str]:
        header = self.headers.get("anthropic-beta", "")
        return [beta.strip() for beta in header.split(",") if beta.strip()]

    @property
    def api_key(self) -> str | None:
        if "x-api-key" in self.headers:
            return self.headers["x-api-key"]
        authorization = self.headers.get("authorization", "")
        if authorization.lower().startswith("bearer "):
            return authorization[len("bearer ") :].strip()
        return None

    @property
    def retry_count(self) -> int:
        return int(self.headers.get("x-stainless-retry-count", "0") or 0)

    def to_dict(self) -> dict[str, Any]:
        return {
            "method": self.method,
            "path": self.path,
            "query": self.query,
            "headers": self.headers,
            "body": self.body,
            "status": self.status,
        }


# --------------------------------------------------------------------------------------------
# What the real API validates (the parts compactd's rendered requests must satisfy)
# --------------------------------------------------------------------------------------------


def _blocks(content: Any) -> list[Any]:
    """A message's content as a list of blocks (a plain string is one text block)."""
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    return content if isinstance(content, list) else []


def _message_shape_error(messages: list[Any]) -> str | None:
    """Roles, content types and the non-empty rules."""
    last = len(messages) - 1
    for index, message in enumerate(messages):
        if not isinstance(message, dict):
            return f"messages.{index}: Input should be a valid dictionary"
        if message.get("role") not in ("user", "assistant"):
            return f"messages.{index}.role: Input should be 'user' or 'assistant'"
        content = message.get("content")
        if "content" not in message:
            return f"messages.{index}.content: Field required"
        if not isinstance(content, str | list):
            return f"messages.{index}.content: Input should be a valid list"
        is_final_assistant = index == last and message["role"] == "assistant"
        if not content and not is_final_assistant:
            return (
                f"messages.{index}: all messages must have non-empty content except for the "
                "optional final assistant message"
            )
        for position, block in enumerate(_blocks(content)):
            if not isinstance(block, dict) or "type" not in block:
                return f"messages.{index}.content.{position}.type: Field required"
            if block["type"] == "text":
                text = block.get("text")
                if not isinstance(text, str):
                    return f"messages.{index}.content.{position}.text: Field required"
                if text == "" and not is_final_assistant:
                    return "messages: text content blocks must be non-empty"
                if text and not text.strip() and not is_final_assistant:
                    return "messages: text content blocks must contain non-whitespace text"
    final = messages[last]
    if isinstance(final, dict) and final.get("role") == "assistant":
        texts = [b for b in _blocks(final.get("content")) if b.get("type") == "text"]
        if texts and texts[-1].get("text", "") != texts[-1].get("text", "").rstrip():
            return "messages: final assistant content cannot end with trailing whitespace"
    return None


def tool_pairing_error(messages: list[Any]) -> str | None:
    """The real API's tool_use/tool_result rules (notes §7), with its exact error texts.

    Every client `tool_use` in an assistant message needs a `tool_result` with the same id among
    the leading `tool_result` blocks of the very next (user) message; every `tool_result` must
    answer a `tool_use` of the message just before it; `tool_use` ids are unique per request.
    """
    seen_tool_use_ids: set[str] = set()
    for index, message in enumerate(messages):
        blocks = _blocks(message.get("content"))
        if message.get("role") == "assistant":
            use_ids: list[str] = []
            for position, block in enumerate(blocks):
                if block.get("type") != CLIENT_TOOL_USE:
                    continue
                use_id = block.get("id")
                if use_id in seen_tool_use_ids:
                    return f"messages.{index}.content.{position}: `tool_use` ids must be unique"
                seen_tool_use_ids.add(use_id)
                use_ids.append(use_id)
            if not use_ids:
                continue
            following = messages[index + 1] if index + 1 < len(messages) else None
            answered: set[str] = set()
            if following is not None and following.get("role") == "user":
                for block in _blocks(following.get("content")):
                    if block.get("type") != "tool_result":
                        break  # results must come first in the next user message
                    answered.add(block.get("tool_use_id"))
            missing = [use_id for use_id in use_ids if use_id not in answered]
            if missing:
                return (
                    f"messages.{index}: `tool_use` ids were found without `tool_result` blocks "
                    f"immediately after: {', '.join(missing)}. Each `tool_use` block must have a "
                    "corresponding `tool_result` block in the next message."
                )
        else:
            previous = messages[index - 1] if index > 0 else None
            expected: set[str] = set()
            if previous is not None and previous.get("role") == "assistant":
                expected = {
                    block.get("id")
                    for block in _blocks(previous.get("content"))
                    if block.get("type") == CLIENT_TOOL_USE
                }
            answered_here: set[str] = set()
            for position, block in enumerate(blocks):
                if block.get("type") != "tool_result":
                    continue
                result_id = block.get("tool_use_id")
                if result_id not in expected or result_id in answered_here:
                    return (
                        f"messages.{index}.content.{position}: unexpected `tool_use_id` found in "
                        f"`tool_result` blocks: {result_id}. Each `tool_result` block must have a "
                        "corresponding `tool_use` block in the previous message."
                    )
                answered_here.add(result_id)
    return None


def _thinking_enabled(body: dict[str, Any]) -> bool:
    thinking = body.get("thinking")
    return isinstance(thinking, dict) and thinking.get("type") in ("enabled", "adaptive")


def thinking_order_error(body: dict[str, Any]) -> str | None:
    """With thinking on, an assistant turn continued by tool results must start with thinking."""
    if not _thinking_enabled(body):
        return None
    messages = body["messages"]
    last_assistant = max(
        (i for i, message in enumerate(messages) if message.get("role") == "assistant"),
        default=None,
    )
    if last_assistant is None or last_assistant + 1 >= len(messages):
        return None
    blocks = _blocks(messages[last_assistant].get("content"))
    has_tool_use = any(block.get("type") == CLIENT_TOOL_USE for block in blocks)
    following = _blocks(messages[last_assistant + 1].get("content"))
    continues_tool_loop = any(block.get("type") == "tool_result" for block in following)
    if not (has_tool_use and continues_tool_loop):
        return None
    first_type = blocks[0].get("type") if blocks else None
    if first_type in ("thinking", "redacted_thinking"):
        return None
    return (
        f"messages.{last_assistant}.content.0.type: Expected `thinking` or `redacted_thinking`, "
        f"but found `{first_type}`. When `thinking` is enabled, a final `assistant` message must "
        "start with a thinking block (preceeding the lastmost set of `tool_use` and `tool_result` "
        "blocks). We recommend you include thinking blocks from previous turns. To avoid this "
        "requirement, disable `thinking`. Please consult our documentation at "
        "https://docs.claude.com/en/docs/build-with-claude/extended-thinking"
    )


def context_management_error(body: dict[str, Any], betas: Sequence[str]) -> str | None:
    """`context_management` needs its beta; edits must be known, clear_thinking first.

    The first two texts are what pydantic-style validation says; the ordering and thinking texts
    are this fake's wording (the rules are documented, the exact strings are not).
    """
    config = body.get("context_management")
    if config is None:
        return None
    if not any(beta.startswith(("context-management-", "compact-")) for beta in betas):
        return "context_management: Extra inputs are not permitted"
    edits = config.get("edits", []) if isinstance(config, dict) else None
    if not isinstance(edits, list):
        return "context_management.edits: Input should be a valid list"
    for position, edit in enumerate(edits):
        edit_type = edit.get("type") if isinstance(edit, dict) else None
        if edit_type not in KNOWN_EDITS:
            return (
                f"context_management.edits.{position}: Input tag '{edit_type}' found using 'type' "
                f"does not match any of the expected tags: {', '.join(sorted(KNOWN_EDITS))}"
            )
        if edit_type == CLEAR_THINKING and position != 0:
            return (
                "context_management.edits: `clear_thinking_20251015` must come first when "
                "multiple edits are given"
            )
        if edit_type == CLEAR_THINKING and not _thinking_enabled(body):
            return (
                "`clear_thinking_20251015` strategy requires `thinking` to be enabled or adaptive"
            )
    return None


MAX_CACHE_BREAKPOINTS = 4


def breakpoints_error(body: dict[str, Any]) -> str | None:
    """The API takes at most four blocks with `cache_control` (system, tools and messages)."""
    found = 0
    for tool in body.get("tools") or []:
        found += isinstance(tool, dict) and "cache_control" in tool
    system = body.get("system")
    for block in system if isinstance(system, list) else []:
        found += isinstance(block, dict) and "cache_control" in block
    for message in body.get("messages") or []:
        for block in _blocks(message.get("content") if isinstance(message, dict) else None):
            found += isinstance(block, dict) and "cache_control" in block
    if found > MAX_CACHE_BREAKPOINTS:
        return (
            f"A maximum of {MAX_CACHE_BREAKPOINTS} blocks with cache_control may be provided. "
            f"Found {found}."
        )
    return None


def signature_error(body: dict[str, Any]) -> str | None:
    """A thinking block must come back with exactly the text its signature was made for (the
    scripted model's signatures: `thinking_signature`)."""
    for index, message in enumerate(body.get("messages") or []):
        for position, block in enumerate(_blocks(message.get("content"))):
            if not isinstance(block, dict) or block.get("type") != "thinking":
                continue
            if block.get("signature") != thinking_signature(str(block.get("thinking", ""))):
                return (
                    f"messages.{index}.content.{position}: Invalid `signature` in `thinking` block"
                )
    return None


def validate_request(body: Any, *, endpoint: str, betas: Sequence[str] = ()) -> str | None:
    """The first rule the request breaks, as the real API's error message; None when valid."""
    if not isinstance(body, dict):
        return "body: Input should be a valid dictionary"
    if "model" not in body:
        return "model: Field required"
    if endpoint == "messages":
        if "max_tokens" not in body:
            return "max_tokens: Field required"
        max_tokens = body["max_tokens"]
        if not isinstance(max_tokens, int) or isinstance(max_tokens, bool) or max_tokens < 0:
            return "max_tokens: Input should be a valid integer greater than or equal to 0"
    if "messages" not in body:
        return "messages: Field required"
    messages = body["messages"]
    if not isinstance(messages, list):
        return "messages: Input should be a valid list"
    if not messages:
        return "messages: at least one message is required"
    return (
        _message_shape_error(messages)
        or tool_pairing_error(messages)
        or thinking_order_error(body)
        or context_management_error(body, betas)
        or breakpoints_error(body)
    )


# --------------------------------------------------------------------------------------------
# Token estimates and context-editing results (deterministic, for assertions)
# --------------------------------------------------------------------------------------------


def estimate_tokens(value: Any) -> int:
    """About four characters per token of the compact JSON (or the text itself)."""
    text = value if isinstance(value, str) else json.dumps(value, separators=(",", ":"))
    return max(1, (len(text) + 3) // 4)


_ESTIMATES: dict[int, tuple[dict[str, Any], int]] = {}


def estimate_prompt_tokens(body: dict[str, Any]) -> int:
    """The fake's prompt size: system + messages + tools, about four characters a token
    (memoized for the body being answered: one request asks for it several times)."""
    held = _ESTIMATES.get(id(body))
    if held is not None and held[0] is body:
        return held[1]
    prompt = {key: body[key] for key in ("system", "messages", "tools") if key in body}
    tokens = estimate_tokens(prompt)
    if len(_ESTIMATES) > 64:
        _ESTIMATES.clear()
    _ESTIMATES[id(body)] = (body, tokens)
    return tokens


def _result_tokens(block: dict[str, Any]) -> int:
    return estimate_tokens(block.get("content", ""))


def compute_applied_edits(body: dict[str, Any]) -> list[dict[str, Any]]:
    """What the real API would report as applied, using the fake's token estimate.

    `clear_tool_uses_20250919`: fires at `trigger` (default 100,000 input tokens), clears the
    oldest results beyond `keep` (default 3 tool uses, `exclude_tools` skipped), and is not
    applied when it would clear less than `clear_at_least`. `clear_thinking_20251015`: keeps the
    last `keep` thinking turns (default 1), `"all"` keeps all.
    """
    config = body.get("context_management") or {}
    messages = body.get("messages", [])
    applied: list[dict[str, Any]] = []
    prompt_tokens = estimate_prompt_tokens(body)
    for edit in config.get("edits", []):
        if edit.get("type") == CLEAR_TOOL_USES:
            result = _clear_tool_uses(edit, messages, prompt_tokens)
        elif edit.get("type") == CLEAR_THINKING:
            result = _clear_thinking(edit, messages)
        else:
            result = None
        if result is not None:
            applied.append(result)
    return applied


def _clear_tool_uses(
    edit: dict[str, Any], messages: list[dict[str, Any]], prompt_tokens: int
) -> dict[str, Any] | None:
    excluded = set(edit.get("exclude_tools") or [])
    uses: list[dict[str, Any]] = []
    results: dict[str, dict[str, Any]] = {}
    for message in messages:
        for block in _blocks(message.get("content")):
            if block.get("type") == CLIENT_TOOL_USE and block.get("name") not in excluded:
                uses.append(block)
            elif block.get("type") == "tool_result":
                results[block.get("tool_use_id")] = block
    trigger = edit.get("trigger") or {"type": "input_tokens", "value": 100_000}
    measured = len(uses) if trigger.get("type") == "tool_uses" else prompt_tokens
    if measured < trigger.get("value", 0):
        return None
    keep = (edit.get("keep") or {"type": "tool_uses", "value": 3}).get("value", 3)
    to_clear = [use for use in uses[: max(0, len(uses) - keep)] if use.get("id") in results]
    clear_inputs = edit.get("clear_tool_inputs", False)
    cleared_tokens = 0
    for use in to_clear:
        cleared_tokens += _result_tokens(results[use["id"]])
        if clear_inputs is True or (isinstance(clear_inputs, list) and use["name"] in clear_inputs):
            cleared_tokens += estimate_tokens(use.get("input", {}))
    at_least = (edit.get("clear_at_least") or {}).get("value", 0)
    if not to_clear or cleared_tokens < at_least:
        return None
    return {
        "type": CLEAR_TOOL_USES,
        "cleared_tool_uses": len(to_clear),
        "cleared_input_tokens": cleared_tokens,
    }


def _clear_thinking(edit: dict[str, Any], messages: list[dict[str, Any]]) -> dict[str, Any] | None:
    keep = edit.get("keep", {"type": "thinking_turns", "value": 1})
    if keep == "all" or (isinstance(keep, dict) and keep.get("type") == "all"):
        return None
    turns = [
        [b for b in _blocks(m.get("content")) if b.get("type") in ("thinking", "redacted_thinking")]
        for m in messages
        if m.get("role") == "assistant"
    ]
    turns = [turn for turn in turns if turn]
    cleared = turns[: max(0, len(turns) - keep.get("value", 1))]
    if not cleared:
        return None
    tokens = sum(estimate_tokens(block) for turn in cleared for block in turn)
    return {
        "type": CLEAR_THINKING,
        "cleared_thinking_turns": len(cleared),
        "cleared_input_tokens": tokens,
    }


# --------------------------------------------------------------------------------------------
# The server
# --------------------------------------------------------------------------------------------


class _ClientGone(Exception):
    """The client hung up (e.g. it timed out during a stall); nothing left to send."""


class _HTTPServer(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    fake: FakeAnthropic


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive, like the real API; SSE uses chunked encoding
    server: _HTTPServer

    def setup(self) -> None:
        super().setup()
        # each SSE event is its own small write, sent at once as the API's servers send it
        # (without this, Nagle holds every event after the first for the client's ACK)
        self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def log_message(self, format: str, *args: Any) -> None:
        """Keep test output quiet."""

    def do_POST(self) -> None:
        self._dispatch("POST")

    def do_GET(self) -> None:
        self._dispatch("GET")

    def _dispatch(self, method: str) -> None:
        try:
            self.server.fake._handle(self, method)
        except (_ClientGone, BrokenPipeError, ConnectionResetError):
            self.close_connection = True


class FakeAnthropic:
    """A real HTTP server on 127.0.0.1 speaking the Messages API; see the module docstring.

    Scripting: `push(*replies, times=n)` queues behaviours for ``POST /v1/messages`` (consumed
    one per request, retries included); when the queue is empty, `default` answers.
    `push_count_tokens` / `count_default` do the same for count_tokens. Setting `applied_edits`
    forces what a request with `context_management` reports (otherwise it is computed);
    `context_window` / `max_request_bytes` make over-size requests fail like the real API.
    A request that breaks a validation rule gets a 400 and consumes no scripted reply.
    `applies_edits` False: an Anthropic-compatible server that counts the body as sent — the
    window before any context edit, which it neither applies nor reports. `verify_signatures`:
    every thinking block must carry the signature the scripted model gave its text.
    """

    def __init__(
        self,
        *,
        api_key: str | None = None,
        default: Reply | None = None,
        host: str = "127.0.0.1",
        port: int = 0,
    ) -> None:
        self.api_key = api_key  # None: any non-empty key is accepted
        self.default = default or Reply.answer()
        self.count_default = Reply.count_tokens()
        self.applied_edits: list[dict[str, Any]] | None = None
        self.context_window: int | None = None
        self.max_request_bytes: int | None = None
        self.applies_edits = True
        self.verify_signatures = False
        self._host = host
        self._port = port
        self._lock = threading.Lock()
        self._messages_queue: deque[Reply] = deque()
        self._count_queue: deque[Reply] = deque()
        self._requests: list[RecordedRequest] = []
        self._answered: dict[str, RecordedRequest] = {}  # request id -> its record
        self._ids = itertools.count(1)
        self._message_ids = itertools.count(1)
        self._stopping = threading.Event()
        self._holds: deque[Hold] = deque()
        self._silences = faults.Silences()
        self._server: _HTTPServer | None = None
        self._thread: threading.Thread | None = None

    # -- lifecycle ---------------------------------------------------------------------------

    def start(self) -> FakeAnthropic:
        server = _HTTPServer((self._host, self._port), _Handler)
        server.fake = self
        self._server = server
        self._stopping.clear()
        self._thread = threading.Thread(
            target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop serving; stalled handlers wake up and give up at once."""
        self._stopping.set()
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None

    def __enter__(self) -> FakeAnthropic:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def port(self) -> int:
        if self._server is None:
            raise RuntimeError("the fake server is not running")
        return self._server.server_address[1]

    @property
    def base_url(self) -> str:
        """What to pass as `base_url=` or ANTHROPIC_BASE_URL."""
        return f"http://127.0.0.1:{self.port}"

    # -- scripting ---------------------------------------------------------------------------

    def push(self, *replies: Reply, times: int = 1) -> None:
        """Queue behaviours for the next /v1/messages requests (each repeated `times`)."""
        with self._lock:
            for reply in replies:
                self._messages_queue.extend([reply] * times)

    def push_count_tokens(self, *replies: Reply, times: int = 1) -> None:
        with self._lock:
            for reply in replies:
                self._count_queue.extend([reply] * times)

    def hold(self) -> Hold:
        """Make the next /v1/messages request wait until the returned `Hold` is released (or
        the server stops): a test sees a summary in flight without timing anything."""
        gate = Hold()
        with self._lock:
            self._holds.append(gate)
        return gate

    def pending(self) -> int:
        """Scripted /v1/messages replies not yet consumed."""
        with self._lock:
            return len(self._messages_queue)

    def load_script(self, script: dict[str, Any]) -> None:
        """Apply a JSON script (the `--script` file and ``POST /_fake/script`` use this).

        Keys (all optional): ``default`` (a reply), ``messages`` and ``count_tokens`` (lists of
        replies, each may carry ``"times": n``), ``api_key``, ``applied_edits``,
        ``context_window``, ``max_request_bytes``. A reply is `Reply.to_dict()` or a shorthand
        such as ``{"kind": "prompt_too_long", "prompt_tokens": 9, "limit_tokens": 5}``.
        """
        if "default" in script:
            self.default = Reply.from_dict(script["default"])
        for item in script.get("messages", []):
            self.push(Reply.from_dict(item), times=int(item.get("times", 1)))
        for item in script.get("count_tokens", []):
            self.push_count_tokens(Reply.from_dict(item), times=int(item.get("times", 1)))
        for key in (
            "api_key",
            "applied_edits",
            "context_window",
            "max_request_bytes",
            "applies_edits",
            "verify_signatures",
        ):
            if key in script:
                setattr(self, key, script[key])

    def reset(self) -> None:
        """Forget recorded requests and scripted replies (settings stay)."""
        with self._lock:
            self._messages_queue.clear()
            self._count_queue.clear()
            self._requests.clear()
            self._answered.clear()
            holds, self._holds = list(self._holds), deque()
        for gate in holds:
            gate.release()

    # -- inspection --------------------------------------------------------------------------

    @property
    def requests(self) -> list[RecordedRequest]:
        """Every API request so far, in arrival order (control requests excluded)."""
        with self._lock:
            return list(self._requests)

    def messages_requests(self) -> list[RecordedRequest]:
        return [r for r in self.requests if r.endpoint == "messages"]

    def count_tokens_requests(self) -> list[RecordedRequest]:
        return [r for r in self.requests if r.endpoint == "count_tokens"]

    @property
    def last_request(self) -> RecordedRequest:
        requests = self.requests
        if not requests:
            raise AssertionError("the fake server has seen no request")
        return requests[-1]

    # -- request handling ----------------------------------------------------------------------

    def _handle(self, handler: _Handler, method: str) -> None:
        url = urlsplit(handler.path)
        length = int(handler.headers.get("content-length") or 0)
        raw = handler.rfile.read(length) if length else b""
        if url.path.startswith(CONTROL_PREFIX):
            self._control(handler, method, url.path, raw)
            return
        try:
            body = json.loads(raw) if raw else None
        except ValueError:
            body = None
        request = RecordedRequest(
            method=method,
            path=url.path,
            query=parse_qs(url.query),
            headers={name.lower(): value for name, value in handler.headers.items()},
            body=body,
            raw=raw,
        )
        with self._lock:
            self._requests.append(request)
        request_id = f"req_fake_{next(self._ids):06d}"
        self._answered[request_id] = request

        expected = "GET" if request.endpoint == "models" else "POST"
        if request.endpoint == "other" or method != expected:
            self._send_error(
                handler, request_id, Reply.error(404, message=f"Not found: {url.path}")
            )
            return
        key = request.api_key
        if not key:
            self._send_error(
                handler, request_id, Reply.error(401, message="x-api-key header is required")
            )
            return
        if self.api_key is not None and key != self.api_key:
            self._send_error(handler, request_id, Reply.unauthorized())
            return
        if "anthropic-version" not in request.headers:
            message = "anthropic-version: header is required"
            self._send_error(handler, request_id, Reply.error(400, message=message))
            return
        if request.endpoint == "models":
            self._answer_models(handler, request_id, url.path)
            return
        if self.max_request_bytes is not None and len(raw) > self.max_request_bytes:
            self._send_error(handler, request_id, Reply.too_large())
            return
        if raw and body is None:
            message = "There was an error parsing the body of your request: invalid JSON"
            self._send_error(handler, request_id, Reply.error(400, message=message))
            return
        problem = validate_request(body, endpoint=request.endpoint, betas=request.betas)
        if problem is None and self.verify_signatures:
            problem = signature_error(body)
        if problem is not None:
            self._send_error(handler, request_id, Reply.error(400, message=problem))
            return
        if self.context_window is not None:
            # the window holds the prompt the model sees: context edits apply server-side
            # "before the prompt reaches Claude" (the context-editing docs), so a request whose
            # edits clear enough fits
            edits = self._edits(body) or []
            cleared = sum(int(edit.get("cleared_input_tokens", 0)) for edit in edits)
            prompt_tokens = estimate_prompt_tokens(body) - cleared
            if prompt_tokens > self.context_window:
                reply = Reply.prompt_too_long(prompt_tokens, self.context_window)
                self._send_error(handler, request_id, reply)
                return

        if request.endpoint == "count_tokens":
            self._answer_count(handler, request_id, body, self._next(self._count_queue, count=True))
        else:
            with self._lock:
                gate = self._holds.popleft() if self._holds else None
            if gate is not None:
                gate.arrived.set()
                while not gate.released.wait(0.05):
                    if self._stopping.is_set():
                        return
            self._answer_message(handler, request_id, body, self._next(self._messages_queue))

    def _edits(
        self, body: dict[str, Any], reply: Reply | None = None
    ) -> list[dict[str, Any]] | None:
        """The context edits this request gets applied (None: it asks for none, or this
        server applies none)."""
        if "context_management" not in body or not self.applies_edits:
            return None
        if reply is not None and reply.applied_edits is not None:
            return reply.applied_edits
        if self.applied_edits is not None:
            return self.applied_edits
        return compute_applied_edits(body)

    def _next(self, queue: deque[Reply], *, count: bool = False) -> Reply:
        with self._lock:
            if queue:
                return queue.popleft()
        return self.count_default if count else self.default

    def _wait_out_stall(self, reply: Reply, *, count: bool = False) -> Reply | None:
        """Follow stall replies; None when the server is stopping meanwhile."""
        while reply.kind == "stall":
            if self._stopping.wait(reply.seconds):
                return None
            fallback = self.count_default if count else self.default
            if reply.then is not None:
                reply = reply.then
            elif fallback.kind != "stall":
                reply = fallback
            else:
                reply = Reply.count_tokens() if count else Reply.answer()
        return reply

    def _answer_count(
        self, handler: _Handler, request_id: str, body: dict[str, Any], reply: Reply
    ) -> None:
        resolved = self._wait_out_stall(reply, count=True)
        if resolved is None:
            return
        if resolved.kind == "error":
            self._send_error(handler, request_id, resolved)
            return
        original = estimate_prompt_tokens(body)
        answer: dict[str, Any] = {}
        edits = self._edits(body)
        if edits is not None:
            cleared = sum(int(edit.get("cleared_input_tokens", 0)) for edit in edits)
            answer["input_tokens"] = max(1, original - cleared)
            answer["context_management"] = {
                "original_input_tokens": resolved.original_input_tokens or original
            }
        else:
            answer["input_tokens"] = original
        if resolved.count is not None:
            answer["input_tokens"] = resolved.count
        self._send_json(handler, 200, answer, request_id)

    def _answer_message(
        self, handler: _Handler, request_id: str, body: dict[str, Any], reply: Reply
    ) -> None:
        resolved = self._wait_out_stall(reply)
        if resolved is None:
            return
        streaming = body.get("stream") is True
        if resolved.kind == "error":
            self._send_error(handler, request_id, resolved)
            return
        if resolved.kind == "stream_error" and not streaming:
            error_type = resolved.error_type or "overloaded_error"
            status = STATUS_FOR_ERROR_TYPE.get(error_type, 500)
            self._send_error(handler, request_id, Reply.error(status, error_type, resolved.message))
            return
        if resolved.kind == "agent":
            content, stop = agent_content(body, steps=resolved.steps, lines=resolved.lines)
            resolved = replace(resolved, content=content, stop_reason=stop)
        message = self._message(body, resolved)
        if not streaming and resolved.fault is not None:
            self._send_broken_json(handler, message, request_id, resolved)
        elif not streaming:
            self._send_json(handler, 200, message, request_id)
        elif resolved.kind == "stream_error":
            self._stream_cut_by_error(handler, request_id, message, resolved)
        else:
            self._stream_message(handler, request_id, message, resolved)

    def _answer_models(self, handler: _Handler, request_id: str, path: str) -> None:
        """`GET /v1/models` (the list, newest first) and `GET /v1/models/{id}`."""
        models = [
            {
                "type": "model",
                "id": name,
                "display_name": name.replace("-", " ").title(),
                "created_at": "2025-09-29T00:00:00Z",
            }
            for name in MODELS
        ]
        wanted = path[len(MODELS_PATH) + 1 :]
        if not wanted:
            page = {
                "data": models,
                "has_more": False,
                "first_id": models[0]["id"],
                "last_id": models[-1]["id"],
            }
            self._send_json(handler, 200, page, request_id)
            return
        found = next((m for m in models if m["id"] == wanted), None)
        if found is None:
            self._send_error(handler, request_id, Reply.error(404, message=f"model: {wanted}"))
            return
        self._send_json(handler, 200, found, request_id)

    def _message(self, body: dict[str, Any], reply: Reply) -> dict[str, Any]:
        """The full non-streaming Message (notes §6): every field the SDK types expect."""
        content = (
            reply.content if reply.content is not None else [{"type": "text", "text": reply.text}]
        )
        edits = self._edits(body, reply)
        input_tokens = reply.input_tokens
        if input_tokens is None:  # like the API: the prompt after its own context edits
            cleared = sum(int(e.get("cleared_input_tokens", 0)) for e in edits or [])
            input_tokens = max(1, estimate_prompt_tokens(body) - cleared)
        output_tokens = reply.output_tokens
        if output_tokens is None:
            output_tokens = estimate_tokens(content) if content else 1
        message: dict[str, Any] = {
            "id": f"msg_fake_{next(self._message_ids):06d}",
            "type": "message",
            "role": "assistant",
            "model": reply.model or body.get("model") or DEFAULT_MODEL,
            "content": content,
            "stop_reason": reply.stop_reason,
            "stop_sequence": None,
            "usage": {
                "input_tokens": input_tokens,
                "output_tokens": output_tokens,
                "cache_creation_input_tokens": reply.cache_creation_input_tokens,
                "cache_read_input_tokens": reply.cache_read_input_tokens,
            },
        }
        if edits is not None:
            message["context_management"] = {"applied_edits": edits}
        return message

    # -- wire output ---------------------------------------------------------------------------

    def _send_json(
        self,
        handler: _Handler,
        status: int,
        payload: Any,
        request_id: str,
        extra_headers: dict[str, str] | None = None,
    ) -> None:
        data = json.dumps(payload).encode()
        try:
            handler.send_response(status)
            handler.send_header("content-type", "application/json")
            handler.send_header("content-length", str(len(data)))
            handler.send_header("request-id", request_id)
            for name, value in (extra_headers or {}).items():
                handler.send_header(name, value)
            handler.end_headers()
            handler.wfile.write(data)
            handler.wfile.flush()
        except (BrokenPipeError, ConnectionResetError) as gone:
            raise _ClientGone from gone

    def _send_error(self, handler: _Handler, request_id: str, reply: Reply) -> None:
        """The real envelope plus `request-id`; retryable statuses say "retry after 1 ms"."""
        recorded = self._answered.get(request_id)
        if recorded is not None:
            recorded.status = reply.status
        error: dict[str, Any] = {"type": reply.error_type, "message": reply.message}
        if reply.error_code is not None:
            error["details"] = {"error_code": reply.error_code}
        envelope = {"type": "error", "error": error, "request_id": request_id}
        headers: dict[str, str] = {}
        if reply.status in RETRYABLE_STATUSES:
            headers["retry-after-ms"] = "1"
        headers.update(reply.headers or {})
        self._send_json(handler, reply.status, envelope, request_id, headers)

    def _open_stream(self, handler: _Handler, request_id: str) -> None:
        try:
            handler.send_response(200)
            handler.send_header("content-type", "text/event-stream; charset=utf-8")
            handler.send_header("cache-control", "no-cache")
            handler.send_header("transfer-encoding", "chunked")
            handler.send_header("request-id", request_id)
            handler.end_headers()
        except (BrokenPipeError, ConnectionResetError) as gone:
            raise _ClientGone from gone

    def _event(
        self, handler: _Handler, name: str, data: dict[str, Any], delay: float = 0.0
    ) -> None:
        """One SSE event (with its `event:` line — the SDK ignores events without one)."""
        if delay and self._stopping.wait(delay):
            raise _ClientGone
        self._chunk(handler, f"event: {name}\ndata: {json.dumps(data)}\n\n".encode())

    def _close_stream(self, handler: _Handler) -> None:
        try:
            handler.wfile.write(b"0\r\n\r\n")
            handler.wfile.flush()
        except (BrokenPipeError, ConnectionResetError) as gone:
            raise _ClientGone from gone

    def _start_events(self, message: dict[str, Any]) -> list[tuple[str, dict[str, Any], float]]:
        usage = message["usage"]
        started = {
            **message,
            "content": [],
            "stop_reason": None,
            "stop_sequence": None,
            "usage": {**usage, "output_tokens": 1},
        }
        started.pop("context_management", None)
        return [
            ("message_start", {"type": "message_start", "message": started}, 0.0),
            ("ping", {"type": "ping"}, 0.0),
        ]

    def _stream_start(self, handler: _Handler, request_id: str, message: dict[str, Any]) -> None:
        self._open_stream(handler, request_id)
        for name, data, _delay in self._start_events(message):
            self._event(handler, name, data)

    @staticmethod
    def _block_events(
        index: int, block: dict[str, Any], reply: Reply
    ) -> list[tuple[str, dict[str, Any], float]]:
        """content_block_start, its deltas, content_block_stop for one block."""
        block_type = block.get("type")
        delay = reply.chunk_delay
        if block_type == "text":
            start_block: dict[str, Any] = {"type": "text", "text": ""}
            deltas = [
                {"type": "text_delta", "text": piece}
                for piece in _split(block["text"], reply.chunks)
            ]
        elif block_type == "tool_use":
            start_block = {**block, "input": {}}
            partial = json.dumps(block.get("input", {}))
            deltas = [{"type": "input_json_delta", "partial_json": p} for p in _split(partial, 2)]
        elif block_type == "thinking":
            start_block = {"type": "thinking", "thinking": "", "signature": ""}
            deltas = [
                {"type": "thinking_delta", "thinking": p} for p in _split(block["thinking"], 2)
            ]
            deltas.append({"type": "signature_delta", "signature": block.get("signature", "")})
        else:
            start_block, deltas = block, []
        start = {"type": "content_block_start", "index": index, "content_block": start_block}
        events = [("content_block_start", start, 0.0)]
        for delta in deltas:
            event = {"type": "content_block_delta", "index": index, "delta": delta}
            events.append(("content_block_delta", event, delay))
        stop = {"type": "content_block_stop", "index": index}
        events.append(("content_block_stop", stop, 0.0))
        return events

    def _stream_message(
        self, handler: _Handler, request_id: str, message: dict[str, Any], reply: Reply
    ) -> None:
        events = self._start_events(message)
        for index, block in enumerate(message["content"]):
            events += self._block_events(index, block, reply)
        delta: dict[str, Any] = {
            "type": "message_delta",
            "delta": {"stop_reason": message["stop_reason"], "stop_sequence": None},
            "usage": dict(message["usage"]),  # cumulative totals, as the real API sends them
        }
        if "context_management" in message:
            delta["context_management"] = message["context_management"]
        events.append(("message_delta", delta, 0.0))
        events.append(("message_stop", {"type": "message_stop"}, 0.0))
        self._open_stream(handler, request_id)
        at = min(reply.fault_at, len(events)) if reply.fault is not None else None
        for position, event in enumerate([*events, None]):
            if position == at and not self._fault(handler, str(reply.fault)):
                return
            if event is not None:
                self._event(handler, *event)
        self._close_stream(handler)

    # -- broken answers ------------------------------------------------------------------------

    def _fault(self, handler: _Handler, fault: str) -> bool:
        """Break a stream as `fault` says; True when the rest is still to be sent."""
        if fault == "malformed":
            self._chunk(handler, b"event: content_block_delta\n" + faults.MALFORMED)
            return True
        if fault == "end":
            self._close_stream(handler)
            return False
        if fault == "silence":
            self._silences.hold(handler.connection, self._stopping)
        faults.reset(handler.connection)
        raise _ClientGone

    def _send_broken_json(
        self, handler: _Handler, message: dict[str, Any], request_id: str, reply: Reply
    ) -> None:
        """A whole answer that breaks after `fault_at` bytes of its body."""
        data = json.dumps(message).encode()
        if reply.fault == "malformed":
            data = data[: max(1, len(data) // 2)]
        try:
            handler.send_response(200)
            handler.send_header("content-type", "application/json")
            handler.send_header("content-length", str(len(data)))
            handler.send_header("request-id", request_id)
            handler.end_headers()
            faults.send_whole_broken(
                handler.wfile.write,
                handler.connection,
                data,
                str(reply.fault),
                reply.fault_at,
                self._silences,
                self._stopping,
            )
        except (BrokenPipeError, ConnectionResetError) as gone:
            raise _ClientGone from gone
        if reply.fault != "malformed":
            raise _ClientGone

    @property
    def silent(self) -> int:
        """Answers held in `silence` right now, their clients still connected."""
        return self._silences.count

    def _chunk(self, handler: _Handler, payload: bytes) -> None:
        try:
            handler.wfile.write(f"{len(payload):x}\r\n".encode() + payload + b"\r\n")
            handler.wfile.flush()
        except (BrokenPipeError, ConnectionResetError) as gone:
            raise _ClientGone from gone

    def _stream_cut_by_error(
        self, handler: _Handler, request_id: str, message: dict[str, Any], reply: Reply
    ) -> None:
        self._stream_start(handler, request_id, message)
        start = {
            "type": "content_block_start",
            "index": 0,
            "content_block": {"type": "text", "text": ""},
        }
        self._event(handler, "content_block_start", start)
        for piece in _split(reply.text, reply.chunks):
            event = {
                "type": "content_block_delta",
                "index": 0,
                "delta": {"type": "text_delta", "text": piece},
            }
            self._event(handler, "content_block_delta", event, reply.chunk_delay)
        error = {
            "type": "error",
            "error": {"type": reply.error_type, "message": reply.message},
            "request_id": request_id,
        }
        self._event(handler, "error", error)
        self._close_stream(handler)

    # -- control endpoints (subprocess mode) ----------------------------------------------------

    def _control(self, handler: _Handler, method: str, path: str, raw: bytes) -> None:
        """GET /_fake/requests; POST /_fake/script (a `load_script` JSON); POST /_fake/reset."""
        name = path[len(CONTROL_PREFIX) :]
        if method == "GET" and name == "requests":
            payload: Any = {"requests": [request.to_dict() for request in self.requests]}
        elif method == "POST" and name == "script":
            self.load_script(json.loads(raw or b"{}"))
            payload = {"ok": True, "pending": self.pending()}
        elif method == "POST" and name == "reset":
            self.reset()
            payload = {"ok": True}
        else:
            self._send_json(handler, 404, {"error": f"no control endpoint {method} {path}"}, "ctl")
            return
        self._send_json(handler, 200, payload, "ctl")


def _split(text: str, pieces: int) -> list[str]:
    """`text` in up to `pieces` consecutive non-empty parts (none for an empty text)."""
    if not text:
        return []
    pieces = max(1, min(pieces, len(text)))
    size = -(-len(text) // pieces)
    return [text[start : start + size] for start in range(0, len(text), size)]


# --------------------------------------------------------------------------------------------
# Subprocess mode
# --------------------------------------------------------------------------------------------

REPO_ROOT = Path(__file__).resolve().parents[2]


class FakeAnthropicProcess:
    """The fake in a child process (for tests that spawn the daemon with ANTHROPIC_BASE_URL).

    ``with FakeAnthropicProcess(script={...}) as fake:`` then `fake.base_url`, `fake.requests()`
    (recorded requests as dicts), `fake.load_script({...})`, `fake.reset()`.
    """

    def __init__(self, script: dict[str, Any] | None = None, *, api_key: str | None = None) -> None:
        self._script = script
        self._api_key = api_key
        self._process: subprocess.Popen[str] | None = None
        self._script_file: Path | None = None
        self.port: int | None = None

    def start(self) -> FakeAnthropicProcess:
        command = [sys.executable, "-m", "tests.support.fake_anthropic", "--port", "0"]
        if self._script is not None:
            with tempfile.NamedTemporaryFile(
                "w", suffix=".json", prefix="fake-anthropic-", delete=False
            ) as handle:
                json.dump(self._script, handle)
            self._script_file = Path(handle.name)
            command += ["--script", str(self._script_file)]
        if self._api_key is not None:
            command += ["--api-key", self._api_key]
        self._process = subprocess.Popen(
            command, cwd=REPO_ROOT, stdout=subprocess.PIPE, text=True, bufsize=1
        )
        assert self._process.stdout is not None
        line = self._process.stdout.readline().strip()
        if not line.startswith("PORT="):
            self.stop()
            raise RuntimeError(f"fake Anthropic server did not start (said {line!r})")
        self.port = int(line.removeprefix("PORT="))
        return self

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def _call(self, method: str, name: str, payload: Any = None) -> Any:
        data = None if payload is None else json.dumps(payload).encode()
        request = urllib.request.Request(
            f"{self.base_url}{CONTROL_PREFIX}{name}", data=data, method=method
        )
        request.add_header("content-type", "application/json")
        with urllib.request.urlopen(request, timeout=10) as response:  # loopback only
            return json.loads(response.read())

    def requests(self) -> list[dict[str, Any]]:
        return self._call("GET", "requests")["requests"]

    def load_script(self, script: dict[str, Any]) -> None:
        self._call("POST", "script", script)

    def reset(self) -> None:
        self._call("POST", "reset", {})

    def stop(self) -> None:
        if self._process is not None:
            self._process.terminate()
            try:
                self._process.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self._process.kill()
                self._process.wait(timeout=5)
            if self._process.stdout is not None:
                self._process.stdout.close()
            self._process = None
        if self._script_file is not None:
            self._script_file.unlink(missing_ok=True)
            self._script_file = None

    def __enter__(self) -> FakeAnthropicProcess:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def main(argv: Iterable[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Fake Anthropic Messages API on 127.0.0.1")
    parser.add_argument("--port", type=int, default=0, help="0 picks a free port")
    parser.add_argument("--script", type=Path, help="a JSON script (see FakeAnthropic.load_script)")
    parser.add_argument("--api-key", help="accept only this key (default: any key)")
    options = parser.parse_args(list(argv) if argv is not None else None)

    fake = FakeAnthropic(api_key=options.api_key, port=options.port)
    if options.script is not None:
        fake.load_script(json.loads(options.script.read_text()))
    fake.start()
    stopped = threading.Event()

    def _on_signal(signum: int, frame: object) -> None:
        stopped.set()

    signal.signal(signal.SIGTERM, _on_signal)
    signal.signal(signal.SIGINT, _on_signal)
    print(f"PORT={fake.port}", flush=True)
    while not stopped.wait(0.5):
        pass
    fake.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
