"""Conversations as an agent sends them: plain Anthropic / OpenAI message dicts.

The daemon tests build sessions only through these (the same shapes a real agent appends), so
what is tested is the decomposition a client actually goes through.
"""

from __future__ import annotations

from typing import Any

Message = dict[str, Any]


def user(text: str) -> Message:
    return {"role": "user", "content": [{"type": "text", "text": text}]}


def tool_use(use_id: str, name: str = "Read", **inp: Any) -> dict[str, Any]:
    # a file of its own per call (reads of one file would supersede each other)
    return {
        "type": "tool_use",
        "id": use_id,
        "name": name,
        "input": inp or {"path": f"/x/{use_id}"},
    }


def assistant(text: str, *calls: dict[str, Any]) -> Message:
    return {"role": "assistant", "content": [{"type": "text", "text": text}, *calls]}


def tool_results(*pairs: tuple[str, Any], is_error: bool = False) -> Message:
    """A user message that only answers calls: (tool_use_id, content) pairs."""
    blocks = []
    for use_id, content in pairs:
        block: dict[str, Any] = {"type": "tool_result", "tool_use_id": use_id, "content": content}
        if is_error:
            block["is_error"] = True
        blocks.append(block)
    return {"role": "user", "content": blocks}


def filler(tag: str, size: int) -> str:
    """`size` characters of text that tokenizes like file contents and names its origin."""
    words = f"{tag} def handler(request): return request.body  # line "
    text = ""
    i = 0
    while len(text) < size:
        text += f"{words}{i}\n"
        i += 1
    return text[:size]


def tool_turn(prefix: str, i: int, size: int, tool: str = "Read") -> list[Message]:
    """One complete turn: a request, one tool call, its result, a closing text."""
    use_id = f"{prefix}_{i}"
    return [
        user(f"task {prefix}-{i}: look at src/{prefix}_{i}.py"),
        assistant(
            f"reading {prefix}-{i}", tool_use(use_id, tool, file_path=f"src/{prefix}_{i}.py")
        ),
        tool_results((use_id, filler(f"{prefix}-{i}", size))),
        assistant(f"done with {prefix}-{i}"),
    ]


def tool_turns(prefix: str, n: int, size: int = 600, tool: str = "Read") -> list[Message]:
    """`n` complete turns, each with one call of `tool` and a result of `size` characters."""
    out: list[Message] = []
    for i in range(n):
        out += tool_turn(prefix, i, size, tool)
    return out


def openai_turn(prefix: str, size: int = 200) -> list[Message]:
    """One complete turn in OpenAI Chat Completions shape (tool_calls + a tool message)."""
    call_id = f"call_{prefix}"
    return [
        {"role": "user", "content": f"openai task {prefix}"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": call_id,
                    "type": "function",
                    "function": {"name": "shell", "arguments": '{"cmd": "ls -la"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": call_id, "content": filler(f"out-{prefix}", size)},
        {"role": "assistant", "content": f"listed {prefix}"},
    ]


def results_of(request: dict[str, Any]) -> list[Any]:
    """The content of every Anthropic `tool_result` block of a request, in order."""
    return [
        b["content"]
        for m in request["messages"]
        if isinstance(m["content"], list)
        for b in m["content"]
        if b.get("type") == "tool_result"
    ]


def called(ask: str, use_id: str, result: Any, tool: str = "Read", **inp: Any) -> list[Message]:
    """One complete turn of one call: the request, the call, its `result`, a closing text."""
    return [
        user(ask),
        assistant(f"calling {tool}", tool_use(use_id, tool, **inp)),
        tool_results((use_id, result)),
        assistant("done"),
    ]


def all_text(request: dict[str, Any]) -> str:
    """Every string in a rendered request, joined (for 'is this text in the context?')."""
    out: list[str] = []

    def walk(value: Any) -> None:
        if isinstance(value, str):
            out.append(value)
        elif isinstance(value, list):
            for v in value:
                walk(v)
        elif isinstance(value, dict):
            for v in value.values():
                walk(v)

    walk(request)
    return "\n".join(out)
