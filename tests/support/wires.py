"""One conversation written in each wire the proxy speaks (Messages, Chat Completions, Responses),
sent over HTTP streamed or not: what the proxy tests compare across wires.

A history is a list of steps — `User(text)`, `Call(id, output)` (an assistant's tool call and its
result), `Parallel(calls)` (calls made at once), `Said(text)` (an assistant's text) — and
`Wire.body` writes it as that API's request."""

from __future__ import annotations

from typing import Any

import attrs
import httpx2
import orjson

KEY = "sk-wires-0123456789-secret"
MODELS = {"messages": "claude-sonnet-4-5", "chat": "gpt-5", "responses": "gpt-5"}
PATHS = {"messages": "/v1/messages", "chat": "/v1/chat/completions", "responses": "/v1/responses"}
WIRES = tuple(PATHS)


@attrs.frozen
class User:
    text: str


@attrs.frozen
class Call:
    id: str
    output: str
    command: str = "ls"


@attrs.frozen
class Said:
    text: str


@attrs.frozen
class Parallel:
    """Calls the model made at once: one assistant message, their results together."""

    calls: tuple[Call, ...]


Step = User | Call | Said | Parallel


@attrs.frozen
class Wire:
    name: str  # messages | chat | responses
    stream: bool = False

    @property
    def path(self) -> str:
        return PATHS[self.name]

    @property
    def reports_usage(self) -> bool:
        """Whether an answer on this wire carries its usage (a Chat Completions stream does
        only when asked to, with `stream_options`)."""
        return not (self.name == "chat" and self.stream)

    def headers(self, session: str | None = None, key: str | None = KEY) -> dict[str, str]:
        out = {"content-type": "application/json"}
        if self.name == "messages":
            out["anthropic-version"] = "2023-06-01"
            if key:
                out["x-api-key"] = key
            if session:
                out["x-claude-code-session-id"] = session
        else:
            if key:
                out["authorization"] = f"Bearer {key}"
            if session:
                out["session-id"] = session
        return out

    def body(self, history: list[Step], **extra: Any) -> dict[str, Any]:
        model = MODELS[self.name]
        if self.name == "messages":
            out: dict[str, Any] = {
                "model": model,
                "max_tokens": 256,
                "messages": _anthropic(history),
            }
        elif self.name == "chat":
            out = {"model": model, "messages": _chat(history)}
        else:
            out = {"model": model, "input": _responses(history)}
        if self.stream:
            out["stream"] = True
        return {**out, **extra}

    def send(
        self,
        base_url: str,
        history: list[Step],
        session: str | None = None,
        *,
        key: str | None = KEY,
        **extra: Any,
    ) -> httpx2.Response:
        """One request; a stream is read to its end (`.text` holds its events)."""
        return httpx2.post(
            base_url + self.path,
            content=orjson.dumps(self.body(history, **extra)),
            headers=self.headers(session, key),
            timeout=120,
        )


def _calls(step: Call | Parallel) -> tuple[Call, ...]:
    return step.calls if isinstance(step, Parallel) else (step,)


def _anthropic(history: list[Step]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for step in history:
        if isinstance(step, User):
            out.append({"role": "user", "content": step.text})
        elif isinstance(step, Said):
            out.append({"role": "assistant", "content": [{"type": "text", "text": step.text}]})
        else:
            calls = [
                {"type": "tool_use", "id": c.id, "name": "Bash", "input": {"c": c.command}}
                for c in _calls(step)
            ]
            results = [
                {"type": "tool_result", "tool_use_id": c.id, "content": c.output}
                for c in _calls(step)
            ]
            out += [{"role": "assistant", "content": calls}, {"role": "user", "content": results}]
    return out


def _chat(history: list[Step]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for step in history:
        if isinstance(step, User):
            out.append({"role": "user", "content": step.text})
        elif isinstance(step, Said):
            out.append({"role": "assistant", "content": step.text})
        else:
            calls = [
                {
                    "id": c.id,
                    "type": "function",
                    "function": {
                        "name": "shell",
                        "arguments": orjson.dumps({"c": c.command}).decode(),
                    },
                }
                for c in _calls(step)
            ]
            out.append({"role": "assistant", "content": None, "tool_calls": calls})
            out += [
                {"role": "tool", "tool_call_id": c.id, "content": c.output} for c in _calls(step)
            ]
    return out


def _responses(history: list[Step]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for step in history:
        if isinstance(step, User):
            out.append(
                {
                    "type": "message",
                    "role": "user",
                    "content": [{"type": "input_text", "text": step.text}],
                }
            )
        elif isinstance(step, Said):
            out.append(
                {
                    "type": "message",
                    "role": "assistant",
                    "content": [{"type": "output_text", "text": step.text}],
                }
            )
        else:
            out += [
                {
                    "type": "function_call",
                    "call_id": c.id,
                    "name": "shell",
                    "arguments": orjson.dumps({"c": c.command}).decode(),
                }
                for c in _calls(step)
            ]
            out += [
                {"type": "function_call_output", "call_id": c.id, "output": c.output}
                for c in _calls(step)
            ]
    return out


def upstream_bodies(fakes: Any, wire: Wire) -> list[Any]:
    """What the upstream of this wire was sent, oldest first."""
    anthropic, openai = fakes
    if wire.name == "messages":
        return [r.body for r in anthropic.messages_requests()]
    return [r["body"] for r in openai.records if r["path"] == wire.path]


def upstream_statuses(fakes: Any, wire: Wire) -> list[int]:
    """What the upstream of this wire answered, oldest first."""
    anthropic, openai = fakes
    if wire.name == "messages":
        return [r.status for r in anthropic.messages_requests()]
    return [r["status"] for r in openai.records if r["path"] == wire.path]


def reset(fakes: Any) -> None:
    anthropic, openai = fakes
    anthropic.reset()
    with openai.lock:
        openai.records.clear()
        openai.queue.clear()
