"""Provider-format messages → node specs (DESIGN §6).

An assistant message's `tool_use` blocks become tool nodes; a user message's `tool_result`
blocks become their results; its other blocks a user node. OpenAI Chat Completions messages
are first brought to the same shapes. Raw `nodes` give kinds and ids explicitly.
"""

from __future__ import annotations

from typing import Any

import attrs
import orjson

from .blocks import as_blocks, check_block, check_result_content
from .errors import InvalidContent, InvalidGraph


@attrs.frozen
class CallSpec:
    index: int
    tool_use_id: str
    name: str
    input: dict[str, Any]
    extra: dict[str, Any] | None = None


@attrs.frozen
class ThreadSpec:
    """A user or assistant node; an assistant's calls become tool nodes under it."""

    kind: str
    content: list[dict[str, Any]]
    meta: bool = False
    calls: tuple[CallSpec, ...] = ()
    node_id: str | None = None


@attrs.frozen
class ResultSpec:
    tool_use_id: str
    content: Any
    is_error: bool = False


Spec = ThreadSpec | ResultSpec
_TOOL_USE_KEYS = {"type", "id", "name", "input", "cache_control"}


def from_anthropic(messages: Any) -> list[Spec]:
    if not isinstance(messages, list):
        raise InvalidContent("messages must be a list", field="messages")
    specs: list[Spec] = []
    for i, msg in enumerate(messages):
        where = f"messages[{i}]"
        if not isinstance(msg, dict):
            raise InvalidContent(f"{where} must be an object", where=where)
        role = msg.get("role")
        meta = msg.get("meta", False)
        if not isinstance(meta, bool):
            raise InvalidContent(f"{where}.meta must be a boolean", where=where)
        blocks = as_blocks(msg.get("content"), where)
        if role == "assistant":
            content, calls = [], []
            for j, block in enumerate(blocks):
                if block["type"] == "tool_use":
                    extra = {k: v for k, v in block.items() if k not in _TOOL_USE_KEYS}
                    calls.append(
                        CallSpec(j, block["id"], block["name"], block["input"], extra or None)
                    )
                elif block["type"] == "tool_result":
                    raise InvalidContent(
                        f"{where}.content[{j}]: tool_result blocks belong in user messages",
                        where=where,
                    )
                else:
                    content.append(block)
            specs.append(ThreadSpec("assistant", content, meta, tuple(calls)))
        elif role == "user":
            rest = []
            results = 0
            for j, block in enumerate(blocks):
                if block["type"] == "tool_result":
                    specs.append(
                        ResultSpec(
                            block["tool_use_id"],
                            block.get("content", ""),
                            bool(block.get("is_error", False)),
                        )
                    )
                    results += 1
                elif block["type"] == "tool_use":
                    raise InvalidContent(
                        f"{where}.content[{j}]: tool_use blocks belong in assistant messages",
                        where=where,
                    )
                else:
                    rest.append(block)
            if rest or not results:
                # text sent along with tool results annotates them; it does not start a turn
                specs.append(ThreadSpec("user", rest, meta or results > 0))
        else:
            raise _not_a_history_role(role, where)
    return specs


def from_openai(messages: Any) -> list[Spec]:
    """OpenAI Chat Completions messages (user / assistant with tool_calls / tool)."""
    if not isinstance(messages, list):
        raise InvalidContent("messages must be a list", field="messages")
    converted: list[dict[str, Any]] = []
    for i, msg in enumerate(messages):
        where = f"messages[{i}]"
        if not isinstance(msg, dict):
            raise InvalidContent(f"{where} must be an object", where=where)
        role = msg.get("role")
        if role == "tool":
            call_id = msg.get("tool_call_id")
            if not isinstance(call_id, str) or not call_id:
                raise InvalidContent(f"{where}: a tool message needs 'tool_call_id'", where=where)
            block = {
                "type": "tool_result",
                "tool_use_id": call_id,
                "content": _openai_text(msg.get("content"), where),
            }
            if converted and converted[-1]["role"] == "user" and converted[-1].get("_results"):
                converted[-1]["content"].append(block)
            else:
                converted.append({"role": "user", "content": [block], "_results": True})
        elif role == "assistant":
            blocks: list[dict[str, Any]] = []
            text = msg.get("content")
            if text:
                blocks.extend(_openai_parts(text, where))
            for k, call in enumerate(msg.get("tool_calls") or []):
                cw = f"{where}.tool_calls[{k}]"
                fn = call.get("function") if isinstance(call, dict) else None
                if not isinstance(fn, dict) or not isinstance(call.get("id"), str):
                    raise InvalidContent(f"{cw}: needs 'id' and 'function'", where=cw)
                args = fn.get("arguments", "{}")
                try:
                    parsed = orjson.loads(args) if isinstance(args, str) else args
                except orjson.JSONDecodeError:
                    raise InvalidContent(f"{cw}: arguments are not valid JSON", where=cw) from None
                if not isinstance(parsed, dict):
                    parsed = {"arguments": parsed}
                blocks.append(
                    {
                        "type": "tool_use",
                        "id": call["id"],
                        "name": fn.get("name", ""),
                        "input": parsed,
                    }
                )
            converted.append({"role": "assistant", "content": blocks})
        elif role == "user":
            converted.append(
                {
                    "role": "user",
                    "content": _openai_parts(msg.get("content"), where),
                    "meta": msg.get("meta", False),
                }
            )
        else:
            raise _not_a_history_role(role, where)
    for msg in converted:
        msg.pop("_results", None)
    return from_anthropic(converted)


