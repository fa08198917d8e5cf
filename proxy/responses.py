"""OpenAI's Responses API's adapter (`/v1/responses`, what Codex speaks; its remote compaction
`/v1/responses/compact` relayed as the client sent it).

A session holds one shape of message, the Anthropic-shaped blocks `session/append` takes, so the
items are converted by hand both ways: everything the engine has no block for (reasoning with its
encrypted content, images, a developer message in mid-conversation) rides in an opaque
`openai_item` block and comes back byte for byte. A function call keeps its arguments string
unless Tier 1 shortened its input. The answer streams as it arrives; `compactd_recall` calls are
held back, and a response that makes no other call is continued by the next one.
"""

from __future__ import annotations

from typing import Any

import orjson

from ..context.errors import CannotFit
from ..context.recall import TOOL_NAME as RECALL_NAME
from ..context.summarizer.types import SummaryRequest
from .history import PassThrough
from .http import scrubbed
from .openai import (
    NOTHING_TO_KEEP,
    OpenAIRelay,
    OpenAIWire,
    arguments,
    error_envelope,
    recall_call,
    recall_function,
    session_key,
    text_of,
)
from .sse import Event, encode
from .wire import ApiError, Incoming, Route, Turn, invalid

OPAQUE = "openai_item"
ASSISTANT_ITEMS = ("reasoning", "function_call", "custom_tool_call")
OUTPUT_ITEMS = {
    "function_call_output": "function_call",
    "custom_tool_call_output": "custom_tool_call",
}
IMAGE_TYPES = ("image/png", "image/jpeg", "image/gif", "image/webp")
USAGE = ("input_tokens", "input_tokens_details", "output_tokens")
"""Where a Responses usage holds the prompt (its cached part inside) and the output."""


# ---- items <-> the session's messages --------------------------------------------------------


def _output_content(output: Any) -> Any:
    if isinstance(output, str):
        return output
    if isinstance(output, list):
        return [
            {"type": "text", "text": p.get("text", "")}
            if isinstance(p, dict) and p.get("type") in ("input_text", "output_text")
            else {"type": OPAQUE, "item": p}
            for p in output
        ]
    return orjson.dumps(output).decode()


def _image_block(part: dict[str, Any]) -> dict[str, Any] | None:
    """An `input_image` of inline bytes as the session's image block, so it is priced as an
    image (by its size), not as its base64 text; its other keys ride along for the way back.
    None for any other image (a URL, a file id): it stays an opaque item."""
    url = part.get("image_url")
    if not (isinstance(url, str) and url.startswith("data:") and ";base64," in url):
        return None
    media, data = url[5:].split(";base64,", 1)
    if media not in IMAGE_TYPES:
        return None
    rest = {k: v for k, v in part.items() if k not in ("type", "image_url")}
    block = {"type": "image", "source": {"type": "base64", "media_type": media, "data": data}}
    return {**block, "openai": rest} if rest else block


def _user_blocks(content: Any) -> list[dict[str, Any]]:
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    blocks = []
    for part in content or []:
        if isinstance(part, dict) and part.get("type") in ("input_text", "output_text"):
            blocks.append({"type": "text", "text": str(part.get("text", ""))})
        elif isinstance(part, dict) and part.get("type") == "input_image" and _image_block(part):
            blocks.append(_image_block(part) or {})
        else:
            blocks.append({"type": OPAQUE, "item": part})
    return blocks


def split_instructions(items: list[Any]) -> tuple[list[Any], list[Any]]:
    """The leading developer/system messages (the prompt's fixed start) and the rest."""
    n = 0
    while (
        n < len(items)
        and isinstance(items[n], dict)
        and items[n].get("role") in ("developer", "system")
        and items[n].get("type", "message") == "message"
    ):
        n += 1
    return items[:n], items[n:]


