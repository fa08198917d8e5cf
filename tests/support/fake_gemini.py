"""A loopback fake of the Gemini API (`generativelanguage`, v1beta), strict where the API is.

It refuses, with the API's own error envelope (`{"error": {code, message, status}}`) and
wordings: a request without a key (403 PERMISSION_DENIED), a body that is not JSON, a role other
than `user`/`model`, a content with no parts, a prompt over `context_window` in its own count
(about four characters a token of the request's JSON; 258 a picture) — "The input token count
(N) exceeds the maximum number of tokens allowed (W)."; a function call turn that does not
follow a user or function response turn, a function response turn that does not follow a
function call turn or answers a different number of calls; a thought signature it did not issue
("Corrupted thought signature."), and a call of the current turn that lost its signature.

It streams as the API does: `:streamGenerateContent?alt=sse` sends `data: <response>\r\n\r\n`
events, each a whole `GenerateContentResponse` with a piece of the candidate, the last one with
`finishReason` and `usageMetadata`; `cachedContentTokenCount` counts the prefix this request
shares with the latest earlier one (the implicit cache), so prefix stability can be measured.
`:countTokens` answers `{"totalTokens": N}` in the same count.

Replies are scripted like `fake_openai`'s: a queue of `text` / `call` / `error` / `stall` /
`reset` replies, then the `default`, which may be the `agent` model — `steps` shell calls
(`run_shell_command`, or the first tool offered) with outputs of `lines` lines, decided from the
request alone (the last call the request answers names its run and step).

    python -m tests.support.fake_gemini --port 0 [--script FILE]   # prints PORT=<n>

and `FakeGeminiProcess` wraps that, with `requests()`, `load_script()` and `reset()`.
"""

from __future__ import annotations

import base64
import hashlib
import itertools
import json
import re
import threading
import time
from http.server import BaseHTTPRequestHandler
from typing import Any
from urllib.parse import parse_qs, urlsplit

from . import faults
from .fake_openai import FakeProcess
from .loopback import ScriptedUpstream, run_until_stopped
from .scripted_agent import AGENT_SUMMARY_MARKERS, PROGRESS, progress_tag

CONTROL = "/_fake/"
ROUTE = re.compile(r"^/(?P<version>v1beta|v1|v1alpha)/models/(?P<model>[^/:]+):(?P<method>\w+)$")
STEP = re.compile(r"run (?P<run>[0-9a-f]{8}) step (?P<step>\d{4})")
SHELL_TOOLS = ("run_shell_command", "shell", "bash")
IMAGE_TOKENS = 258
DUMMY_SIGNATURES = ("skip_thought_signature_validator", "context_engineering_is_the_way_to_go")
"""What the API documents as a signature for a call it did not sign (a history from elsewhere):
taken, the model told nothing of its thoughts."""
CONTENT_TYPE = "google.ai.generativelanguage.v1beta.Content"
STATUS = {
    400: "INVALID_ARGUMENT",
    403: "PERMISSION_DENIED",
    404: "NOT_FOUND",
    429: "RESOURCE_EXHAUSTED",
    500: "INTERNAL",
    503: "UNAVAILABLE",
}
CALL_AFTER = (
    "Please ensure that function call turn comes immediately after a user turn or after a "
    "function response turn."
)
RESPONSE_AFTER = (
    "Please ensure that function response turn comes immediately after a function call turn."
)
RESPONSE_COUNT = (
    "Please ensure that the number of function response parts is equal to the number of "
    "function call parts of the function call turn."
)


