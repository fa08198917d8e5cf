"""OpenAI's Chat Completions API's adapter (`/v1/chat/completions`: what Qwen Code, opencode
and aider speak to OpenAI-compatible servers).

The messages are converted by the engine's own `from_openai` and rendered back by its OpenAI
renderer. The leading system/developer messages are the prompt's fixed start; one in
mid-conversation is kept as a user annotation. A streamed answer's chunks pass through as they
come (a streamed call cannot be held back whole, so `compactd_recall` is not offered on a
stream); a whole answer that calls only `compactd_recall` is followed up.
"""

from __future__ import annotations

from typing import Any

from ..context.decompose import from_openai
from ..context.errors import CannotFit
from ..context.recall import TOOL_NAME as RECALL_NAME
from ..context.summarizer.types import SummaryRequest
from .history import PassThrough
from .http import scrubbed
from .openai import (
    NOTHING_TO_KEEP,
    OpenAIRelay,
    OpenAIWire,
    error_envelope,
    recall_call,
    recall_function,
    session_key,
    text_of,
)
from .sse import Event, encode
from .wire import ApiError, Incoming, Route, Turn, invalid, over_window

USAGE = ("prompt_tokens", "prompt_tokens_details", "completion_tokens")
"""Where a Chat Completions usage holds the prompt (its cached part inside) and the output."""


def system_turn(message: Any) -> Any:
    """A system or developer message in mid-conversation as a user annotation."""
    if isinstance(message, dict) and message.get("role") in ("system", "developer"):
        text = text_of(message.get("content"))
        return {"role": "user", "content": f"<system-reminder>\n{text}\n</system-reminder>"}
    return message


# ---- the answer --------------------------------------------------------------------------------


class ChatStream(OpenAIRelay):
    """A Chat Completions answer: streamed chunks pass through as they come (the recall tool is
    not offered on a stream); a whole answer that calls only `compactd_recall` is followed up."""

    def __init__(self, *, recall: bool) -> None:
        super().__init__(recall=recall)
        self._message: dict[str, Any] | None = None
        self._answer: dict[str, Any] | None = None
        self.finish_seen = False

    def event(self, event: Event) -> bytes | None:
        data = event.data
        if event.done:
            self.ended = True
        if not isinstance(data, dict):
            return event.raw
        if data.get("error"):  # the API's own report of a failure mid-stream
            self.ended = self.failed = True
            return scrubbed(event.raw)
        if isinstance(data.get("usage"), dict):
            self.round_used(data["usage"], *USAGE)
        if any(isinstance(c, dict) and c.get("finish_reason") for c in data.get("choices") or []):
            self.finish_seen = True  # the usage and `[DONE]` may follow
        return event.raw

    @property
    def whole_at_close(self) -> bool:
        """`[DONE]`, or a close after the finish chunk (some servers leave `[DONE]` out)."""
        return self.ended or self.finish_seen

    def failure(self, exc: ApiError) -> bytes:
        """A failure as Chat Completions reports one mid-stream: a chunk holding only `error`
        (the SDKs raise on it)."""
        return encode(None, error_envelope(exc))

    def take(self, answer: dict[str, Any]) -> None:
        choices = answer.get("choices") or [{}]
        message = dict((choices[0] or {}).get("message") or {})
        self.round_used(answer.get("usage"), *USAGE)
        self._message = message
        self._answer = answer

    def follow_up_calls(self) -> list[dict[str, Any]]:
        calls = (self._message or {}).get("tool_calls") or []
        if not self.recall or not calls:
            return []
        if any((c.get("function") or {}).get("name") != RECALL_NAME for c in calls):
            return []
        return [recall_call(c.get("id"), (c.get("function") or {}).get("arguments")) for c in calls]

    def follow_up(self, body: dict[str, Any], results: list[dict[str, Any]]) -> dict[str, Any]:
        tool_messages = [
            {"role": "tool", "tool_call_id": r["tool_use_id"], "content": r["content"]}
            for r in results
        ]
        return {**body, "messages": [*body["messages"], self._message, *tool_messages]}

    def answer(self) -> dict[str, Any]:
        answer = dict(self._answer or {})
        if self.recall and self._message is not None:
            message = dict(self._message)
            calls = [
                c
                for c in message.get("tool_calls") or []
                if (c.get("function") or {}).get("name") != RECALL_NAME
            ]
            if calls:
                message["tool_calls"] = calls
            else:
                message.pop("tool_calls", None)
            choices = list(answer.get("choices") or [{}])
            choices[0] = {**(choices[0] or {}), "message": message}
            answer["choices"] = choices
        return answer


