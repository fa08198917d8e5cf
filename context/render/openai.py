"""OpenAI Chat Completions format (DESIGN §3 step 6): `tool_calls` and `tool` messages.

Thinking blocks have no place in this format and are not sent (nor counted). Tool messages
carry text only, so a non-text part of a tool result becomes a short placeholder — counted as
sent; so does a user message's document, which has no part of its own here.
"""

from __future__ import annotations

from typing import Any

import orjson

from ..tokens import BLOCK_OVERHEAD, Counter
from .anthropic import system_blocks
from .conversation import SCHEMA, SYSTEM, TOOL_RESULTS, TOOLS, Conversation, Part
from .tally import Tally


def _tool_def(tool: dict[str, Any]) -> dict[str, Any]:
    if tool.get("type") == "function" and "function" in tool:
        return tool
    fn: dict[str, Any] = {"name": tool.get("name", "")}
    if "description" in tool:
        fn["description"] = tool["description"]
    fn["parameters"] = tool.get("input_schema", {"type": "object", "properties": {}})
    return {"type": "function", "function": fn}


def _omitted(block: dict[str, Any]) -> str:
    return f"[{block.get('type', 'content')} omitted]"


def _result_text(content: Any) -> str:
    if isinstance(content, str):
        return content
    pieces = []
    for block in content:
        if block.get("type") == "text":
            pieces.append(block["text"])
        else:
            pieces.append(_omitted(block))
    return "\n".join(pieces)


def _sent_tokens(part: Part, counter: Counter, text: str) -> int:
    """Tokens of the text sent in place of a part's block, memoized on the part (parts are
    cached on their node, so a warm render tokenizes nothing)."""
    if part.alt_tokens is None:
        part.alt_tokens = counter.text(text) + BLOCK_OVERHEAD
    return part.alt_tokens


def _user_tokens(part: Part, counter: Counter) -> int:
    if part.block["type"] in ("text", "image"):
        return part.tokens
    return _sent_tokens(part, counter, _omitted(part.block))


def _user_content(parts: list[Part]) -> str | list[dict[str, Any]]:
    blocks = [p.block for p in parts]
    if len(blocks) == 1 and blocks[0]["type"] == "text":
        return blocks[0]["text"]
    out: list[dict[str, Any]] = []
    for block in blocks:
        if block["type"] == "text":
            out.append({"type": "text", "text": block["text"]})
        elif block["type"] == "image":
            source = block.get("source", {})
            if source.get("type") == "base64":
                url = f"data:{source.get('media_type')};base64,{source.get('data')}"
            else:
                url = source.get("url", "")
            out.append({"type": "image_url", "image_url": {"url": url}})
        else:  # no such part here (documents): say so rather than send base64 as text
            out.append({"type": "text", "text": _omitted(block)})
    return out


def _text_content(parts: list[Part]) -> str | list[dict[str, Any]]:
    texts = [p.block["text"] for p in parts]
    return texts[0] if len(texts) == 1 else [{"type": "text", "text": t} for t in texts]


def to_openai(
    conv: Conversation,
    counter: Counter,
    *,
    model: str | None,
    max_tokens: int,
    system: str | list[dict[str, Any]] | None,
    tools: list[dict[str, Any]] | None,
    response_schema: dict[str, Any] | None,
) -> tuple[dict[str, Any], Tally]:
    """Each wire message is counted as it is sent: text parts one by one, tool calls as name
    and arguments, tool messages as their text."""
    tally = Tally()
    messages: list[dict[str, Any]] = []
    sys_blocks = [b for b in system_blocks(system) if b.get("type") == "text"]
    if sys_blocks:
        texts = [b["text"] for b in sys_blocks]
        messages.append(
            {
                "role": "system",
                "content": texts[0]
                if len(texts) == 1
                else [{"type": "text", "text": t} for t in texts],
            }
        )
        tally.add_message([(SYSTEM, counter.system_block(b)) for b in sys_blocks])
    for msg in conv.messages:
        if msg.role == "assistant":
            texts = [p for p in msg.parts if p.block["type"] == "text"]
            calls = [p for p in msg.parts if p.block["type"] == "tool_use"]
            if not texts and not calls:
                continue  # thinking only: nothing of it exists in this format
            out: dict[str, Any] = {
                "role": "assistant",
                "content": _text_content(texts) if texts else None,
            }
            if calls:
                out["tool_calls"] = [
                    {
                        "id": p.block["id"],
                        "type": "function",
                        "function": {
                            "name": p.block["name"],
                            "arguments": orjson.dumps(p.block["input"]).decode(),
                        },
                    }
                    for p in calls
                ]
            messages.append(out)
            tally.add_message([(p.category, p.tokens) for p in texts + calls])
            continue
        rest = []
        for part in msg.parts:
            if part.block["type"] != "tool_result":
                rest.append(part)
                continue
            content = part.block.get("content", "")
            if isinstance(content, str):
                text, tokens = content, part.tokens
            else:
                text = _result_text(content)
                tokens = _sent_tokens(part, counter, text)
            messages.append(
                {"role": "tool", "tool_call_id": part.block["tool_use_id"], "content": text}
            )
            tally.add_message(
                [(part.category if isinstance(content, str) else TOOL_RESULTS, tokens)]
            )
        if rest:
            messages.append({"role": "user", "content": _user_content(rest)})
            tally.add_message([(p.category, _user_tokens(p, counter)) for p in rest])
    request: dict[str, Any] = {}
    if model:
        request["model"] = model
    request["max_tokens"] = max_tokens
    request["messages"] = messages
    if tools:
        defs = [_tool_def(t) for t in tools]
        for tool in defs:
            tally.add(TOOLS, counter.tool_definition(tool))
        request["tools"] = defs
    if response_schema is not None:
        request["response_format"] = {
            "type": "json_schema",
            "json_schema": {"name": "response", "schema": response_schema},
        }
        tally.add(SCHEMA, counter.schema(response_schema))
    return request, tally