def _tokens(value: Any) -> int:
    """The fake's count of a JSON value: four characters a token, a picture 258."""
    images = 0

    def strip(v: Any) -> Any:
        nonlocal images
        if isinstance(v, dict):
            if "inlineData" in v:
                images += 1
                return {k: strip(x) for k, x in v.items() if k != "inlineData"}
            return {k: strip(x) for k, x in v.items()}
        if isinstance(v, list):
            return [strip(x) for x in v]
        return v

    text = json.dumps(strip(value), separators=(",", ":"))
    return max(1, (len(text) + 3) // 4) + images * IMAGE_TOKENS


def prompt_tokens(body: dict[str, Any]) -> int:
    """What a request's prompt counts: its system instruction, tools and contents."""
    return _tokens(
        {k: body.get(k) for k in ("systemInstruction", "tools", "contents") if k in body}
    )


def signature_of(run: str, step: int) -> str:
    return base64.b64encode(hashlib.sha256(f"sig:{run}:{step}".encode()).digest() * 2).decode()


# ---- what the API refuses ---------------------------------------------------------------------


def _calls(content: dict[str, Any]) -> list[dict[str, Any]]:
    return [p for p in content.get("parts") or [] if isinstance(p, dict) and "functionCall" in p]


def _responses(content: dict[str, Any]) -> list[dict[str, Any]]:
    return [
        p for p in content.get("parts") or [] if isinstance(p, dict) and "functionResponse" in p
    ]


def _is_prompt(content: dict[str, Any]) -> bool:
    """A user turn the user wrote (text, no function responses): where a turn begins."""
    return content.get("role") == "user" and not _responses(content)


def _signed(part: dict[str, Any], signature: str, issued: set[str]) -> bool:
    """A signature this fake issued: in this process, or (the API's are verifiable without
    state: a resumed session's come from an earlier one) the scripted model's own for the
    call's run and step."""
    if signature in issued or signature in DUMMY_SIGNATURES:
        return True
    found = STEP.search(json.dumps(part["functionCall"].get("args") or {}))
    return found is not None and signature == signature_of(found["run"], int(found["step"]))


def request_error(body: Any, issued: set[str]) -> str | None:
    """The first thing in `body` the API refuses, in its words; None when it takes it."""
    if not isinstance(body, dict):
        return 'Invalid JSON payload received. Unknown name "": Root element must be a message.'
    contents = body.get("contents")
    if not isinstance(contents, list) or not contents:
        return "* GenerateContentRequest.contents: contents is not specified\n"
    previous: dict[str, Any] | None = None
    last_prompt = max(
        (i for i, c in enumerate(contents) if isinstance(c, dict) and _is_prompt(c)), default=-1
    )
    for i, content in enumerate(contents):
        if not isinstance(content, dict):
            return f"Invalid value at 'contents[{i}]' (type.googleapis.com/{CONTENT_TYPE})"
        role = content.get("role", "user")
        if role not in ("user", "model"):
            return "Please use a valid role: user, model."
        parts = content.get("parts")
        if not isinstance(parts, list) or not parts:
            return (
                f"* GenerateContentRequest.contents[{i}].parts: contents.parts must not be empty.\n"
            )
        calls, answers = _calls(content), _responses(content)
        if calls and previous is not None and previous.get("role") == "model":
            return CALL_AFTER
        if answers:
            if previous is None or not _calls(previous):
                return RESPONSE_AFTER
            if len(answers) != len(_calls(previous)):
                return RESPONSE_COUNT
        elif previous is not None and _calls(previous):
            return RESPONSE_AFTER
        for position, part in enumerate(calls):
            signature = part.get("thoughtSignature")
            if signature is not None and not _signed(part, signature, issued):
                return "Corrupted thought signature."
            first = position == 0
            if signature is None and first and i > last_prompt and STEP.search(json.dumps(part)):
                name = part["functionCall"].get("name")
                return (
                    "Function call is missing a thought_signature in functionCall parts. This is "
                    "required for tools to work correctly, and missing thought_signature may "
                    "lead to degraded model performance. Additional data, function call "
                    f"`default_api:{name}` , position {i + 1}. Please refer to "
                    "https://ai.google.dev/gemini-api/docs/thought-signatures for more details."
                )
        previous = content
    if previous is not None and _calls(previous):
        return RESPONSE_AFTER
    return None


# ---- the scripted model -----------------------------------------------------------------------


def _texts(contents: list[Any]) -> list[str]:
    return [
        str(p["text"])
        for c in contents
        if isinstance(c, dict)
        for p in c.get("parts") or []
        if isinstance(p, dict) and isinstance(p.get("text"), str) and not p.get("thought")
    ]


def _tool_names(body: dict[str, Any]) -> list[str]:
    return [
        str(d.get("name"))
        for t in body.get("tools") or []
        if isinstance(t, dict)
        for d in t.get("functionDeclarations") or []
        if isinstance(d, dict)
    ]


def step_command(run: str, step: int, lines: int) -> str:
    """A shell command whose output is `lines` numbered lines naming its run and step."""
    return f"seq -f 'run {run} step {step:04d} output line %05g of the listing' 1 {lines}"


def _answered(contents: list[Any]) -> tuple[str, int] | None:
    """The run and step of the call the request's last content answers."""
    if len(contents) < 2 or not isinstance(contents[-1], dict) or not _responses(contents[-1]):
        return None
    for part in reversed(_calls(contents[-2]) if isinstance(contents[-2], dict) else []):
        found = STEP.search(json.dumps(part["functionCall"].get("args") or {}))
        if found:
            return found["run"], int(found["step"])
    return None


def _progress(contents: list[Any]) -> tuple[str, int] | None:
    """The latest step the request shows: a call's, or a summary's progress tag."""
    latest: tuple[str, int] | None = None
    for content in contents:
        for part in (content.get("parts") or []) if isinstance(content, dict) else []:
            if isinstance(part, dict) and "functionCall" in part:
                found = STEP.search(json.dumps(part["functionCall"].get("args") or {}))
                if found:
                    latest = (found["run"], int(found["step"]))
            elif isinstance(part, dict) and isinstance(part.get("text"), str):
                tags = list(PROGRESS.finditer(part["text"]))
                if tags:
                    latest = (tags[-1]["run"], int(tags[-1]["step"]))
    return latest


def agent_parts(body: dict[str, Any], steps: int, lines: int) -> list[dict[str, Any]]:
    """The parts of the scripted agent's answer to `body` (one shell call a step)."""
    contents = [c for c in body.get("contents") or [] if isinstance(c, dict)]
    texts = _texts(contents)
    if texts and any(m.lower() in texts[-1].lower() for m in AGENT_SUMMARY_MARKERS):
        point = _progress(contents)
        return [{"text": f"Ran the listings. {progress_tag(*point) if point else ''}"}]
    names = _tool_names(body)
    tool = next((t for t in SHELL_TOOLS if t in names), None)
    if tool is None:
        return [{"text": "Scripted answer."}]
    answered = _answered(contents)
    if answered is not None:
        run, step = answered[0], answered[1] + 1
    else:
        last = _texts(contents[-1:]) if contents else []
        prompt = " ".join(last)
        tags = list(PROGRESS.finditer(prompt))
        point = (tags[-1]["run"], int(tags[-1]["step"]) + 1) if tags else None
        if point is None or point[1] >= steps:
            point = (hashlib.sha256(prompt.encode()).hexdigest()[:8], 0)
        run, step = point
    thought = {"text": f"Step {step} of run {run}: keep listing.", "thought": True}
    if step >= steps:
        return [thought, {"text": f"Done: ran {steps} commands."}]
    return [
        thought,
        {
            "functionCall": {
                "name": tool,
                "args": {
                    "command": step_command(run, step, lines),
                    "description": f"List step {step}",
                },
            },
            "thoughtSignature": signature_of(run, step),
        },
    ]


def json_answer(body: dict[str, Any]) -> str:
    """A JSON-mode request (an agent's own checks: who speaks next, which model, a loop?)
    answered with an object its schema takes: every required property a plain value."""
    config = body.get("generationConfig") or {}
    schema = config.get("responseJsonSchema") or config.get("responseSchema") or {}
    props = schema.get("properties") or {}
    out: dict[str, Any] = {}
    for name, prop in props.items():
        kind = str((prop or {}).get("type", "string")).lower()
        enum = (prop or {}).get("enum")
        if name == "next_speaker":
            out[name] = "user"
        elif enum:
            out[name] = enum[0]
        elif kind == "boolean":
            out[name] = False
        elif kind in ("number", "integer"):
            out[name] = (prop or {}).get("minimum", 0)
        elif kind == "array":
            out[name] = []
        elif kind == "object":
            out[name] = {}
        else:
            out[name] = "scripted"
    return json.dumps(out)


# ---- the server -------------------------------------------------------------------------------


class FakeGemini(ScriptedUpstream):
    def __init__(self, port: int = 0) -> None:
        super().__init__()
        self.records: list[dict[str, Any]] = []
        self.issued: set[str] = set()
        self.previous: dict[str, list[str]] = {}  # model -> the latest prompt's parts, as JSON
        self.lock = threading.Lock()
        self.ids = itertools.count(1)
        # set by a test that must see a stream break after its client has its first chunk:
        # the reset waits for it (one noticed before the proxy relayed the first chunk would
        # be a failure before the first byte instead)
        self.fault_gate: threading.Event | None = None
        self.serve(port)

    def requests(self) -> list[dict[str, Any]]:
        """What the fake was sent, in order (its status, and the prompt in its count)."""
        with self.lock:
            return list(self.records)

    def handle(self, h: BaseHTTPRequestHandler, method: str) -> None:
        length = int(h.headers.get("content-length") or 0)
        raw = h.rfile.read(length) if length else b""
        url = urlsplit(h.path)
        if url.path.startswith(CONTROL):
            return self.control(h, url.path[len(CONTROL) :], raw)
        try:
            body = json.loads(raw) if raw else None
        except ValueError:
            body = None
        query = parse_qs(url.query)
        record: dict[str, Any] = {
            "path": url.path,
            "query": url.query,
            "headers": {k.lower(): v for k, v in h.headers.items()},
            "body": body,
            "status": 200,
        }
        with self.lock:
            self.records.append(record)
        if not (h.headers.get("x-goog-api-key") or query.get("key")):
            return self.error(
                h,
                record,
                403,
                "Method doesn't allow unregistered callers (callers without established "
                "identity). Please use API Key or other form of API consumer identity to call "
                "this API.",
            )
        route = ROUTE.match(url.path)
        if method == "GET" and url.path.rstrip("/").endswith("/models"):
            return self.send(h, 200, {"models": []})
        if method != "POST" or route is None:
            return self.error(h, record, 404, f"Method not found: {method} {url.path}")
        if body is None:
            return self.error(h, record, 400, "Invalid JSON payload received.")
        model, verb = route["model"], route["method"]
        if verb == "countTokens":
            inner = body.get("generateContentRequest") or body
            return self.send(h, 200, {"totalTokens": prompt_tokens(inner)})
        if verb not in ("generateContent", "streamGenerateContent"):
            return self.error(h, record, 404, f"Method not found: {verb}")
        with self.lock:
            problem = request_error(body, self.issued)
        size = prompt_tokens(body) if problem is None else 0
        record["prompt_tokens"] = size
        if problem is None and self.context_window and size > self.context_window:
            problem = (
                f"The input token count ({size}) exceeds the maximum number of tokens allowed "
                f"({self.context_window})."
            )
        if problem is not None:
            return self.error(h, record, 400, problem)
        with self.lock:
            reply = self.queue.popleft() if self.queue else self.default
        kind = reply.get("kind", "text")
        if kind == "stall":
            time.sleep(float(reply.get("seconds", 1.0)))
            with self.lock:
                reply = self.queue.popleft() if self.queue else self.default
            kind = reply.get("kind", "text")
        if kind == "error":
            status = int(reply.get("status", 503))
            return self.error(
                h,
                record,
                status,
                str(reply.get("message", "The model is overloaded. Please try again later.")),
            )
        parts = self.parts(body, reply)
        with self.lock:
            for part in parts:
                if "thoughtSignature" in part:
                    self.issued.add(part["thoughtSignature"])
            cached = self._cached(model, body)
        record["cached_tokens"] = cached
        response = self.response(model, parts, size, cached)
        if verb == "generateContent":
            return self.send(h, 200, response)
        self.stream(h, response, cut=kind == "reset")

    def _cached(self, model: str, body: dict[str, Any]) -> int:
        """The implicit cache: the tokens of the leading parts this prompt shares with the
        previous one of the same model (0 under the minimum of 1,024)."""
        pieces = [json.dumps(body.get("systemInstruction")), json.dumps(body.get("tools"))]
        pieces += [json.dumps(c) for c in body.get("contents") or []]
        before = self.previous.get(model, [])
        self.previous[model] = pieces
        shared = 0
        for a, b in zip(pieces, before, strict=False):
            if a != b:
                break
            shared += 1
        tokens = _tokens([json.loads(p) for p in pieces[:shared]]) if shared else 0
        return tokens if tokens >= 1024 else 0

    def parts(self, body: dict[str, Any], reply: dict[str, Any]) -> list[dict[str, Any]]:
        kind = reply.get("kind", "text")
        config = body.get("generationConfig") or {}
        if config.get("responseMimeType") == "application/json":
            return [{"text": json_answer(body)}]
        if kind == "agent":
            return agent_parts(body, int(reply.get("steps", 3)), int(reply.get("lines", 50)))
        if kind == "call":
            part: dict[str, Any] = {
                "functionCall": {"name": reply["name"], "args": reply.get("args", {})}
            }
            if reply.get("signature"):
                part["thoughtSignature"] = reply["signature"]
            return [part]
        return [{"text": str(reply.get("text", ""))}]

    def response(
        self, model: str, parts: list[dict[str, Any]], size: int, cached: int
    ) -> dict[str, Any]:
        out_tokens = _tokens(parts)
        usage = {
            "promptTokenCount": size,
            "candidatesTokenCount": out_tokens,
            "totalTokenCount": size + out_tokens,
            "promptTokensDetails": [{"modality": "TEXT", "tokenCount": size}],
        }
        if cached:
            usage["cachedContentTokenCount"] = cached
            usage["cacheTokensDetails"] = [{"modality": "TEXT", "tokenCount": cached}]
        return {
            "candidates": [
                {"content": {"role": "model", "parts": parts}, "finishReason": "STOP", "index": 0}
            ],
            "usageMetadata": usage,
            "modelVersion": model,
            "responseId": f"resp{next(self.ids)}",
        }

    # -- wire output -----------------------------------------------------------------------

    def send(self, h: BaseHTTPRequestHandler, status: int, payload: Any) -> None:
        data = json.dumps(payload).encode()
        h.send_response(status)
        h.send_header("content-type", "application/json; charset=UTF-8")
        h.send_header("content-length", str(len(data)))
        h.end_headers()
        h.wfile.write(data)

    def error(
        self, h: BaseHTTPRequestHandler, record: dict[str, Any], status: int, message: str
    ) -> None:
        record["status"] = status
        record["error"] = message
        self.send(
            h,
            status,
            {
                "error": {
                    "code": status,
                    "message": message,
                    "status": STATUS.get(status, "UNKNOWN"),
                }
            },
        )

    def stream(self, h: BaseHTTPRequestHandler, response: dict[str, Any], *, cut: bool) -> None:
        """The answer as SSE: the text in two pieces, every other part in a chunk of its own,
        `finishReason` and the usage on the last chunk (`cut`: the connection drops after the
        first chunk, with an RST, as a network does)."""
        candidate = response["candidates"][0]
        common = {"modelVersion": response["modelVersion"], "responseId": response["responseId"]}
        chunks: list[list[dict[str, Any]]] = []
        for part in candidate["content"]["parts"]:
            text = part.get("text")
            if isinstance(text, str) and len(text) > 1 and not part.get("thought"):
                chunks += [
                    [{**part, "text": text[: len(text) // 2]}],
                    [{"text": text[len(text) // 2 :]}],
                ]
            else:
                chunks.append([part])
        h.send_response(200)
        h.send_header("content-type", "text/event-stream")
        h.send_header("transfer-encoding", "chunked")
        h.end_headers()
        usage = response["usageMetadata"]
        for i, parts in enumerate(chunks):
            last = i == len(chunks) - 1
            event: dict[str, Any] = {
                "candidates": [
                    {
                        "content": {"role": "model", "parts": parts},
                        **({"finishReason": "STOP"} if last else {}),
                        "index": 0,
                    }
                ],
                "usageMetadata": usage
                if last
                else {
                    "promptTokenCount": usage["promptTokenCount"],
                    "totalTokenCount": usage["promptTokenCount"],
                },
                **common,
            }
            chunk = b"data: " + json.dumps(event).encode() + b"\r\n\r\n"
            h.wfile.write(f"{len(chunk):x}\r\n".encode() + chunk + b"\r\n")
            h.wfile.flush()
            if cut:
                if self.fault_gate is not None:
                    self.fault_gate.wait(120)  # a hang detector, not a time to wait
                faults.reset(h.connection)
                h.close_connection = True
                return
        h.wfile.write(b"0\r\n\r\n")
        h.wfile.flush()

    def control(self, h: BaseHTTPRequestHandler, name: str, raw: bytes) -> None:
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
                self.previous.clear()
            payload = {"ok": True}
        else:
            return self.send(h, 404, {"error": name})
        self.send(h, 200, payload)


class FakeGeminiProcess(FakeProcess):
    """The fake in a child process: `base_url`, `requests()`, `load_script()`, `reset()`."""

    module = "tests.support.fake_gemini"


def main(argv: list[str] | None = None) -> int:
    return run_until_stopped(FakeGemini, "Fake Gemini API on 127.0.0.1", argv)


if __name__ == "__main__":
    raise SystemExit(main())