# ---- the adapter -------------------------------------------------------------------------------


class ChatWire(OpenAIWire):
    """Chat Completions."""

    name = "chat"
    render_format = "openai"
    decompose = staticmethod(from_openai)
    decompose_by_message = False  # a tool message joins the results before it

    def routes(self) -> list[Route]:
        return [Route("POST", "/v1/chat/completions", "generate")]

    def owns(self, path: str) -> bool:
        return path.startswith("/v1/chat/completions")

    def read(self, incoming: Incoming) -> Turn:
        body = self.body_of(incoming)
        raw = body.get("messages")
        if not isinstance(raw, list) or not raw:
            raise invalid("messages: Input should be a non-empty list")
        n = 0
        while (
            n < len(raw)
            and isinstance(raw[n], dict)
            and raw[n].get("role") in ("system", "developer")
        ):
            n += 1
        fixed, rest = raw[:n], [system_turn(m) for m in raw[n:]]
        if not rest:
            raise PassThrough(NOTHING_TO_KEEP, kind="no conversation")
        stream = body.get("stream") is True
        max_out = body.get("max_completion_tokens") or body.get("max_tokens")
        return Turn(
            body=body,
            model=body["model"],
            messages=rest,
            key=session_key(incoming.headers, body, [*fixed, *rest[:1]]),
            system="\n\n".join(text_of(m.get("content")) for m in fixed) or None,
            tools=body.get("tools") if isinstance(body.get("tools"), list) else None,
            max_output=max_out if isinstance(max_out, int) and max_out > 0 else 0,
            stream=stream,
            recall=False if stream else None,  # a streamed call cannot be held back here
            kept=fixed,
        )

    def outgoing(
        self,
        turn: Turn,
        rendered: dict[str, Any],
        *,
        recall: bool,
        notes: list[dict[str, Any]] | None,
        reserve: int | None,
    ) -> dict[str, Any]:
        out = dict(turn.body)
        sent = [m for m in rendered["messages"] if m.get("role") != "system"]
        out["messages"] = [*turn.kept, *sent]
        if recall:
            tools = turn.body.get("tools") if isinstance(turn.body.get("tools"), list) else []
            out["tools"] = [*tools, {"type": "function", "function": recall_function()}]
        key = "max_completion_tokens" if "max_completion_tokens" in turn.body else "max_tokens"
        self.capped(out, key, turn, reserve)
        return out

    def stream_relay(self, recall: bool) -> ChatStream:
        return ChatStream(recall=recall)

    def whole_relay(self, recall: bool) -> ChatStream:
        return ChatStream(recall=recall)

    def too_long(self, exc: CannotFit) -> ApiError:
        limit, tokens = over_window(exc)
        return ApiError(
            400,
            "invalid_request_error",
            f"This model's maximum context length is {limit} tokens. However, your messages "
            f"resulted in {tokens} tokens. Please reduce the length of the messages.",
            "context_length_exceeded",
        )

    def summary_request(self, request: SummaryRequest, model: str) -> tuple[str, dict[str, Any]]:
        return "/v1/chat/completions", {
            "model": model,
            "messages": [
                {"role": "system", "content": request.system},
                {"role": "user", "content": request.prompt},
            ],
            "max_completion_tokens": request.max_output_tokens,
        }

    def summary_answer(self, answer: dict[str, Any]) -> tuple[str, bool, int, int]:
        choice = (answer.get("choices") or [{}])[0]
        usage = answer.get("usage") or {}
        return (
            str((choice.get("message") or {}).get("content") or ""),
            choice.get("finish_reason") == "length",
            usage.get("prompt_tokens", 0),
            usage.get("completion_tokens", 0),
        )
