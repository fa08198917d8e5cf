"""The contract every wire's adapter keeps, and the neutral types it speaks with the shared path.

A wire is one provider API the proxy speaks: the Anthropic Messages API (`anthropic`), OpenAI's
Responses and Chat Completions (`responses`, `chat`), the Gemini API (`gemini`). Its adapter is
the only code that reads or writes that API's JSON and SSE: it reads a client's request into a
`Turn` (the conversation in the session's blocks, its key, what the budget counts), writes the
body sent upstream from compactd's render, decides per streamed event what the client sees
(its relays), says a failure in the API's own shape — as a status, and inside a stream — reads
the API's usage and its prompt-too-long refusal, and offers and answers `compactd_recall` in
its own shapes. The shared path (`server`, `relay`) routes, places the history, renders, drives
the relays and settles what a request wrote, and never looks inside a provider's body: a new
wire is a new adapter, and the shared path does not grow.
"""

from __future__ import annotations

import abc
import hashlib
from collections.abc import Callable, Mapping
from typing import Any, ClassVar, Protocol

import attrs
import orjson

from ..context.decompose import Spec, from_anthropic
from ..context.errors import CannotFit
from ..context.summarizer.types import SummaryRequest, SummaryResult
from ..context.tiers.reactive import Overflow
from ..service.stats import Usage
from .sse import Event


