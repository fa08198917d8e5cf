"""A loopback fake of the OpenAI Responses and Chat Completions APIs, strict where they are.

It refuses, with the real error shapes and wordings: a prompt over `context_window` in its own
count (about four characters a token of the request's JSON) — 400 `context_length_exceeded`; a
call without its output or an output without its call; a body that is not JSON. It streams SSE
as the APIs do (Responses: named events with sequence numbers, `response.completed` carrying the
whole response and its usage; Chat Completions: `chat.completion.chunk` data lines and
`[DONE]`). Replies are scripted: a queue of `text` / `call` / `error` replies, then the
`default`, which may be the `agent` model — `steps` shell calls with outputs of `lines` lines,
decided from the request alone (its last item names the step it answers), like
`scripted_agent` for Claude Code. A reply with `"fault"` (see `faults`) breaks after `"at"`
events of its stream or bytes of its body. It also lists models (`GET /v1/models`) and answers
Codex's remote compaction (`POST /v1/responses/compact`).

    python -m tests.support.fake_openai --port 0 [--script FILE]   # prints PORT=<n>

and `FakeOpenAIProcess` wraps that, with `requests()`, `load_script()` and `reset()`.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import re
import subprocess
import sys
import tempfile
import threading
import urllib.request
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any

from . import faults
from .loopback import ScriptedUpstream, run_until_stopped
from .scripted_agent import (
    AGENT_SUMMARY_MARKERS,
    PROGRESS,
    progress_of,
    progress_tag,
    resume_point,
    step_command,
)

CONTROL = "/_fake/"
STEP_ID = re.compile(r"^call_(?P<run>[0-9a-f]{8})_(?P<step>\d{4})$")
SHELL_TOOLS = ("exec_command", "shell", "run_shell_command", "bash")
MODELS = ("gpt-5-codex", "gpt-5", "gpt-4o")
DONE = "Done: ran"  # how the scripted model closes a run
RESPONSES_OVERFLOW = (
    "Your input exceeds the context window of this model. Please adjust your input and try again."
)


def estimate(value: Any) -> int:
    return max(1, (len(json.dumps(value, separators=(",", ":"))) + 3) // 4)


def responses_prompt(body: dict[str, Any]) -> int:
    return estimate({k: body.get(k) for k in ("instructions", "input", "tools") if k in body})


def chat_prompt(body: dict[str, Any]) -> int:
    return estimate({k: body.get(k) for k in ("messages", "tools") if k in body})


def _tool_names(body: dict[str, Any]) -> set[str]:
    names = set()
    for tool in body.get("tools") or []:
        if isinstance(tool, dict):
            names.add(tool.get("name") or (tool.get("function") or {}).get("name"))
    return names


# ---- what the APIs refuse --------------------------------------------------------------------


def responses_error(body: Any) -> str | None:
    if not isinstance(body, dict):
        return "The body of your request must be a JSON object."
    if not isinstance(body.get("model"), str):
        return "Missing required parameter: 'model'."
    items = body.get("input")
    if isinstance(items, str):
        return None
    if not isinstance(items, list):
        return "Invalid type for 'input': expected a string or an array of input items."
    calls: dict[str, int] = {}
    answered: set[str] = set()
    for i, item in enumerate(items):
        if not isinstance(item, dict):
            return f"Invalid type for 'input[{i}]': expected an object."
        kind = item.get("type", "message")
        if kind in ("function_call", "custom_tool_call"):
            calls[item.get("call_id")] = i
        elif kind in ("function_call_output", "custom_tool_call_output"):
            call_id = item.get("call_id")
            if call_id not in calls:
                return f"No tool call found for function call output with call_id {call_id}."
            answered.add(call_id)
    for call_id in calls:
        if call_id not in answered:
            return f"No tool output found for function call {call_id}."
    return None


def chat_error(body: Any) -> str | None:
    if not isinstance(body, dict):
        return "The body of your request must be a JSON object."
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        return "Invalid 'messages': empty array. Expected an array with minimum length 1."
    pending: list[str] = []
    for message in messages:
        role = message.get("role") if isinstance(message, dict) else None
        if role == "tool":
            call_id = message.get("tool_call_id")
            if call_id not in pending:
                return (
                    "Invalid parameter: messages with role 'tool' must be a response to a "
                    "preceeding message with 'tool_calls'."
                )
            pending.remove(call_id)
            continue
        if pending:
            return (
                "An assistant message with 'tool_calls' must be followed by tool messages "
                "responding to each 'tool_call_id'. The following tool_call_ids did not have "
                f"response messages: {', '.join(pending)}"
            )
        if role == "assistant":
            pending = [c.get("id") for c in message.get("tool_calls") or []]
    if pending:
        return (
            "An assistant message with 'tool_calls' must be followed by tool messages "
            "responding to each 'tool_call_id'. The following tool_call_ids did not have "
            f"response messages: {', '.join(pending)}"
        )
    return None


# ---- the scripted model ----------------------------------------------------------------------


def _item_texts(items: list[Any]) -> list[str]:
    out = []
    for item in items:
        content = item.get("content") if isinstance(item, dict) else None
        if isinstance(content, str):
            out.append(content)
        for part in content if isinstance(content, list) else []:
            if isinstance(part, dict) and isinstance(part.get("text"), str):
                out.append(part["text"])
    return out


def _answered(item: Any) -> tuple[str, int] | None:
    if isinstance(item, dict) and item.get("type") == "function_call_output":
        found = STEP_ID.match(str(item.get("call_id", "")))
        if found:
            return found["run"], int(found["step"])
    return None


def chat_items(messages: list[Any]) -> list[dict[str, Any]]:
    """Chat Completions messages as the Responses items the scripted agent reads: a tool
    message is a call's output, an assistant's calls are calls, the rest messages."""
    items: list[dict[str, Any]] = []
    for message in messages:
        if not isinstance(message, dict):
            continue
        role = message.get("role")
        if role == "tool":
            items.append(
                {
                    "type": "function_call_output",
                    "call_id": message.get("tool_call_id"),
                    "output": message.get("content"),
                }
            )
            continue
        if message.get("content"):
            items.append({"type": "message", "role": role, "content": message["content"]})
        for call in message.get("tool_calls") or []:
            function = call.get("function") or {}
            items.append(
                {
                    "type": "function_call",
                    "call_id": call.get("id"),
                    "name": function.get("name"),
                    "arguments": function.get("arguments"),
                }
            )
    return items


def unfinished(items: list[Any], steps: int) -> tuple[str, int] | None:
    """The latest step the items show — a call's output, or the progress tag of a summary
    while its run has steps to go, whichever comes later — unless the model said its run was
    done after it: where a model carries on after an agent compacted its own history and
    prompted it to continue (opencode keeps the recent calls after its summary, then says
    "Continue if you have next steps"), and closes a run whose every step the kept calls show.
    A summary of a finished run followed by a prompt starts a new one."""
    latest = None
    for item in items:
        text = " ".join(_item_texts([item]))
        if item.get("role") == "assistant" and text.startswith(DONE):
            latest = None
        latest = _answered(item) or latest
        tags = list(PROGRESS.finditer(text))
        if tags:
            run, step = tags[-1]["run"], int(tags[-1]["step"])
            latest = (run, step) if step + 1 < steps else None
    return latest


def agent_output(body: dict[str, Any], steps: int, lines: int) -> list[dict[str, Any]]:
    """The Responses output items of the scripted agent (see `scripted_agent`); a Chat
    Completions body is read as the same items."""
    raw = body.get("input") if "messages" not in body else chat_items(body["messages"])
    items = (
        raw
        if isinstance(raw, list)
        else [{"type": "message", "role": "user", "content": str(raw or "")}]
    )
    texts = _item_texts(items)
    if texts and any(marker in texts[-1] for marker in AGENT_SUMMARY_MARKERS):
        answered = [a for a in map(_answered, items) if a is not None]
        point = progress_of(texts, answered)
        return [_message(f"Ran the listings. {progress_tag(*point) if point else ''}")]
    tool = next((t for t in SHELL_TOOLS if t in _tool_names(body)), None)
    if tool is None:
        return [_message("Scripted answer.")]
    last = items[-1] if items else {}
    prompt = " ".join(_item_texts([last]))
    answered = _answered(last)
    if answered is None:  # a prompt after an agent's own compaction ("Continue…") carries on
        answered = unfinished(items, steps)
    run, step = resume_point(answered, prompt, steps)
    reasoning = {
        "type": "reasoning",
        "id": f"rs_{run}_{step:04d}",
        "summary": [],
        "encrypted_content": hashlib.sha256(f"{run}:{step}".encode()).hexdigest() * 4,
    }
    if step >= steps:
        return [reasoning, _message(f"{DONE} {steps} commands.")]
    command = step_command(step, lines)
    arguments: dict[str, Any] = (
        {"cmd": command}
        if tool == "exec_command"
        else {"command": ["bash", "-lc", command]}
        if tool == "shell"
        else {"command": command, "description": f"List step {step}"}
    )
    return [
        reasoning,
        {
            "type": "function_call",
            "id": f"fc_{run}_{step:04d}",
            "call_id": f"call_{run}_{step:04d}",
            "name": tool,
            "arguments": json.dumps(arguments),
            "status": "completed",
        },
    ]


LISTING = re.compile(r"listing (?P<step>\d+)", re.IGNORECASE)


def listing_answer(body: dict[str, Any], lines: int) -> str:
    """The scripted model of a chat without tools (aider's): a user whose latest ask names
    "listing N" gets that listing, `lines` lines long, in the answer itself (a reminder may
    follow the ask); a request whose instructions (first message) or last message ask for a
    summary of the conversation gets a short one."""
    items = chat_items(body.get("messages") or [])
    texts = _item_texts(items)
    ends = (texts[0], texts[-1]) if texts else ()
    if any(marker in text for text in ends for marker in AGENT_SUMMARY_MARKERS):
        return "I asked you for numbered listings and you showed each of them."
    asked = [" ".join(_item_texts([i])) for i in items if i.get("role") == "user"]
    found = next((f for f in map(LISTING.search, reversed(asked)) if f), None)
    if found is None:
        return "Scripted answer."
    step = int(found["step"])
    rows = (f"step {step:04d} output line {n:05d} of the listing" for n in range(1, lines + 1))
    return f"Listing {step}:\n\n" + "\n".join(rows)


def _message(text: str) -> dict[str, Any]:
    return {
        "type": "message",
        "id": "msg_" + hashlib.sha256(text.encode()).hexdigest()[:12],
        "status": "completed",
        "role": "assistant",
        "content": [{"type": "output_text", "text": text, "annotations": []}],
    }


# ---- the server --------------------------------------------------------------------------------


class FakeOpenAI(ScriptedUpstream):
    def __init__(self, port: int = 0) -> None:
        super().__init__()
        self.records: list[dict[str, Any]] = []
        self.lock = threading.Lock()
        self.ids = itertools.count(1)
        self.silences = faults.Silences()
        self.stopping = threading.Event()
        self.linger = 0.0  # seconds a Responses stream stays open after its last event
        # set by a test that must see a stream break after its client has its first events:
        # the fault waits for it (a reset noticed before the proxy read what came before it
        # would be a failure before the first byte instead)
        self.fault_gate: threading.Event | None = None
        self.serve(port)

    def handle(self, h: BaseHTTPRequestHandler, method: str) -> None:
        length = int(h.headers.get("content-length") or 0)
        raw = h.rfile.read(length) if length else b""
        path = h.path.split("?", 1)[0]
        if path.startswith(CONTROL):
            return self.control(h, method, path[len(CONTROL) :], raw)
        try:
            body = json.loads(raw) if raw else None
        except ValueError:
            body = None
        record = {
            "path": path,
            "headers": {k.lower(): v for k, v in h.headers.items()},
            "body": body,
            "status": 200,
        }
        with self.lock:
            self.records.append(record)
        if not (h.headers.get("authorization") or "").startswith("Bearer "):
            return self.error(h, record, 401, "You didn't provide an API key.", "invalid_api_key")
        if method == "GET" and (path == "/v1/models" or path.startswith("/v1/models/")):
            return self.models(h, record, path)
        if body is None:
            return self.error(h, record, 400, "We could not parse the JSON body of your request.")
        if path == "/v1/responses/compact":
            return self.compact(h, body)
        if path == "/v1/responses":
            problem = responses_error(body)
            size = responses_prompt(body) if problem is None else 0
            if problem is None and self.context_window and size > self.context_window:
                return self.error(h, record, 400, RESPONSES_OVERFLOW, "context_length_exceeded")
        elif path == "/v1/chat/completions":
            problem = chat_error(body)
            size = chat_prompt(body) if problem is None else 0
            if problem is None and self.context_window and size > self.context_window:
                message = (
                    f"This model's maximum context length is {self.context_window} tokens. "
                    f"However, your messages resulted in {size} tokens. Please reduce the "
                    "length of the messages."
                )
                return self.error(h, record, 400, message, "context_length_exceeded")
        else:
            return self.error(h, record, 404, f"Invalid URL (POST {path})")
        if problem is not None:
            return self.error(h, record, 400, problem)
        with self.lock:
            reply = self.queue.popleft() if self.queue else self.default
        if reply.get("kind") == "error":
            status = int(reply.get("status", 500))
            return self.error(h, record, status, str(reply.get("message", "")), reply.get("code"))
        output = self.output(body, reply)
        fault = None
        if "fault" in reply:
            fault = (faults.check(reply["fault"]), int(reply.get("at", 2)))
        if path == "/v1/responses":
            self.respond_responses(h, body, output, size, fault)
        else:
            self.respond_chat(h, body, output, size, fault)

    def output(self, body: dict[str, Any], reply: dict[str, Any]) -> list[dict[str, Any]]:
        kind = reply.get("kind", "text")
        if kind == "agent":
            return agent_output(body, int(reply.get("steps", 3)), int(reply.get("lines", 50)))
        if kind == "listings":
            return [_message(listing_answer(body, int(reply.get("lines", 50))))]
        if kind == "call":
            return [
                {
                    "type": "function_call",
                    "id": f"fc_{next(self.ids)}",
                    "call_id": reply.get("call_id") or f"call_s{next(self.ids)}",
                    "name": reply["name"],
                    "arguments": json.dumps(reply.get("arguments", {})),
                    "status": "completed",
                }
            ]
        return [_message(str(reply.get("text", "")))]

    # -- wire output ---------------------------------------------------------------------

    def send(
        self,
        h: BaseHTTPRequestHandler,
        status: int,
        payload: Any,
        fault: tuple[str, int] | None = None,
    ) -> None:
        data = json.dumps(payload).encode()
        if fault is not None and fault[0] == "malformed":
            data = data[: max(1, len(data) // 2)]
        h.send_response(status)
        h.send_header("content-type", "application/json")
        h.send_header("content-length", str(len(data)))
        h.send_header("x-request-id", f"req_{next(self.ids)}")
        h.end_headers()
        if fault is None:
            h.wfile.write(data)
            return
        kind, at = fault
        faults.send_whole_broken(
            h.wfile.write, h.connection, data, kind, at, self.silences, self.stopping
        )
        h.close_connection = True

    def models(self, h: BaseHTTPRequestHandler, record: dict[str, Any], path: str) -> None:
        listed = [
            {"id": name, "object": "model", "created": 1_800_000_000, "owned_by": "openai"}
            for name in MODELS
        ]
        wanted = path[len("/v1/models/") :] if path.startswith("/v1/models/") else ""
        if not wanted:
            return self.send(h, 200, {"object": "list", "data": listed})
        found = next((m for m in listed if m["id"] == wanted), None)
        if found is None:
            message = f"The model '{wanted}' does not exist"
            return self.error(h, record, 404, message, "model_not_found")
        self.send(h, 200, found)

    def compact(self, h: BaseHTTPRequestHandler, body: dict[str, Any]) -> None:
        """The Responses API's compaction: the user messages of the input, then one opaque
        compaction item standing for everything else."""
        items = body.get("input") if isinstance(body.get("input"), list) else []
        kept = [
            {
                "type": "message",
                "role": "user",
                "content": [{"type": "input_text", "text": text} for text in _item_texts([i])],
            }
            for i in items
            if isinstance(i, dict) and i.get("type", "message") == "message"
            if i.get("role") == "user"
        ]
        digest = hashlib.sha256(json.dumps(items).encode()).hexdigest()
        compaction = {"type": "compaction", "id": f"cmp_{digest[:12]}", "encrypted_content": digest}
        size = estimate(items)
        self.send(
            h,
            200,
            {
                "id": f"resp_cmp_{next(self.ids)}",
                "object": "response.compaction",
                "created_at": 1_800_000_000,
                "output": [*kept, compaction],
                "usage": {
                    "input_tokens": size,
                    "input_tokens_details": {"cached_tokens": 0},
                    "output_tokens": 64,
                    "output_tokens_details": {"reasoning_tokens": 0},
                    "total_tokens": size + 64,
                },
            },
        )

    def error(
        self,
        h: BaseHTTPRequestHandler,
        record: dict[str, Any],
        status: int,
        message: str,
        code: str | None = None,
    ) -> None:
        record["status"] = status
        kind = "invalid_request_error" if status < 500 else "server_error"
        self.send(
            h, status, {"error": {"message": message, "type": kind, "param": None, "code": code}}
        )

    def stream(
        self,
        h: BaseHTTPRequestHandler,
        events: list[tuple[str | None, Any]],
        fault: tuple[str, int] | None = None,
        linger: float = 0.0,
    ) -> None:
        h.send_response(200)
        h.send_header("content-type", "text/event-stream")
        h.send_header("cache-control", "no-cache")
        h.send_header("transfer-encoding", "chunked")
        h.end_headers()

        def chunk(payload: bytes) -> None:
            h.wfile.write(f"{len(payload):x}\r\n".encode() + payload + b"\r\n")
            h.wfile.flush()

        at = min(fault[1], len(events)) if fault is not None else None
        for position, event in enumerate([*events, None]):
            if position == at and fault is not None:
                if self.fault_gate is not None:
                    self.fault_gate.wait(120)  # a hang detector, not a time to wait
                if fault[0] == "malformed":
                    chunk(faults.MALFORMED)
                elif fault[0] == "end":
                    break
                else:
                    if fault[0] == "silence":
                        self.silences.hold(h.connection, self.stopping)
                    faults.reset(h.connection)
                    h.close_connection = True
                    return
            if event is None:
                break
            name, data = event
            head = f"event: {name}\n" if name else ""
            payload = data if isinstance(data, str) else json.dumps(data)
            chunk(f"{head}data: {payload}\n\n".encode())
        if linger:  # a real upstream may take a moment to close after its last event
            self.stopping.wait(linger)
        h.wfile.write(b"0\r\n\r\n")
        h.wfile.flush()

    def respond_responses(
        self,
        h: BaseHTTPRequestHandler,
        body: dict[str, Any],
        output: list[dict[str, Any]],
        size: int,
        fault: tuple[str, int] | None = None,
    ) -> None:
        out_tokens = estimate(output)
        response = {
            "id": f"resp_{next(self.ids)}",
            "object": "response",
            "created_at": 1_800_000_000,
            "status": "completed",
            "model": body.get("model"),
            "output": output,
            "usage": {
                "input_tokens": size,
                "input_tokens_details": {"cached_tokens": 0},
                "output_tokens": out_tokens,
                "output_tokens_details": {"reasoning_tokens": 0},
                "total_tokens": size + out_tokens,
            },
        }
        if body.get("stream") is not True:
            return self.send(h, 200, response, fault)
        seq = itertools.count()
        pending = {**response, "status": "in_progress", "output": [], "usage": None}
        events: list[tuple[str | None, Any]] = [
            ("response.created", {"type": "response.created", "response": pending}),
            ("response.in_progress", {"type": "response.in_progress", "response": pending}),
        ]
        for index, item in enumerate(output):
            start = {**item, "status": "in_progress"}
            if item["type"] == "message":
                start["content"] = []
            if item["type"] == "function_call":
                start["arguments"] = ""
            events.append(
                (
                    "response.output_item.added",
                    {"type": "response.output_item.added", "output_index": index, "item": start},
                )
            )
            if item["type"] == "message":
                text = item["content"][0]["text"]
                part = {"type": "output_text", "text": "", "annotations": []}
                events.append(
                    (
                        "response.content_part.added",
                        {
                            "type": "response.content_part.added",
                            "item_id": item["id"],
                            "output_index": index,
                            "content_index": 0,
                            "part": part,
                        },
                    )
                )
                for piece in (text[: len(text) // 2], text[len(text) // 2 :]):
                    events.append(
                        (
                            "response.output_text.delta",
                            {
                                "type": "response.output_text.delta",
                                "item_id": item["id"],
                                "output_index": index,
                                "content_index": 0,
                                "delta": piece,
                            },
                        )
                    )
                events.append(
                    (
                        "response.output_text.done",
                        {
                            "type": "response.output_text.done",
                            "item_id": item["id"],
                            "output_index": index,
                            "content_index": 0,
                            "text": text,
                        },
                    )
                )
                events.append(
                    (
                        "response.content_part.done",
                        {
                            "type": "response.content_part.done",
                            "item_id": item["id"],
                            "output_index": index,
                            "content_index": 0,
                            "part": item["content"][0],
                        },
                    )
                )
            elif item["type"] == "function_call":
                events.append(
                    (
                        "response.function_call_arguments.delta",
                        {
                            "type": "response.function_call_arguments.delta",
                            "item_id": item["id"],
                            "output_index": index,
                            "delta": item["arguments"],
                        },
                    )
                )
                events.append(
                    (
                        "response.function_call_arguments.done",
                        {
                            "type": "response.function_call_arguments.done",
                            "item_id": item["id"],
                            "output_index": index,
                            "arguments": item["arguments"],
                        },
                    )
                )
            events.append(
                (
                    "response.output_item.done",
                    {"type": "response.output_item.done", "output_index": index, "item": item},
                )
            )
        events.append(("response.completed", {"type": "response.completed", "response": response}))
        for _name, data in events:
            data["sequence_number"] = next(seq)
        self.stream(h, events, fault, self.linger)

    def respond_chat(
        self,
        h: BaseHTTPRequestHandler,
        body: dict[str, Any],
        output: list[dict[str, Any]],
        size: int,
        fault: tuple[str, int] | None = None,
    ) -> None:
        message: dict[str, Any] = {"role": "assistant", "content": None}
        calls = [i for i in output if i["type"] == "function_call"]
        texts = [i["content"][0]["text"] for i in output if i["type"] == "message"]
        if texts:
            message["content"] = "".join(texts)
        if calls:
            message["tool_calls"] = [
                {
                    "id": c["call_id"],
                    "type": "function",
                    "function": {"name": c["name"], "arguments": c["arguments"]},
                }
                for c in calls
            ]
        out_tokens = estimate(message)
        usage = {
            "prompt_tokens": size,
            "completion_tokens": out_tokens,
            "total_tokens": size + out_tokens,
        }
        finish = "tool_calls" if calls else "stop"
        answer = {
            "id": f"chatcmpl-{next(self.ids)}",
            "object": "chat.completion",
            "created": 1_800_000_000,
            "model": body.get("model"),
            "choices": [{"index": 0, "message": message, "finish_reason": finish}],
            "usage": usage,
        }
        if body.get("stream") is not True:
            return self.send(h, 200, answer, fault)
        base = {
            "id": answer["id"],
            "object": "chat.completion.chunk",
            "created": answer["created"],
            "model": answer["model"],
        }
        events: list[tuple[str | None, Any]] = [
            (
                None,
                {
                    **base,
                    "choices": [
                        {"index": 0, "delta": {"role": "assistant"}, "finish_reason": None}
                    ],
                },
            )
        ]
        if message["content"]:
            for piece in (message["content"][:5], message["content"][5:]):
                events.append(
                    (
                        None,
                        {
                            **base,
                            "choices": [
                                {"index": 0, "delta": {"content": piece}, "finish_reason": None}
                            ],
                        },
                    )
                )
        for i, call in enumerate(message.get("tool_calls") or []):
            arguments = call["function"]["arguments"]
            half = len(arguments) // 2
            first = {**call, "function": {**call["function"], "arguments": arguments[:half]}}
            rest = {"function": {"arguments": arguments[half:]}}
            for delta in (first, rest):  # the arguments arrive in pieces, as the API sends them
                events.append(
                    (
                        None,
                        {
                            **base,
                            "choices": [
                                {
                                    "index": 0,
                                    "delta": {"tool_calls": [{"index": i, **delta}]},
                                    "finish_reason": None,
                                }
                            ],
                        },
                    )
                )
        events.append(
            (None, {**base, "choices": [{"index": 0, "delta": {}, "finish_reason": finish}]})
        )
        if (body.get("stream_options") or {}).get("include_usage"):
            events.append((None, {**base, "choices": [], "usage": usage}))
        events.append((None, "[DONE]"))
        self.stream(h, events, fault)

    def control(self, h: BaseHTTPRequestHandler, method: str, name: str, raw: bytes) -> None:
        if name == "requests":
            with self.lock:
                payload: Any = {"requests": list(self.records)}
        elif name == "script":
            self.load_script(json.loads(raw or b"{}"))
            payload = {"ok": True}
        elif name == "reset":
            with self.lock:
                self.records.clear()
                self.queue.clear()
            payload = {"ok": True}
        else:
            return self.send(h, 404, {"error": name})
        self.send(h, 200, payload)

    def stop(self) -> None:
        self.stopping.set()
        super().stop()


REPO_ROOT = Path(__file__).resolve().parents[2]


class FakeProcess:
    """A fake (the module named by `module`, run with `--port 0`) in a child process:
    `base_url`, `requests()`, `load_script()`, `reset()`."""

    module = "tests.support.fake_openai"

    def __init__(self, script: dict[str, Any] | None = None) -> None:
        self.script = script
        self.process: subprocess.Popen[str] | None = None
        self.port = 0

    def __enter__(self) -> FakeProcess:
        command = [sys.executable, "-m", self.module, "--port", "0"]
        if self.script is not None:
            handle = tempfile.NamedTemporaryFile("w", suffix=".json", delete=False)
            json.dump(self.script, handle)
            handle.close()
            self._script_file = Path(handle.name)
            command += ["--script", handle.name]
        self.process = subprocess.Popen(
            command, cwd=REPO_ROOT, stdout=subprocess.PIPE, text=True, bufsize=1
        )
        assert self.process.stdout is not None
        line = self.process.stdout.readline().strip()
        self.port = int(line.removeprefix("PORT="))
        return self

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def _call(self, name: str, payload: Any = None) -> Any:
        data = None if payload is None else json.dumps(payload).encode()
        request = urllib.request.Request(
            f"{self.base_url}{CONTROL}{name}", data=data, method="GET" if data is None else "POST"
        )
        with urllib.request.urlopen(request, timeout=10) as response:  # loopback only
            return json.loads(response.read())

    def requests(self) -> list[dict[str, Any]]:
        return self._call("requests")["requests"]

    def load_script(self, script: dict[str, Any]) -> None:
        self._call("script", script)

    def reset(self) -> None:
        self._call("reset", {})

    def stop(self) -> None:
        """Kill the fake (its open connections go with it)."""
        if self.process is not None:
            self.process.terminate()
            self.process.wait(timeout=5)
            if self.process.stdout is not None:
                self.process.stdout.close()
            self.process = None

    def __exit__(self, *exc: object) -> None:
        self.stop()
        if getattr(self, "_script_file", None) is not None:
            self._script_file.unlink(missing_ok=True)


class FakeOpenAIProcess(FakeProcess):
    """The OpenAI fake in a child process."""


def main(argv: list[str] | None = None) -> int:
    return run_until_stopped(FakeOpenAI, "Fake OpenAI APIs on 127.0.0.1", argv)


if __name__ == "__main__":
    raise SystemExit(main())
