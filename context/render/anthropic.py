"""Anthropic Messages format (DESIGN §3 step 6), with prompt-cache breakpoints.

Breakpoints (at most 4) sit where they stay put while the conversation grows: the end of the
system prompt (covering tools and system), the stable anchor right after a compaction (the
summary marker) when there is one, and the ends of the last and the third-to-last message —
the latter is where the previous request ended after one model round trip, so the next
request reads everything before the new tail from the cache. A record that changes the
context at position p changes no byte before p, so the cache stays valid up to p.
"""

from __future__ import annotations

from typing import Any

from ..tokens import MESSAGE_OVERHEAD, Counter
from .conversation import SCHEMA, SYSTEM, TOOLS, Conversation, Message, Part
from .tally import Tally

EPHEMERAL = {"type": "ephemeral"}
_NOT_CACHEABLE = {"thinking", "redacted_thinking"}
MAX_BREAKPOINTS = 4


def system_blocks(system: str | list[dict[str, Any]] | None) -> list[dict[str, Any]]:
    if system is None or system == "":
        return []
    if isinstance(system, str):
        return [{"type": "text", "text": system}]
    return [dict(b) for b in system]


def _cacheable(block: dict[str, Any]) -> bool:
    return block.get("type") not in _NOT_CACHEABLE and not (
        block.get("type") == "text" and not block.get("text")
    )


def _mark_last_cacheable(blocks: list[dict[str, Any]], ttl: str | None) -> bool:
    for i in range(len(blocks) - 1, -1, -1):
        if _cacheable(blocks[i]):
            blocks[i] = {**blocks[i], "cache_control": _cache_control(ttl)}
            return True
    return False


def _cache_control(ttl: str | None) -> dict[str, str]:
    return {"type": "ephemeral", "ttl": ttl} if ttl else dict(EPHEMERAL)


def wire_groups(conv: Conversation) -> list[list[Message]]:
    """Consecutive same-role messages travel as one wire message (tool results stay first:
    a results message only ever follows its assistant message)."""
    groups: list[list[Message]] = []
    for msg in conv.messages:
        if groups and groups[-1][-1].role == msg.role:
            groups[-1].append(msg)
        else:
            groups.append([msg])
    return groups


def breakpoint_messages(groups: list[list[Message]], slots: int) -> list[int]:
    """Indices of wire messages that get a breakpoint, most important first."""
    n = len(groups)
    chosen: list[int] = []
    for index in (n - 1, n - 3):
        if index >= 0 and index not in chosen:
            chosen.append(index)
    anchor = None
    for i, group in enumerate(groups):  # the summary marker, if any (a plain loop: hot)
        for m in group:
            if m.kind == "summary":
                anchor = i
                break
        if anchor is not None:
            break
    if anchor is None:
        anchor = n - 5 if n - 5 >= 0 else None
    if anchor is not None and anchor not in chosen:
        chosen.append(anchor)
    return chosen[:slots]


def to_anthropic(
    conv: Conversation,
    counter: Counter,
    *,
    model: str | None,
    max_tokens: int,
    system: str | list[dict[str, Any]] | None,
    tools: list[dict[str, Any]] | None,
    response_schema: dict[str, Any] | None,
    cache: bool = True,
    cache_ttl: str | None = None,
) -> tuple[dict[str, Any], Tally]:
    tally = Tally()
    request: dict[str, Any] = {}
    if model:
        request["model"] = model
    request["max_tokens"] = max_tokens
    sys_blocks = system_blocks(system)
    for block in sys_blocks:
        tally.add(SYSTEM, counter.system_block(block))
    tool_defs = [dict(t) for t in tools or []]
    for tool in tool_defs:
        tally.add(TOOLS, counter.tool_definition(tool))
    slots = MAX_BREAKPOINTS
    if cache and (sys_blocks or tool_defs):
        if sys_blocks:
            _mark_last_cacheable(sys_blocks, cache_ttl)
        else:
            tool_defs[-1] = {**tool_defs[-1], "cache_control": _cache_control(cache_ttl)}
        slots -= 1
    groups = wire_groups(conv)
    marked = set(breakpoint_messages(groups, slots)) if cache else set()
    messages = []
    by_category = tally.by_category
    for i, group in enumerate(groups):
        parts = group[0].parts if len(group) == 1 else [p for msg in group for p in msg.parts]
        blocks = []
        for p in parts:  # the tally counts exactly what is sent (`Tally.add_message`, inlined)
            blocks.append(p.block)
            by_category[p.category] += p.tokens
        if parts:
            by_category[parts[0].category] += MESSAGE_OVERHEAD
        if i in marked:
            _mark_last_cacheable(blocks, cache_ttl)
        messages.append({"role": group[0].role, "content": blocks})
    if sys_blocks:
        request["system"] = sys_blocks
    request["messages"] = messages
    if tool_defs:
        request["tools"] = tool_defs
    if response_schema is not None:
        request["output_config"] = {"format": {"type": "json_schema", "schema": response_schema}}
        tally.add(SCHEMA, counter.schema(response_schema))
    return request, tally


def anthropic_tally(
    conv: Conversation,
    counter: Counter,
    *,
    system: str | list[dict[str, Any]] | None,
    tools: list[dict[str, Any]] | None,
    response_schema: dict[str, Any] | None,
) -> Tally:
    """The tally `to_anthropic` makes of the same request, without building it (what the
    model sees after Tier 1's server-side clears is measured, not sent)."""
    tally = Tally()
    for block in system_blocks(system):
        tally.add(SYSTEM, counter.system_block(block))
    for tool in tools or []:
        tally.add(TOOLS, counter.tool_definition(dict(tool)))
    by_category = tally.by_category
    for group in wire_groups(conv):
        first = None
        for msg in group:
            for p in msg.parts:
                if first is None:
                    first = p.category
                by_category[p.category] += p.tokens
        if first is not None:
            by_category[first] += MESSAGE_OVERHEAD
    if response_schema is not None:
        tally.add(SCHEMA, counter.schema(response_schema))
    return tally


def part_blocks(parts: list[Part]) -> list[dict[str, Any]]:
    return [p.block for p in parts]
