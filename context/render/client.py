"""What a client's own request holds, counted as a render counts what it sends: the branch's
thread with nothing removed, cleared or cut, plus the client's system prompt and tools.

The proxy puts every request's history into its session, so after a request is placed its
branch holds exactly the messages the client sent; this count is compactd's estimate of that
request, the figure a saving is measured from. Each node is counted once in its life (memoized
on the node, a result by its version), so a long session costs only its new tail.
"""

from __future__ import annotations

from typing import Any

import attrs

from ..graph import Graph, Node
from ..tokens import BLOCK_OVERHEAD, MESSAGE_OVERHEAD, Counter
from .anthropic import system_blocks

_KEY = "client-tokens"


def _thread_tokens(graph: Graph, node: Node, counter: Counter) -> int:
    """A user or assistant message as the client sent it: its blocks and its calls."""
    cached = node.cache.get(_KEY)
    if cached is None:
        tokens = MESSAGE_OVERHEAD + sum(counter.block(b) for b in node.content)
        for call in graph.calls_of(node):
            if call.kind == "tool":
                block = {"type": "tool_use", "name": call.name, "input": call.input}
                tokens += counter.block(block)
        cached = node.cache[_KEY] = tokens
    return cached


def _result_tokens(call: Node, counter: Counter) -> int:
    key = (_KEY, call.result_seq)
    cached = call.cache.get(key)
    if cached is None:
        cached = call.cache[key] = counter.result(call.result) + BLOCK_OVERHEAD
    return cached


@attrs.frozen
class ClientTokens:
    """A client's request counted apart: its tool results, and everything else (tokenizers
    differ most between the two: logs and listings against prose and code)."""

    results: int
    other: int
    blocks: int  # content blocks, calls and results: each framed by the provider

    @property
    def total(self) -> int:
        return self.results + self.other


def client_request_tokens(
    graph: Graph,
    branch: str,
    counter: Counter,
    *,
    system: str | list[dict[str, Any]] | None,
    tools: list[dict[str, Any]] | None,
) -> ClientTokens:
    """compactd's (uncalibrated) count of the request whose history is `branch`'s thread."""
    other = sum(counter.system_block(b) for b in system_blocks(system))
    other += sum(counter.tool_definition(dict(t)) for t in tools or [])
    results = blocks = 0
    for node_id in graph.branch_path(branch).ids:
        node = graph.nodes[node_id]
        other += _thread_tokens(graph, node, counter)
        calls = [c for c in graph.calls_of(node) if c.kind == "tool"]
        answered = [c for c in calls if c.answered]
        blocks += len(node.content) + len(calls) + len(answered)
        if answered:
            other += MESSAGE_OVERHEAD
            results += sum(_result_tokens(c, counter) for c in answered)
    return ClientTokens(results, other, blocks)
