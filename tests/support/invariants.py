"""The DESIGN §3 invariants as checks on rendered requests, shared by every test suite.

These read only the wire request (the bytes a provider would get), never engine internals, so
they judge the product the way a provider would.
"""

from __future__ import annotations

import copy
from typing import Any

import orjson
from compactd.context.tokens import (
    BLOCK_OVERHEAD,
    IMAGE_TOKENS,
    MESSAGE_OVERHEAD,
    Counter,
)


def check_anthropic_pairing(request: dict[str, Any]) -> None:
    """Every tool_use is answered first thing in the next user message; no orphan results;
    ids unique; roles alternate; the request does not end on an unanswered call."""
    msgs = request["messages"]
    seen: set[str] = set()
    for i, msg in enumerate(msgs):
        if i:
            assert msg["role"] != msgs[i - 1]["role"], f"messages {i - 1},{i} share a role"
        blocks = msg["content"] if isinstance(msg["content"], list) else []
        if msg["role"] == "assistant":
            uses = [b["id"] for b in blocks if b["type"] == "tool_use"]
            for use in uses:
                assert use not in seen, f"tool_use id {use} repeated"
                seen.add(use)
            assert not any(b["type"] == "tool_result" for b in blocks)
            if uses:
                assert i + 1 < len(msgs), f"tool_use {uses} at the end without results"
                nxt = msgs[i + 1]["content"]
                assert isinstance(nxt, list)
                head = [b for b in nxt[: len(uses)] if b["type"] == "tool_result"]
                assert len(head) == len(uses), f"message {i + 1} does not start with results"
                assert sorted(b["tool_use_id"] for b in head) == sorted(uses), (
                    f"results in message {i + 1} do not match calls {uses}"
                )
                assert not any(b["type"] == "tool_result" for b in nxt[len(uses) :])
        else:
            results = [b for b in blocks if b["type"] == "tool_result"]
            if results:
                assert i > 0 and msgs[i - 1]["role"] == "assistant", f"orphan results at {i}"
                prev = msgs[i - 1]["content"]
                uses = {b["id"] for b in prev if b["type"] == "tool_use"}
                assert {b["tool_use_id"] for b in results} == uses, f"orphan result in {i}"


def check_openai_pairing(request: dict[str, Any]) -> None:
    msgs = request["messages"]
    seen: set[str] = set()
    i = 0
    while i < len(msgs):
        msg = msgs[i]
        if msg["role"] == "assistant" and msg.get("tool_calls"):
            ids = [c["id"] for c in msg["tool_calls"]]
            for call_id in ids:
                assert call_id not in seen
                seen.add(call_id)
            answered = []
            j = i + 1
            while j < len(msgs) and msgs[j]["role"] == "tool":
                answered.append(msgs[j]["tool_call_id"])
                j += 1
            assert sorted(answered) == sorted(ids), f"calls {ids} answered by {answered}"
            i = j
            continue
        assert msg["role"] != "tool", f"orphan tool message at {i}"
        i += 1


def strip_cache_control(request: dict[str, Any]) -> dict[str, Any]:
    """The request without cache breakpoints (they mark, but are not, content)."""
    out = copy.deepcopy(request)

    def strip(blocks: Any) -> None:
        if isinstance(blocks, list):
            for b in blocks:
                if isinstance(b, dict):
                    b.pop("cache_control", None)

    strip(out.get("system"))
    strip(out.get("tools"))
    for msg in out.get("messages", []):
        strip(msg.get("content"))
    return out


def thinking_sequence(request: dict[str, Any]) -> list[str]:
    """Every thinking block's bytes, in request order."""
    out = []
    for msg in request["messages"]:
        if isinstance(msg["content"], list):
            for b in msg["content"]:
                if b.get("type") in ("thinking", "redacted_thinking"):
                    out.append(orjson.dumps(b).decode())
    return out


