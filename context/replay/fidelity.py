"""Fidelity, the other half of a replay (`shared/notes/economy.md`): of what the agent later
used, how much each policy kept where the model could see it.

A *use* is a term — an identifier, a path, a number — in the agent's recorded answer to a
request (its text and its tool calls' inputs) that until then existed on its thread only in
tool results: nobody had typed it, the model had only read it. For each use and each policy
the request it answered is asked whether the term is in view (in a message or a tool result
as sent, summaries aside: an anchor's summary has no text to look in, so none counts); if not,
whether it is one `compactd_recall` call away (a handle of a result that holds it, or the
result's tool_use id, is in the request); else it is further. Pure: the uses come from the
transcript (`uses_by_call`), the views from the requests each policy sent.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any

import attrs

from ..importers.apply import as_sent, steps
from ..importers.plan import FunctionEnd, FunctionStart, ImportedSession, Messages
from ..recall import line_starts, page

_WORD = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_./-]*")
_CAMEL = re.compile(r"[a-z][A-Z]")
_QUALIFIED = re.compile(r"[A-Za-z_]\.[A-Za-z_]")
MIN_TERM = 4
SKIPPED_KEYS = frozenset({"type", "id", "tool_use_id", "cache_control", "signature", "name"})


def terms(text: str) -> frozenset[str]:
    """The distinctive terms of `text`: paths (a slash), qualified or file names (a dot between
    names), identifiers with an underscore or a camelCase hump, numbers of four or more digits,
    hex of seven or more. Plain words are not terms: they are everywhere."""
    out = set()
    for raw in _WORD.findall(text):
        word = raw.strip("./-")
        if len(word) < MIN_TERM:
            continue
        if _is_term(word):
            out.add(word)
    return frozenset(out)


def _is_term(word: str) -> bool:
    if "/" in word or "_" in word or _CAMEL.search(word) or _QUALIFIED.search(word):
        return True
    if word.isdigit():
        return True
    return (
        len(word) >= 7
        and all(c in "0123456789abcdef" for c in word)
        and any(c.isdigit() for c in word)
        and any(c.isalpha() for c in word)
    )


def block_text(block: Any) -> str:
    """What a block shows the model as text: text, a result's text, a call's string arguments
    (thinking, images and ids aside)."""
    if isinstance(block, str):
        return block
    if isinstance(block, list):
        return "\n".join(block_text(b) for b in block)
    if not isinstance(block, dict):
        return ""
    kind = block.get("type")
    if kind in ("thinking", "redacted_thinking", "image", "document"):
        return ""
    return "\n".join(
        block_text(v) if isinstance(v, dict | list) else v if isinstance(v, str) else ""
        for k, v in block.items()
        if k not in SKIPPED_KEYS
    )


@attrs.frozen
class Use:
    """A term the agent's answer used that only tool results had shown it: the tool_use ids
    of those results."""

    term: str
    results: tuple[str, ...]


@attrs.define
class _Thread:
    elsewhere: set[str] = attrs.Factory(set)  # terms the user or the agent wrote
    only_results: dict[str, set[str]] = attrs.Factory(dict)  # term -> tool_use ids
    pending: int | None = None  # the step whose request awaits its answer

    def result(self, use_id: str, content: Any) -> None:
        for term in terms(block_text(content)):
            if term not in self.elsewhere:
                self.only_results.setdefault(term, set()).add(use_id)

    def written(self, content: Any) -> None:
        found = terms(block_text(content))
        self.elsewhere |= found
        for term in found:
            self.only_results.pop(term, None)


def uses_by_call(imported: ImportedSession) -> dict[int, list[Use]]:
    """For each step (as `importers.apply.steps` counts them) whose recorded call was answered,
    the uses in that answer."""
    threads: dict[str | None, _Thread] = {}
    parents: dict[str, tuple[str | None, str | None]] = {}  # function key -> (thread, call id)
    out: dict[int, list[Use]] = {}
    for index, step in enumerate(steps(imported)):
        for op in step.ops:
            if isinstance(op, Messages):
                thread = threads.setdefault(op.thread, _Thread())
                for message in as_sent(op.messages, imported.sent):
                    _message(thread, message, out)
            elif isinstance(op, FunctionStart):
                parents[op.key] = (op.thread, op.tool_use_id)
                threads.setdefault(op.key, _Thread()).written(op.input)
            elif isinstance(op, FunctionEnd) and op.key in parents:
                parent, use_id = parents[op.key]
                if use_id is not None:
                    threads.setdefault(parent, _Thread()).result(use_id, op.output)
        if step.call is not None:
            threads.setdefault(step.call.thread, _Thread()).pending = index
    return out


def _message(thread: _Thread, message: dict[str, Any], out: dict[int, list[Use]]) -> None:
    content = message.get("content")
    blocks = content if isinstance(content, list) else [{"type": "text", "text": content or ""}]
    if message.get("role") == "assistant" and thread.pending is not None:
        said = terms(block_text(blocks))
        found = [
            Use(term, tuple(sorted(thread.only_results[term])))
            for term in sorted(said)
            if term in thread.only_results
        ]
        if found:
            out.setdefault(thread.pending, []).extend(found)
        thread.pending = None
    for block in blocks:
        if isinstance(block, dict) and block.get("type") == "tool_result":
            thread.result(str(block.get("tool_use_id")), block.get("content"))
        else:
            thread.written(block)


VISIBLE, ONE_CALL, FURTHER = "visible", "oneCall", "further"


@attrs.define
class Fidelity:
    """One policy's uses, by where the term was when the agent used it; `one_page` counts the
    uses whose term the first page of a handle showed (recall before it could search)."""

    uses: int = 0
    visible: int = 0
    one_call: int = 0
    one_page: int = 0
    pages: int = 0  # recall calls paging would have taken to reach every one-call use

    @property
    def further(self) -> int:
        return self.uses - self.visible - self.one_call

    def add(self, where: str, pages: int = 0) -> None:
        self.uses += 1
        if where == VISIBLE:
            self.visible += 1
        elif where == ONE_CALL:
            self.one_call += 1
            self.one_page += pages == 1
            self.pages += pages

    def to_json(self) -> dict[str, Any]:
        share = (lambda n: round(n / self.uses, 4)) if self.uses else (lambda n: 0.0)
        return {
            "uses": self.uses,
            "visible": share(self.visible),
            "oneCall": share(self.one_call),
            "further": share(self.further),
            "oneCallByPaging": share(self.one_page),
            "pagingCalls": self.pages,
        }


def in_view(term: str, keys: Iterable[bytes], memo: dict[bytes, frozenset[str]]) -> bool:
    """Whether any of the request's blocks (by content key) shows `term`."""
    empty: frozenset[str] = frozenset()
    return any(term in memo.get(key, empty) for key in keys)


def pages_to(text: str, term: str, start_line: int, max_chars: int) -> int:
    """How many pages of `max_chars` a model paging from `start_line` reads to reach the first
    line at or after it that shows `term` (from line 1 when none after it does); 0 when no
    line does."""
    starts = line_starts(text)
    bounds = [*starts, len(text)]
    lines = [i + 1 for i in range(len(starts)) if term in text[bounds[i] : bounds[i + 1]]]
    if not lines:
        return 0
    after = [n for n in lines if n >= start_line]
    if not after:
        start_line, after = 1, lines
    target, calls, at = after[0], 0, start_line
    while True:
        calls += 1
        got = page(text, max_chars, at)
        if got.end_line >= target or not got.truncated:
            return calls
        at = got.end_line + 1