class ApiError(Exception):
    """A refusal or failure the client gets in its API's own error shape (the adapter writes
    it). `kind` is the proxy's own word for it — `invalid_request_error`, `not_found_error`,
    `request_too_large`, `timeout_error`, `rate_limit_error`, `api_error` — which each wire
    maps to its own; `code` is OpenAI's `error.code`, where its APIs have one."""

    def __init__(self, status: int, kind: str, message: str, code: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.kind = kind
        self.message = message
        self.code = code

    def own_body(self) -> Any:
        """The upstream's own error body when the upstream said it (None: the proxy's)."""
        return None


def invalid(message: str) -> ApiError:
    return ApiError(400, "invalid_request_error", message)


@attrs.frozen
class SessionKey:
    """Which session a request belongs to: `value` is the session the client names
    (`named`), or a digest of how its conversation starts — conversations that start alike
    are then told apart by the proxy (`Proxy._keyless`)."""

    value: str
    named: bool


def opening(*parts: Any) -> SessionKey:
    """The key of a conversation that names no session: a digest of how it starts."""
    return SessionKey("h" + hashlib.sha256(orjson.dumps(parts)).hexdigest()[:31], False)


@attrs.frozen
class Incoming:
    """A client's request as an adapter reads it: the JSON body, the headers, the route's
    parameters (Gemini's model and method are in its path) and the query."""

    body: Any
    headers: Mapping[str, str] = attrs.field(factory=dict)
    params: Mapping[str, str] = attrs.field(factory=dict)
    query: Mapping[str, str] = attrs.field(factory=dict)


@attrs.frozen
class Turn:
    """A client's request, read by its wire: what the shared path places and renders, and
    what the adapter keeps to write the body sent upstream (`kept`)."""

    body: dict[str, Any]  # as the client sent it
    model: str
    messages: list[dict[str, Any]]  # the conversation, in the session's blocks
    key: SessionKey
    system: Any = None  # what the budget counts as the system prompt
    tools: list[dict[str, Any]] | None = None  # what it counts as the tools
    max_output: int = 0  # the output limit the client asked for (0: none)
    cache_ttl: str | None = None
    stream: bool = False
    recall: bool | None = None  # None: as the session says; False: not on this request
    kept: Any = None


@attrs.define
class Credentials:
    """What a session's latest request said about who is asking, for which model, and through
    which wire (`api`) at which upstream: a summary asks the same way. `fields`: the rest of
    the last body the proxy sent upstream for it but its messages (thinking, tool_choice,
    metadata, the context edits), which a summary asked as a fork of that cached request
    sends as they went."""

    headers: dict[str, str]
    model: str
    api: str = "anthropic"
    upstream: str = ""
    fields: dict[str, Any] = attrs.field(factory=dict)


@attrs.frozen
class Route:
    """One endpoint of a wire. `action`: `generate` (a managed conversation turn), `count`
    (the upstream's count of what compactd would send), `forward` (relayed as it is, nothing
    counted: a model list), `unmanaged` (relayed as the client sent it and counted under
    `kind`, the log saying `reason`)."""

    method: str
    path: str  # aiohttp's pattern
    action: str
    reason: str = ""
    kind: str = ""


class Answer(Protocol):
    """What a relay tells of the upstream's answer across its recall rounds."""

    rounds: list[Usage | None]  # each upstream answer's usage; the first is the request's

    @property
    def reported(self) -> dict[str, Any] | None: ...  # the first answer's usage, as recorded

    @property
    def applied_edits(self) -> list[dict[str, Any]] | None: ...  # the context edits applied

    def follow_up_calls(self) -> list[dict[str, Any]]: ...  # recall calls to answer first
    def follow_up(self, body: dict[str, Any], results: list[dict[str, Any]]) -> dict[str, Any]: ...
    def mixed_calls(self) -> list[dict[str, Any]]: ...  # recall calls beside the client's own


class StreamedRelay(Answer, Protocol):
    """A streamed answer, event by event."""

    ended: bool  # this upstream stream reached its last event (held back or not)
    failed: bool  # the upstream reported a failure in it (relayed to the client)

    @property
    def whole_at_close(self) -> bool: ...  # a clean close now leaves a whole answer

    def event(self, event: Event) -> bytes | None: ...  # the bytes the client gets (None: none)
    def continue_with_next_stream(self) -> None: ...
    def failure(self, exc: ApiError) -> bytes: ...  # the API's mid-stream failure event


class WholeRelay(Answer, Protocol):
    """A whole (non-streamed) answer, taken round by round."""

    def take(self, answer: dict[str, Any]) -> None: ...
    def answer(self) -> dict[str, Any]: ...  # what the client gets


class Wire(abc.ABC):
    """One provider API's adapter (see the module docstring)."""

    name: ClassVar[str]  # the API's name in the request log and a summary's credentials
    upstream: ClassVar[str]  # which of the proxy's upstreams it goes to
    render_format: ClassVar[str] = "anthropic"  # the shape the engine renders messages in
    cache: ClassVar[bool] = False  # compactd places cache breakpoints
    server_edits: ClassVar[bool] = False  # Tier 1 may clear through the API's context edits
    session_config: ClassVar[dict[str, Any] | None] = None  # a new session's configuration
    own_headers: ClassVar[tuple[str, ...]] = ()  # headers (or prefixes ending in "-") never
    # sent to another wire's upstream
    auth_headers: ClassVar[tuple[str, ...]] = ()  # headers carrying the client's credentials
    relayed_headers: ClassVar[tuple[str, ...]] = ()  # kept beside them for a summary

    decompose: ClassVar[Callable[[Any], list[Spec]]] = staticmethod(from_anthropic)
    # each message decomposes on its own (a repeated one is not read again: `history`)
    decompose_by_message: ClassVar[bool] = True

    @abc.abstractmethod
    def routes(self) -> list[Route]: ...

    @abc.abstractmethod
    def owns(self, path: str) -> bool:
        """Whether refusals on `path` are in this API's shape."""

    def claims(self, headers: Mapping[str, str]) -> bool:
        """Whether a request on a path two wires share (a model list) is this wire's."""
        return True

    # ---- reading ---------------------------------------------------------------------------

    @abc.abstractmethod
    def check_content_type(self, value: str | None) -> None:
        """A body that is not JSON by its content type refused as the API refuses it."""

    @abc.abstractmethod
    def not_json(self) -> ApiError:
        """A body that does not parse, in the API's words."""

    @abc.abstractmethod
    def read(self, incoming: Incoming) -> Turn:
        """The request as a `Turn`; `ApiError` in the API's words for what it refuses;
        `PassThrough` for a request with nothing to manage (sent on as it came)."""

    def read_count(self, incoming: Incoming) -> Turn | None:
        """A token count's request as a `Turn` (None: counted as the client sent it)."""
        return None

    # ---- writing ---------------------------------------------------------------------------

    @abc.abstractmethod
    def outgoing(
        self,
        turn: Turn,
        rendered: dict[str, Any],
        *,
        recall: bool,
        notes: list[dict[str, Any]] | None,
        reserve: int | None,
    ) -> dict[str, Any]:
        """The client's body with compactd's rendering in place of its history; `recall`:
        `compactd_recall` offered; `notes`: what recalls made beside the client's own calls
        returned; `reserve`: the output limit capped to the budget's reserve (`--window`)."""

    def headers(
        self, turn: Turn, client: Mapping[str, str], rendered: Any
    ) -> dict[str, str | None]:
        """Headers set (None: removed) on the upstream request; `client`: the client's."""
        return {}

    def counted_body(
        self, turn: Turn, rendered: dict[str, Any], tail: list[dict[str, Any]]
    ) -> dict[str, Any]:
        """A token count's body: the rendered history, then the request's `tail`."""
        raise NotImplementedError

    # ---- answers and failures --------------------------------------------------------------

    @abc.abstractmethod
    def stream_relay(self, recall: bool) -> StreamedRelay: ...

    @abc.abstractmethod
    def whole_relay(self, recall: bool) -> WholeRelay: ...

    @abc.abstractmethod
    def error_body(self, exc: ApiError) -> dict[str, Any]:
        """`exc` in the API's error shape."""

    @abc.abstractmethod
    def too_long(self, exc: CannotFit) -> ApiError:
        """compactd's "cannot fit" in the words the API says a prompt over the window in,
        so the agent's own reaction to that (its compaction) runs."""

    @abc.abstractmethod
    def overflow(self, status: int, data: bytes) -> Overflow | None:
        """The upstream's prompt-too-long refusal, read (None: another answer)."""

    # ---- credentials and summaries --------------------------------------------------------

    def secrets(self, headers: Mapping[str, str], query: Mapping[str, str]) -> list[str]:
        """The secrets a request carries on this wire (scrubbed from every log and body)."""
        found = []
        for name in self.auth_headers:
            value = headers.get(name)
            if value:
                found.append(value[7:].strip() if value[:7].lower() == "bearer " else value)
        return found

    def credentials(self, headers: Mapping[str, str], query: Mapping[str, str]) -> dict[str, str]:
        """The headers a summary asks the upstream with, as the client asked."""
        wanted = (*self.auth_headers, *self.relayed_headers)
        return {k.lower(): v for k, v in headers.items() if k.lower() in wanted}

    @abc.abstractmethod
    async def summarize(
        self, held: Credentials, request: SummaryRequest, *, model: str, timeout: float
    ) -> SummaryResult:
        """One summary from the client's own model through this wire's upstream."""


def own_header(name: str, owned: tuple[str, ...]) -> bool:
    """Whether header `name` is among `owned` (a name, or a prefix ending in "-")."""
    lower = name.lower()
    return any(lower == o or (o.endswith("-") and lower.startswith(o)) for o in owned)


def json_object(data: bytes) -> dict[str, Any] | None:
    """`data` as a JSON object (None: not JSON, or not an object)."""
    try:
        value = orjson.loads(data)
    except orjson.JSONDecodeError:
        return None
    return value if isinstance(value, dict) else None


def bearer(headers: Mapping[str, str]) -> str | None:
    value = headers.get("authorization", "")
    return value[7:].strip() if value[:7].lower() == "bearer " else None


def json_content(value: str | None) -> bool:
    """A content type the APIs read as JSON (no header at all is taken as JSON)."""
    media = (value or "application/json").split(";", 1)[0].strip().lower()
    return media == "application/json" or (
        media.startswith("application/") and media.endswith("+json")
    )


def over_window(exc: CannotFit) -> tuple[int, int]:
    """(the window, the tokens over it) of compactd's "cannot fit", for an API's words."""
    limit = int(exc.data.get("limit") or 0)
    tokens = max(int(exc.data.get("tokens") or exc.data.get("reported") or 0), limit + 1)
    return limit, tokens