def items_to_messages(items: list[Any]) -> list[dict[str, Any]]:
    """Responses input items as the session's messages (see the module docstring): the items
    of one assistant turn (reasoning, text, calls) in one assistant message, each run of call
    outputs in one user message of results, every other item a message of its own."""
    messages: list[dict[str, Any]] = []

    def assistant(blocks: list[dict[str, Any]]) -> None:
        if messages and messages[-1]["role"] == "assistant":
            messages[-1]["content"].extend(blocks)
        else:
            messages.append({"role": "assistant", "content": blocks})

    results_open = False
    for i, item in enumerate(items):
        if not isinstance(item, dict):
            raise invalid(f"input[{i}]: Input should be a valid dictionary")
        kind = item.get("type", "message")
        role = item.get("role")
        is_result = kind in OUTPUT_ITEMS
        if kind == "message" and role == "user":
            messages.append({"role": "user", "content": _user_blocks(item.get("content"))})
        elif kind == "message" and role == "assistant":
            content = item.get("content")
            parts = (
                [{"type": "output_text", "text": content}] if isinstance(content, str) else content
            )
            assistant(
                [
                    {"type": "text", "text": str(part.get("text", ""))}
                    if isinstance(part, dict) and part.get("type") == "output_text"
                    else {"type": OPAQUE, "item": part}
                    for part in parts or []
                ]
            )
        elif kind == "message":  # a developer or system message in mid-conversation
            messages.append(
                {"role": "user", "meta": True, "content": [{"type": OPAQUE, "item": item}]}
            )
        elif kind in ("function_call", "custom_tool_call"):
            call_id = item.get("call_id")
            if not isinstance(call_id, str) or not call_id:
                raise invalid(f"input[{i}]: a {kind} needs a call_id")
            raw = item.get("arguments") if kind == "function_call" else item.get("input")
            args = arguments(raw) if kind == "function_call" else {"input": raw}
            extra = {k: v for k, v in item.items() if k not in ("type", "call_id", "name")}
            assistant(
                [
                    {
                        "type": "tool_use",
                        "id": call_id,
                        "name": str(item.get("name", "")),
                        "input": args,
                        "openai": {"type": kind, **extra},
                    }
                ]
            )
        elif is_result:
            call_id = item.get("call_id")
            if not isinstance(call_id, str) or not call_id:
                raise invalid(f"input[{i}]: a {kind} needs a call_id")
            block = {
                "type": "tool_result",
                "tool_use_id": call_id,
                "content": _output_content(item.get("output")),
            }
            if results_open:
                messages[-1]["content"].append(block)
            else:
                messages.append({"role": "user", "content": [block]})
        elif kind in ASSISTANT_ITEMS or kind.endswith("_call"):
            assistant([{"type": OPAQUE, "item": item}])
        else:
            messages.append(
                {"role": "user", "meta": True, "content": [{"type": OPAQUE, "item": item}]}
            )
        results_open = is_result
    return messages


def _call_item(block: dict[str, Any]) -> dict[str, Any]:
    openai = dict(block.get("openai") or {"type": "function_call"})
    kind = openai.pop("type", "function_call")
    if kind == "custom_tool_call":
        value = block.get("input", {}).get("input", "")
        return {
            "type": kind,
            **openai,
            "call_id": block["id"],
            "name": block["name"],
            "input": value if isinstance(value, str) else orjson.dumps(value).decode(),
        }
    raw = openai.pop("arguments", None)
    if not (isinstance(raw, str) and arguments(raw) == block.get("input")):
        raw = orjson.dumps(block.get("input", {})).decode()  # Tier 1 shortened it
    return {"type": kind, **openai, "call_id": block["id"], "name": block["name"], "arguments": raw}


def _result_output(content: Any) -> Any:
    if isinstance(content, str):
        return content
    if all(isinstance(b, dict) and b.get("type") == "text" for b in content or []):
        return "\n".join(b.get("text", "") for b in content)
    return [
        {"type": "input_text", "text": b.get("text", "")}
        if b.get("type") == "text"
        else b.get("item", {"type": "input_text", "text": f"[{b.get('type')} omitted]"})
        for b in content
    ]


def _text_item(role: str, texts: list[str]) -> dict[str, Any]:
    if role == "assistant":
        parts = [{"type": "output_text", "text": t, "annotations": []} for t in texts]
    else:
        parts = [{"type": "input_text", "text": t} for t in texts]
    return {"type": "message", "role": role, "content": parts}