def recount_anthropic(request: dict[str, Any], counter: Counter) -> int:
    """Tokens of a request counted from its bytes alone, by the documented rules."""
    total = 0
    for block in request.get("system", []):
        total += counter.text(block["text"]) + BLOCK_OVERHEAD
    for tool in request.get("tools", []):
        plain = {k: v for k, v in tool.items() if k != "cache_control"}
        total += counter.tool_definition(plain)
    fmt = request.get("output_config", {}).get("format")
    if fmt:
        total += counter.schema(fmt["schema"])
    for msg in request["messages"]:
        total += MESSAGE_OVERHEAD
        for block in msg["content"]:
            plain = {k: v for k, v in block.items() if k != "cache_control"}
            total += counter.block(plain)
    return total


def recount_openai(request: dict[str, Any], counter: Counter) -> int:
    total = 0
    for tool in request.get("tools", []):
        total += counter.tool_definition(tool)
    fmt = request.get("response_format")
    if fmt:
        total += counter.schema(fmt["json_schema"]["schema"])
    for msg in request["messages"]:
        total += MESSAGE_OVERHEAD
        content = msg.get("content")
        if isinstance(content, str):
            total += counter.text(content) + BLOCK_OVERHEAD
        elif isinstance(content, list):
            for part in content:
                if part["type"] == "text":
                    total += counter.text(part["text"]) + BLOCK_OVERHEAD
                else:
                    total += _image_url_tokens(part, counter)
        for call in msg.get("tool_calls", []):
            fn = call["function"]
            total += counter.text(fn["name"]) + counter.text(fn["arguments"]) + BLOCK_OVERHEAD
    return total


def _image_url_tokens(part: dict[str, Any], counter: Counter) -> int:
    """An OpenAI image part counted as the Anthropic image it was rendered from: a data URL's
    bytes by the provider's rule, a plain URL as the largest image."""
    url = part["image_url"]["url"]
    if url.startswith("data:") and ";base64," in url:
        data = url.split(";base64,", 1)[1]
        return counter.block({"type": "image", "source": {"type": "base64", "data": data}})
    return IMAGE_TOKENS


def server_view(request: dict[str, Any], input_chars: int = 200) -> dict[str, Any]:
    """The request as the model sees it once the provider applied its `clear_tool_uses`
    edit, by the documented rule: the oldest uses of tools not excluded are cleared, all but
    the `keep` newest; their results become the placeholder (compactd's, so the counts
    compare), and the inputs of the tools named in `clear_tool_inputs` lose their long
    strings. Without an edit, the request itself."""
    from compactd.context.blocks import shorten_input
    from compactd.context.policy import CLEARED_PLACEHOLDER

    edits = (request.get("context_management") or {}).get("edits", [])
    if not edits:
        return request
    (edit,) = edits
    seen = copy.deepcopy({k: v for k, v in request.items() if k != "context_management"})
    excluded = set(edit.get("exclude_tools") or [])
    blocks = [b for m in seen["messages"] for b in m["content"] if isinstance(b, dict)]
    uses = [b for b in blocks if b.get("type") == "tool_use" and b.get("name") not in excluded]
    keep = edit["keep"]["value"]
    cleared = uses[: max(0, len(uses) - keep)]
    ids = {b["id"] for b in cleared}
    inputs = set(edit.get("clear_tool_inputs") or [])
    for use in cleared:
        if use["name"] in inputs:
            use["input"] = shorten_input(use["input"], input_chars)
    for block in blocks:
        if block.get("type") == "tool_result" and block.get("tool_use_id") in ids:
            block["content"] = CLEARED_PLACEHOLDER
    return seen


def server_cleared(request: dict[str, Any]) -> set[str]:
    """The tool_use ids whose results the provider clears for this request."""
    seen = server_view(request)
    if seen is request:
        return set()
    before = {
        b["tool_use_id"]: b.get("content")
        for m in request["messages"]
        for b in m["content"]
        if isinstance(b, dict) and b.get("type") == "tool_result"
    }
    return {
        b["tool_use_id"]
        for m in seen["messages"]
        for b in m["content"]
        if isinstance(b, dict)
        and b.get("type") == "tool_result"
        and b.get("content") != before[b["tool_use_id"]]
    }