def _not_a_history_role(role: Any, where: str) -> InvalidContent:
    if role in ("system", "developer"):
        return InvalidContent(
            f"{where}: {role} messages are not history; pass the system prompt to "
            "context/render as `system`",
            where=where,
        )
    return InvalidContent(f"{where}: unknown role {role!r}", where=where)


def _openai_text(content: Any, where: str) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(p.get("text", "") for p in content if isinstance(p, dict))
    raise InvalidContent(f"{where}: content must be a string or a list of parts", where=where)


def _openai_parts(content: Any, where: str) -> list[dict[str, Any]]:
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    if not isinstance(content, list):
        raise InvalidContent(f"{where}: content must be a string or a list of parts", where=where)
    out = []
    for j, part in enumerate(content):
        pw = f"{where}.content[{j}]"
        kind = part.get("type") if isinstance(part, dict) else None
        if kind == "text" and isinstance(part.get("text"), str):
            out.append({"type": "text", "text": part["text"]})
        elif kind == "image_url":
            url = (part.get("image_url") or {}).get("url", "")
            if url.startswith("data:") and ";base64," in url:
                media, data = url[5:].split(";base64,", 1)
                out.append(
                    {
                        "type": "image",
                        "source": {"type": "base64", "media_type": media, "data": data},
                    }
                )
            elif url:
                out.append({"type": "image", "source": {"type": "url", "url": url}})
            else:
                raise InvalidContent(f"{pw}: image_url needs a url", where=pw)
        else:
            raise InvalidContent(f"{pw}: unsupported content part {kind!r}", where=pw)
    return out


_RAW_KINDS = ("user", "assistant", "tool")


def from_nodes(nodes: Any) -> list[Spec]:
    """Raw nodes: `{kind, id?, content?, meta?}` thread nodes and `{kind: "tool",
    tool_use_id, name, input, result?, is_error?}` calls of the assistant before them."""
    if not isinstance(nodes, list):
        raise InvalidContent("nodes must be a list", field="nodes")
    specs: list[Spec] = []
    last_assistant: ThreadSpec | None = None
    last_pos = -1
    for i, raw in enumerate(nodes):
        where = f"nodes[{i}]"
        if not isinstance(raw, dict):
            raise InvalidContent(f"{where} must be an object", where=where)
        kind = raw.get("kind")
        if kind not in _RAW_KINDS:
            hint = " (start functions with function/start)" if kind == "function" else ""
            raise InvalidGraph(
                f"{where}: unknown node kind {kind!r}; expected one of {list(_RAW_KINDS)}{hint}",
                where=where,
                nodeKind=kind if isinstance(kind, str) else repr(kind),
            )
        node_id = raw.get("id")
        if node_id is not None and not isinstance(node_id, str):
            raise InvalidContent(f"{where}.id must be a string", where=where)
        if "parent" in raw:
            raise InvalidGraph(
                f"{where}: nodes are appended at the head; fork with session/branch to start "
                "elsewhere",
                where=where,
            )
        if kind == "tool":
            if last_assistant is None:
                raise InvalidGraph(
                    f"{where}: a tool node must follow an assistant node", where=where
                )
            block = {
                "type": "tool_use",
                "id": raw.get("tool_use_id"),
                "name": raw.get("name"),
                "input": raw.get("input", {}),
            }
            check_block(block, where)
            call = CallSpec(
                len(last_assistant.content) + len(last_assistant.calls),
                block["id"],
                block["name"],
                block["input"],
            )
            updated = attrs.evolve(last_assistant, calls=(*last_assistant.calls, call))
            specs[last_pos] = updated
            last_assistant = updated
            if "result" in raw:
                check_result_content(raw["result"], f"{where}.result")
                is_error = raw.get("is_error", False)
                if not isinstance(is_error, bool):
                    raise InvalidContent(f"{where}.is_error must be a boolean", where=where)
                specs.append(ResultSpec(block["id"], raw["result"], is_error))
            continue
        content = as_blocks(raw.get("content", []), where)
        for j, block in enumerate(content):
            if block["type"] in ("tool_use", "tool_result"):
                raise InvalidContent(
                    f"{where}.content[{j}]: give calls as tool nodes, not {block['type']} blocks",
                    where=where,
                )
        meta = raw.get("meta", False)
        if not isinstance(meta, bool):
            raise InvalidContent(f"{where}.meta must be a boolean", where=where)
        spec = ThreadSpec(kind, content, meta, (), node_id)
        specs.append(spec)
        last_assistant = spec if kind == "assistant" else None
        last_pos = len(specs) - 1
    return specs
