"""Builders of provider messages and the checks every engine test runs on a render.

Message builders return plain Anthropic/OpenAI dicts (what an agent sends), so tests go
through the same decomposition as real clients. `check_rendered` applies the wire-level
invariants of `tests/support/invariants.py` plus the measure checks to one render.
"""

from __future__ import annotations

from typing import Any

import orjson
from compactd.context.engine import Engine, RenderParams
from compactd.context.render.anthropic import MAX_BREAKPOINTS
from compactd.context.render.conversation import FREE, OUTPUT_RESERVE
from compactd.context.render.request import Rendered, RequestSpec
from compactd.context.tokens import Counter
from compactd.context.visibility import ViewOptions

from tests.support.invariants import (
    check_anthropic_pairing,
    check_openai_pairing,
    recount_anthropic,
    recount_openai,
    server_view,
    strip_cache_control,
)
from tests.support.logs import log_bytes  # noqa: F401 (re-exported)

FORMATS = ("anthropic", "openai")


# ---- messages ------------------------------------------------------------------------------


def user(text: str, *, meta: bool = False) -> dict[str, Any]:
    msg: dict[str, Any] = {"role": "user", "content": [{"type": "text", "text": text}]}
    if meta:
        msg["meta"] = True
    return msg


def assistant(*blocks: dict[str, Any] | str) -> dict[str, Any]:
    """An assistant message; bare strings become text blocks."""
    content = [{"type": "text", "text": b} if isinstance(b, str) else b for b in blocks]
    return {"role": "assistant", "content": content}


def call(use_id: str, name: str = "Bash", **inp: Any) -> dict[str, Any]:
    return {"type": "tool_use", "id": use_id, "name": name, "input": inp or {"command": "ls"}}


def result(use_id: str, content: Any = "ok", *, is_error: bool = False) -> dict[str, Any]:
    block: dict[str, Any] = {"type": "tool_result", "tool_use_id": use_id, "content": content}
    if is_error:
        block["is_error"] = True
    return block


def results(*blocks: dict[str, Any], text: str | None = None) -> dict[str, Any]:
    """A user message carrying tool results (and optional text, which becomes meta)."""
    content = list(blocks)
    if text is not None:
        content.append({"type": "text", "text": text})
    return {"role": "user", "content": content}


def thinking(text: str, signature: str = "sig") -> dict[str, Any]:
    return {"type": "thinking", "thinking": text, "signature": signature}


# ---- sessions and rendering ------------------------------------------------------------------


def new_session(engine: Engine, session_id: str | None = None, **kw: Any) -> str:
    """Open (create or load) a session and return its id."""
    session, _created = engine.open(session_id, **kw)
    return session.id


def params(fmt: str = "anthropic", **kw: Any) -> RenderParams:
    view_keys = {"branch", "viewer", "callers", "subcalls", "expose"}
    view = ViewOptions(**{k: v for k, v in kw.items() if k in view_keys})
    spec = RequestSpec(format=fmt, **{k: v for k, v in kw.items() if k not in view_keys})
    return RenderParams(view=view, spec=spec)


def render(engine: Engine, session_id: str, fmt: str = "anthropic", **kw: Any) -> Rendered:
    """Render and run every wire-level check on the result."""
    rendered = engine.render(session_id, params(fmt, **kw))
    check_rendered(rendered, fmt)
    return rendered


def check_rendered(rendered: Rendered, fmt: str, *, recount: bool = True) -> None:
    """Pairing, breakpoints, and measure == render (an independent recount of the bytes,
    which tokenizes the whole request again: `recount=False` skips it in long loops)."""
    request = rendered.request
    if fmt == "anthropic":
        check_anthropic_pairing(request)
        assert breakpoints(request) <= MAX_BREAKPOINTS
        if recount:
            assert rendered.estimate == recount_anthropic(server_view(request), Counter())
            assert rendered.sent_estimate == recount_anthropic(request, Counter())
    else:
        check_openai_pairing(request)
        assert b"cache_control" not in orjson.dumps(request)
        if recount:
            assert rendered.estimate == recount_openai(request, Counter())
    tokens = rendered.tokens()
    cats = tokens["categories"]
    assert tokens["total"] == sum(v for k, v in cats.items() if k not in (OUTPUT_RESERVE, FREE))
    assert tokens["total"] + cats[OUTPUT_RESERVE] + cats[FREE] == tokens["window"]
    assert tokens["outputReserve"] == cats[OUTPUT_RESERVE] == request["max_tokens"]


def breakpoints(request: dict[str, Any]) -> int:
    """How many cache_control markers a request carries."""
    return orjson.dumps(request).count(b'"cache_control"')


def stripped(request: dict[str, Any]) -> dict[str, Any]:
    """`strip_cache_control`, copying through orjson (much faster than deepcopy)."""
    out: dict[str, Any] = orjson.loads(orjson.dumps(request))
    for key in ("system", "tools"):
        for block in out.get(key) or []:
            block.pop("cache_control", None)
    for msg in out.get("messages", []):
        if isinstance(msg.get("content"), list):
            for block in msg["content"]:
                if isinstance(block, dict):
                    block.pop("cache_control", None)
    return out


def wire(request: dict[str, Any]) -> bytes:
    """The request's bytes without cache breakpoints."""
    return orjson.dumps(stripped(request))


def blocks_of(message: dict[str, Any]) -> list[dict[str, Any]]:
    """A wire message's content as a list of blocks (OpenAI strings become one text part)."""
    content = message.get("content")
    if content is None:
        return []
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    return list(content)


def texts(request: dict[str, Any]) -> list[str]:
    """Every text the request carries, in order (text blocks and string contents)."""
    out = []
    for msg in request["messages"]:
        for block in blocks_of(msg):
            if block.get("type") == "text":
                out.append(block["text"])
    return out


def tool_results(request: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Anthropic tool_result blocks by tool_use_id (without cache breakpoints)."""
    out = {}
    for msg in strip_cache_control(request)["messages"]:
        for block in blocks_of(msg):
            if block.get("type") == "tool_result":
                out[block["tool_use_id"]] = block
    return out


def tool_messages(request: dict[str, Any]) -> dict[str, str]:
    """OpenAI tool messages' content by tool_call_id."""
    return {m["tool_call_id"]: m["content"] for m in request["messages"] if m["role"] == "tool"}