def messages_to_items(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The rendered messages back as Responses input items, in their order: each run of text
    one message item, opaque items as they came, calls and their outputs as items."""
    items: list[dict[str, Any]] = []
    kinds: dict[str, str] = {}  # call id -> the kind of call (its output's kind follows)
    for message in messages:
        role = str(message.get("role"))
        texts: list[str] = []
        for block in message.get("content") or []:
            kind = block.get("type")
            if kind == "text":
                texts.append(block.get("text", ""))
                continue
            if kind == "thinking" or kind == "redacted_thinking":
                continue  # no place for them in this API
            if texts:
                items.append(_text_item(role, texts))
                texts = []
            if kind == OPAQUE:
                item = block.get("item") or {}
                if item.get("type") in ("input_image", "input_file", "refusal"):
                    item = {"type": "message", "role": role, "content": [item]}
                items.append(item)
            elif kind == "tool_use":
                call = _call_item(block)
                kinds[block["id"]] = call["type"]
                items.append(call)
            elif kind == "tool_result":
                use_id = block.get("tool_use_id", "")
                items.append(
                    {
                        "type": f"{kinds.get(use_id, 'function_call')}_output",
                        "call_id": use_id,
                        "output": _result_output(block.get("content", "")),
                    }
                )
            elif kind == "image":
                source = block.get("source") or {}
                url = f"data:{source.get('media_type')};base64,{source.get('data')}"
                part = {"type": "input_image", "image_url": url, **(block.get("openai") or {})}
                items.append({"type": "message", "role": "user", "content": [part]})
        if texts:
            items.append(_text_item(role, texts))
    return items


# ---- the answer --------------------------------------------------------------------------------


class ResponsesStream(OpenAIRelay):
    """A Responses answer: `compactd_recall` calls are held back, and when a response makes
    no other call the next response continues it — one `response.completed` for the client,
    its `output` the items the client saw, the events numbered on."""

    def __init__(self, *, recall: bool) -> None:
        super().__init__(recall=recall)
        self.output: list[dict[str, Any]] = []  # this round's items, as the upstream sent them
        self.visible: list[dict[str, Any]] = []  # every item the client saw
        self._index: dict[int, int | None] = {}
        self._next = 0
        self._sequence = 0
        self._completed: dict[str, Any] | None = None
        self._held_end: Event | None = None
        self._id: str | None = None  # the first response's id, the one the client knows
        self._snapshot: dict[str, Any] = {}  # the response as the client last saw it whole

    def _renumbered(self, event: Event, data: dict[str, Any]) -> bytes:
        data = dict(data)
        if "sequence_number" in data:
            data["sequence_number"] = self._sequence
        self._sequence += 1
        return encode(event.name, data)

    def event(self, event: Event) -> bytes | None:
        data = event.data
        if not isinstance(data, dict):
            return event.raw
        kind = data.get("type", "")
        if kind in ("response.created", "response.in_progress", "response.queued"):
            if self.continuing:
                return None
            self._snapshot = dict(data.get("response") or {})
            self._id = self._snapshot.get("id", self._id)
            return self._renumbered(event, data)
        if kind == "error":  # the API's own report of a failure mid-stream
            self.ended = self.failed = True
            return scrubbed(self._renumbered(event, data))
        if "output_index" in data:
            index = data["output_index"]
            if kind == "response.output_item.added":
                item = data.get("item") or {}
                held = self.recall and item.get("name") == RECALL_NAME
                self._index[index] = None if held else self._next
                if not held:
                    self._next += 1
            if kind == "response.output_item.done":
                item = data.get("item") or {}
                self.output.append(item)
                if self._index.get(index) is not None:
                    self.visible.append(item)
            target = self._index.get(index, index)
            if target is None:
                return None
            return self._renumbered(event, {**data, "output_index": target})
        if kind in ("response.completed", "response.incomplete", "response.failed"):
            self.ended = True
            self.failed = kind == "response.failed"
            response = dict(data.get("response") or {})
            self.round_used(response.get("usage"), *USAGE)
            self._completed = response
            if not self.output:  # the stream carried no item events: take the final output
                self.output = list(response.get("output") or [])
                self.visible = [i for i in self.output if i.get("name") != RECALL_NAME]
            if kind == "response.completed" and self.follow_up_calls():
                self._held_end = event
                return None
            response["output"] = self.visible if self.recall else response.get("output")
            if self._id is not None:  # one response for the client, whatever the rounds
                response["id"] = self._id
            out = self._renumbered(event, {**data, "response": response})
            return scrubbed(out) if self.failed else out
        return self._renumbered(event, data) if "sequence_number" in data else event.raw

    def failure(self, exc: ApiError) -> bytes:
        """A failure as the Responses API ends a stream with one: `response.failed`, the
        response carrying its `error` (Codex retries on it; a stream that just stops is an
        error to it too, but one it cannot tell apart)."""
        error = error_envelope(exc)["error"]
        code = error.get("code") or _FAILED_CODES.get(str(error.get("type")), "server_error")
        response = {
            **self._snapshot,
            "object": "response",
            "status": "failed",
            "error": {"code": code, "message": str(error.get("message") or exc.message)},
            "output": self.visible,
        }
        if self._id is not None:
            response["id"] = self._id
        failed = {"type": "response.failed", "response": response, "sequence_number": 0}
        return self._renumbered(Event(b"", "response.failed", failed), failed)

    def follow_up_calls(self) -> list[dict[str, Any]]:
        calls = [i for i in self.output if i.get("type") in ("function_call", "custom_tool_call")]
        if not self.recall or not calls or any(c.get("name") != RECALL_NAME for c in calls):
            return []
        return [recall_call(c.get("call_id"), c.get("arguments")) for c in calls]

    def follow_up(self, body: dict[str, Any], results: list[dict[str, Any]]) -> dict[str, Any]:
        outputs = [
            {"type": "function_call_output", "call_id": r["tool_use_id"], "output": r["content"]}
            for r in results
        ]
        return {**body, "input": [*body["input"], *self.output, *outputs]}

    def continue_with_next_stream(self) -> None:
        super().continue_with_next_stream()
        self.output = []
        self._index = {}
        self._held_end = None

    def take(self, message: dict[str, Any]) -> None:
        self.output = list(message.get("output") or [])
        self.visible.extend(
            i for i in self.output if not (self.recall and i.get("name") == RECALL_NAME)
        )
        self.round_used(message.get("usage"), *USAGE)
        self._completed = message

    def answer(self) -> dict[str, Any]:
        return {**(self._completed or {}), "output": self.visible}


_FAILED_CODES = {"rate_limit_error": "rate_limit_exceeded"}
"""A `response.failed` error's `code` for an error `type` that has its own (else server_error)."""


# ---- the adapter -------------------------------------------------------------------------------


class ResponsesWire(OpenAIWire):
    """The Responses API."""

    name = "responses"

    def routes(self) -> list[Route]:
        return [
            Route("POST", "/v1/responses", "generate"),
            Route(
                "POST",
                "/v1/responses/compact",
                "unmanaged",
                reason="the client's own remote compaction",
                kind="remote compaction",
            ),
            Route("GET", "/v1/models", "forward"),
            Route("GET", "/v1/models/{model}", "forward"),
        ]

    def owns(self, path: str) -> bool:
        # a model list; `/v1/models/{model}:generateContent` is the Gemini API's
        return path.startswith("/v1/responses") or (
            path.startswith("/v1/models") and ":" not in path
        )

    def read(self, incoming: Incoming) -> Turn:
        body = self.body_of(incoming)
        raw_input = body.get("input")
        items: list[Any] = (
            [{"type": "message", "role": "user", "content": raw_input}]
            if isinstance(raw_input, str)
            else raw_input
            if isinstance(raw_input, list)
            else []
        )
        if not items:
            raise invalid("input: Input should be a non-empty list of items or a string")
        fixed, rest = split_instructions(items)
        messages = items_to_messages(rest)
        if not messages:
            raise PassThrough(NOTHING_TO_KEEP, kind="no conversation")
        instructions = [body.get("instructions") or "", *(text_of(i.get("content")) for i in fixed)]
        max_out = body.get("max_output_tokens")
        return Turn(
            body=body,
            model=body["model"],
            messages=messages,
            key=session_key(incoming.headers, body, [body.get("instructions"), *fixed, *rest[:1]]),
            system="\n\n".join(t for t in instructions if t) or None,
            tools=body.get("tools") if isinstance(body.get("tools"), list) else None,
            max_output=max_out if isinstance(max_out, int) and max_out > 0 else 0,
            stream=body.get("stream") is True,
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
        out["input"] = [*turn.kept, *messages_to_items(rendered["messages"])]
        if recall:
            tools = turn.body.get("tools") if isinstance(turn.body.get("tools"), list) else []
            out["tools"] = [*tools, {"type": "function", **recall_function(), "strict": False}]
        self.capped(out, "max_output_tokens", turn, reserve)
        return out

    def stream_relay(self, recall: bool) -> ResponsesStream:
        return ResponsesStream(recall=recall)

    def whole_relay(self, recall: bool) -> ResponsesStream:
        return ResponsesStream(recall=recall)

    def too_long(self, exc: CannotFit) -> ApiError:
        return ApiError(
            400,
            "invalid_request_error",
            "Your input exceeds the context window of this model. Please adjust your input "
            "and try again.",
            "context_length_exceeded",
        )

    def summary_request(self, request: SummaryRequest, model: str) -> tuple[str, dict[str, Any]]:
        return "/v1/responses", {
            "model": model,
            "instructions": request.system,
            "input": request.prompt,
            "max_output_tokens": request.max_output_tokens,
            "store": False,
        }

    def summary_answer(self, answer: dict[str, Any]) -> tuple[str, bool, int, int]:
        text = "".join(
            part.get("text", "")
            for item in answer.get("output") or []
            if item.get("type") == "message"
            for part in item.get("content") or []
            if part.get("type") == "output_text"
        )
        usage = answer.get("usage") or {}
        return (
            text,
            answer.get("status") == "incomplete",
            usage.get("input_tokens", 0),
            usage.get("output_tokens", 0),
        )
