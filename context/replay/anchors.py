"""The anchor policies a replay prices compactd against (`shared/notes/economy.md`): what
Codex and opencode would have sent for the same recorded messages, simulated on the request
"no management" renders at each step, in the provider's units, with the same system prompt and
the same cache rules.

- **Codex-like**: tool output is recorded cut to 10,000 characters (half its head, half its
  tail, as Codex records it), so it renders from its own "no management" pass. After a
  request that reached 90 % of the window (Codex checks the usage of the last response), the
  next one is compacted first: one summary call over the whole request, then only the newest
  user messages (up to 20,000 tokens, the first one over the budget cut to fit) and the
  summary stay; every assistant message, tool call and result is dropped. It never shrinks
  what a step adds, so a step that goes from under 90 % of the window to over the limit is
  sent over it.
- **opencode-like**: before every request, tool results older than the newest 40,000 tool
  tokens become a short placeholder once more than 20,000 tokens of them could; a request over
  window − min(20K, reserve) is compacted: a summary plus the newest messages of the last two
  user turns, at most min(15K, max(2K, a quarter of the limit)) tokens of them.
- **CC-like** (Claude Code's autocompact): a request over window − min(reserve, 20K) − 13K is
  compacted first: one summary call over the whole request, then the summary and ~10K of
  restored files stand for everything before it. At a small window the system prompt, the
  summary and the restored files alone are over that line, so it summarizes on nearly every
  request — what Claude Code does there.
- **Server-side compaction** (Anthropic's `compact_20260112` edit, the provider's documented
  default for long conversations): a request over its trigger — min(150K, window − reserve −
  10K), never under the API's 50K minimum — is summarized by the provider before it answers
  (the whole prompt read as a cached fork of the request, 5× an output of 2,000 tokens); the
  summary then stands for everything before it. A window whose limit is under 50K is out of
  its reach: the trigger is never met, and requests grow past the window.

Pure and deterministic, like the cache model: each policy keeps its state per thread and turns
a step's items into the request it would send and the LLM calls it made for it.
"""

from __future__ import annotations

import hashlib
from typing import Any, Protocol

import attrs

from .cache_model import Block

USER = "user"  # the panel's categories (render.conversation), as the items carry them
TOOL_RESULTS = "tool_results"
SUMMARY_TOKENS = 2_000  # the summary an anchor puts in its history (the priced output floor)
PLACEHOLDER_TOKENS = 10  # opencode's "[Old tool result content cleared]"


@attrs.frozen
class Item:
    """One block of a request as "no management" rendered it: its cache key, its size in the
    provider's tokens, its panel category, and the turn and message it belongs to."""

    key: bytes
    tokens: int
    category: str
    turn: int
    message: int


@attrs.frozen
class Call:
    """One LLM call a policy made (a summary): its input and output in the provider's tokens."""

    purpose: str
    input: int
    output: int
    results: int = 0  # tool results a tool-evidence call read
    read: int = 0  # of `input`, tokens read from the prompt cache (a cached fork)
    written: int = 0  # of `input`, tokens written to the prompt cache (at the write price)


@attrs.frozen
class Sent:
    """What a policy sends for one step: the request's blocks and the calls made for it."""

    blocks: list[Block]
    calls: list[Call]


class Anchor(Protocol):
    NAME: str
    LABEL: str

    def request(self, thread: str, kind: str, items: list[Item]) -> Sent: ...


def _key(*parts: bytes) -> bytes:
    return hashlib.blake2b(b"|".join(parts), digest_size=16).digest()


def _tokens(items: list[Item]) -> int:
    return sum(i.tokens for i in items)


@attrs.define
class _History:
    """A thread's history after its last compaction: what stands for the first `covered`
    items of the recorded history, and how many compactions there were."""

    base: list[Item] = attrs.Factory(list)
    covered: int = 0
    compactions: int = 0
    last_tokens: int = 0

    def view(self, items: list[Item]) -> list[Item]:
        return self.base + items[self.covered :]

    def summary(self, thread: str, name: str) -> Item:
        self.compactions += 1
        key = _key(name.encode(), thread.encode(), str(self.compactions).encode())
        return Item(key, SUMMARY_TOKENS, "markers", -1, -1)


def newest_user_messages(items: list[Item], budget: int) -> list[Item]:
    """The newest user messages within `budget` tokens, in their order; the first one over the
    budget is cut to what is left (Codex's `COMPACT_USER_MESSAGE_MAX_TOKENS`)."""
    kept: list[Item] = []
    left = budget
    for item in reversed([i for i in items if i.category == USER]):
        if left <= 0:
            break
        if item.tokens > left:
            kept.append(
                attrs.evolve(item, key=_key(item.key, b"cut", str(left).encode()), tokens=left)
            )
            break
        kept.append(item)
        left -= item.tokens
    return kept[::-1]


class CodexLike:
    """Codex's local compaction (prior-art.md §1), checked after each response as Codex
    does: the compaction comes before the request that follows one at 90 % of the window."""

    NAME = "codex"
    LABEL = "Codex-like"
    TRIGGER = 0.90
    USER_TOKENS = 20_000

    def __init__(self, systems: dict[str, Block], window: int) -> None:
        self.systems = systems  # by thread kind: "main" | "function"
        self.window = window
        self.threads: dict[str, _History] = {}

    def request(self, thread: str, kind: str, items: list[Item]) -> Sent:
        h = self.threads.setdefault(thread, _History())
        system = self.systems[kind]
        calls: list[Call] = []
        if h.last_tokens >= self.TRIGGER * self.window:
            whole = system[1] + _tokens(h.view(items))
            calls.append(Call("rolling", whole, SUMMARY_TOKENS))
            h.base = [*newest_user_messages(items, self.USER_TOKENS), h.summary(thread, self.NAME)]
            h.covered = len(items)
        blocks = [system, *((i.key, i.tokens) for i in h.view(items))]
        h.last_tokens = sum(t for _, t in blocks)
        return Sent(blocks, calls)


class OpencodeLike:
    """opencode's prune and compaction (prior-art.md §3)."""

    NAME = "opencode"
    LABEL = "opencode-like"
    PROTECT = 40_000
    MINIMUM = 20_000
    TAIL_TURNS = 2

    def __init__(self, systems: dict[str, Block], window: int, limit: int) -> None:
        self.systems = systems
        self.window = window
        self.usable = window - min(20_000, window - limit)
        self.tail_budget = min(15_000, max(2_000, limit // 4))
        self.threads: dict[str, _History] = {}
        self.pruned: dict[str, set[bytes]] = {}

    def _pruned(self, thread: str, view: list[Item]) -> list[Item]:
        """`view` with its pruned results as placeholders, after pruning once more when it
        pays (more than `MINIMUM` tokens older than the newest `PROTECT` tool tokens)."""
        pruned = self.pruned.setdefault(thread, set())
        seen, prunable = 0, []
        for item in reversed(view):
            if item.category != TOOL_RESULTS or item.key in pruned:
                continue
            if seen >= self.PROTECT:
                prunable.append(item)
            seen += item.tokens
        if _tokens(prunable) > self.MINIMUM:
            pruned.update(i.key for i in prunable)
        return [
            attrs.evolve(i, key=_key(i.key, b"pruned"), tokens=PLACEHOLDER_TOKENS)
            if i.key in pruned
            else i
            for i in view
        ]

    def _tail(self, items: list[Item]) -> list[Item]:
        """The newest whole messages of the last two user turns, within the tail budget."""
        turns = sorted({i.turn for i in items if i.turn >= 0})[-self.TAIL_TURNS :]
        messages: dict[int, list[Item]] = {}
        for item in items:
            if item.turn in turns:
                messages.setdefault(item.message, []).append(item)
        kept: list[Item] = []
        used = 0
        for message in sorted(messages, reverse=True):
            size = _tokens(messages[message])
            if used + size > self.tail_budget:
                break
            kept[:0] = messages[message]
            used += size
        return kept

    def request(self, thread: str, kind: str, items: list[Item]) -> Sent:
        h = self.threads.setdefault(thread, _History())
        system = self.systems[kind]
        calls: list[Call] = []
        view = self._pruned(thread, h.view(items))
        if system[1] + _tokens(view) > self.usable:
            calls.append(Call("rolling", system[1] + _tokens(view), SUMMARY_TOKENS))
            tail = self._tail(items)
            h.base = [h.summary(thread, self.NAME)]
            h.covered = len(items)
            view = [*h.base, *self._pruned(thread, tail)]
            h.base = view
        blocks = [system, *((i.key, i.tokens) for i in view)]
        h.last_tokens = sum(t for _, t in blocks)
        return Sent(blocks, calls)


class ClaudeCodeLike:
    """Claude Code's autocompact (prior-art.md §5): the threshold is the effective window
    (window − min(reserve, 20K)) less 13,000 tokens, checked before each request."""

    NAME = "claude-code"
    LABEL = "CC-like"
    BUFFER = 13_000
    RESTORED_TOKENS = 10_000  # the recent files it reads back after its summary

    def __init__(self, systems: dict[str, Block], window: int, limit: int) -> None:
        self.systems = systems
        self.threshold = window - min(20_000, window - limit) - self.BUFFER
        self.threads: dict[str, _History] = {}

    def request(self, thread: str, kind: str, items: list[Item]) -> Sent:
        h = self.threads.setdefault(thread, _History())
        system = self.systems[kind]
        calls: list[Call] = []
        whole = system[1] + _tokens(h.view(items))
        if whole > self.threshold:
            calls.append(Call("rolling", whole, SUMMARY_TOKENS))
            summary = h.summary(thread, self.NAME)
            restored = Item(
                _key(summary.key, b"restored"), self.RESTORED_TOKENS, TOOL_RESULTS, -1, -1
            )
            h.base = [summary, restored]
            h.covered = len(items)
        blocks = [system, *((i.key, i.tokens) for i in h.view(items))]
        h.last_tokens = sum(t for _, t in blocks)
        return Sent(blocks, calls)


class ServerSideCompaction:
    """Anthropic's server-side compaction (anthropic-api.md §2a): the provider summarizes a
    request over the trigger before answering it; later requests carry only the compaction
    block and what follows it."""

    NAME = "server"
    LABEL = "server-side"
    DEFAULT_TRIGGER = 150_000
    MINIMUM_TRIGGER = 50_000  # the API refuses a lower trigger
    MARGIN = 10_000

    def __init__(self, systems: dict[str, Block], window: int, limit: int) -> None:
        self.systems = systems
        self.trigger = max(self.MINIMUM_TRIGGER, min(self.DEFAULT_TRIGGER, limit - self.MARGIN))
        self.serves = limit >= self.MINIMUM_TRIGGER  # under it, the trigger is never met
        self.threads: dict[str, _History] = {}
        self.last: dict[str, list[Block]] = {}

    def notes(self) -> dict[str, Any]:
        return {"trigger": self.trigger, "servesWindow": self.serves}

    def request(self, thread: str, kind: str, items: list[Item]) -> Sent:
        h = self.threads.setdefault(thread, _History())
        system = self.systems[kind]
        calls: list[Call] = []
        blocks = [system, *((i.key, i.tokens) for i in h.view(items))]
        whole = sum(t for _, t in blocks)
        if whole > self.trigger:
            # the compaction iteration reads the whole prompt: a fork of the request, whose
            # prefix the previous request cached
            read = _shared_prefix(self.last.get(thread, []), blocks)
            calls.append(Call("compaction", whole, SUMMARY_TOKENS, read=read))
            h.base = [h.summary(thread, self.NAME)]
            h.covered = len(items)
            blocks = [system, *((i.key, i.tokens) for i in h.view(items))]
        self.last[thread] = blocks
        h.last_tokens = sum(t for _, t in blocks)
        return Sent(blocks, calls)


def _shared_prefix(before: list[Block], now: list[Block]) -> int:
    """Tokens of the longest block prefix `now` shares with `before` (all of `before`, or
    nothing: the cache keeps whole requests)."""
    if len(before) <= len(now) and now[: len(before)] == before:
        return sum(t for _, t in before)
    return 0
