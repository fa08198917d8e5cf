"""Matching a client's history against what its session holds.

A client that talks to a provider resends its whole conversation with every request. The proxy
keeps that conversation in a session as nodes (the same decomposition `session/append` uses:
`compactd.context.decompose`), so each request must be matched against them: the part the
session holds is skipped, the new tail is appended. Both sides are compared as fingerprints of
the same specs — a user or assistant message with its calls, or one tool result — so the
comparison is exact without replaying anything:

- the request extends a branch's thread → append the tail there;
- it shares a prefix with a branch and then differs (the client compacted, edited or cleared
  its history) → fork a new branch at the last node they share, and append the rest there;
- it shares nothing (a sub-agent, or a history rewritten from its first message) → a new
  branch with no node yet.

The session's branches are all candidates, so a conversation the client runs beside another one
(Claude Code's sub-agents share their parent's session id) stays on its own branch instead of
forking on every request. Fingerprints of stored nodes are memoized on the node.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterator
from typing import Any

import attrs
import orjson

from ..context.decompose import ResultSpec, Spec
from ..context.errors import InvalidContent
from ..context.graph import Graph, Node

_FP_KEY = "proxy-fingerprint"
_STEPS_KEY = "proxy-steps"


class PassThrough(Exception):
    """A request whose history cannot be kept: it goes upstream as the client sent it, that
    request only (`reason` says why; `session_id` is where it would have gone; `kind`: what
    the request log counts it as)."""

    def __init__(
        self, reason: str, session_id: str | None = None, *, kind: str = "history not kept"
    ) -> None:
        super().__init__(reason)
        self.reason = reason
        self.session_id = session_id
        self.kind = kind


def _digest(value: Any) -> str:
    return hashlib.sha256(orjson.dumps(value, option=orjson.OPT_SORT_KEYS)).hexdigest()[:32]


def _thread_fingerprint(kind: str, meta: bool, content: Any, calls: list[tuple[Any, ...]]) -> str:
    return _digest(["thread", kind, meta, content, calls])


def _result_fingerprint(tool_use_id: str, content: Any, is_error: bool) -> str:
    return _digest(["result", tool_use_id, content, bool(is_error)])


def spec_fingerprint(spec: Spec) -> str:
    if isinstance(spec, ResultSpec):
        return _result_fingerprint(spec.tool_use_id, spec.content, spec.is_error)
    calls = [(c.index, c.tool_use_id, c.name, c.input, c.extra) for c in spec.calls]
    return _thread_fingerprint(spec.kind, spec.meta, spec.content, calls)


def _node_fingerprint(graph: Graph, node: Node) -> str:
    key = (_FP_KEY, len(node.calls))
    cached = node.cache.get(key)
    if cached is None:
        calls = [
            (c.index, c.tool_use_id, c.name, c.input, c.extra)
            for c in graph.calls_of(node)
            if c.kind == "tool"
        ]
        cached = node.cache[key] = _thread_fingerprint(node.kind, node.meta, node.content, calls)
    return cached


def _call_fingerprint(call: Node) -> str:
    key = (_FP_KEY, call.result_seq)
    cached = call.cache.get(key)
    if cached is None:
        cached = call.cache[key] = _result_fingerprint(
            call.tool_use_id or "", call.result, call.is_error
        )
    return cached


@attrs.frozen
class Step:
    """One spec of a branch's thread: its fingerprint and the thread node that is the head
    once it is in place (a result leaves the head at its call's assistant node)."""

    fingerprint: str
    head: str
    result: bool


def branch_steps(graph: Graph, branch: str) -> Iterator[Step]:
    """The specs a branch holds, in the order a client's messages decompose into them: each
    thread node, then the results of its calls (sorted, as `request_fingerprints` sorts a
    message's results)."""
    nodes = graph.nodes
    for node_id in graph.branch_path(branch).ids:
        yield from _node_steps(graph, nodes[node_id])


def _node_steps(graph: Graph, node: Node) -> tuple[Step, ...]:
    """A thread node's steps, memoized on it while its calls' results stay as they are (a
    long branch is walked on every request; most of its nodes never change again)."""
    calls = [graph.nodes[c] for c in node.calls]
    state = tuple(c.result_seq for c in calls)
    cached = node.cache.get(_STEPS_KEY)
    if cached is not None and cached[0] == state:
        return cached[1]  # type: ignore[no-any-return]
    steps = [Step(_node_fingerprint(graph, node), node.id, False)]
    answered = [c for c in calls if c.kind == "tool" and c.answered]
    for call in sorted(answered, key=lambda c: c.tool_use_id or ""):
        steps.append(Step(_call_fingerprint(call), node.id, True))
    node.cache[_STEPS_KEY] = (state, tuple(steps))
    return tuple(steps)


def _in_order(specs: list[Spec], fingerprints: list[str]) -> tuple[list[Spec], list[str]]:
    """Specs and their fingerprints with each run of results sorted by tool_use id (the order a
    client lists one message's results in carries no meaning)."""
    out_specs: list[Spec] = []
    out_fingerprints: list[str] = []
    run: list[tuple[ResultSpec, str]] = []
    for spec, fingerprint in [*zip(specs, fingerprints, strict=True), (None, "")]:
        if isinstance(spec, ResultSpec):
            run.append((spec, fingerprint))
            continue
        for result, result_fingerprint in sorted(run, key=lambda r: r[0].tool_use_id):
            out_specs.append(result)
            out_fingerprints.append(result_fingerprint)
        run = []
        if spec is not None:
            out_specs.append(spec)
            out_fingerprints.append(fingerprint)
    return out_specs, out_fingerprints


def request_fingerprints(specs: list[Spec]) -> list[str]:
    """The fingerprints of a request's specs, in `sorted_specs`'s order."""
    return _in_order(specs, [spec_fingerprint(s) for s in specs])[1]


def chain(fingerprints: list[str]) -> list[str]:
    """Every prefix of a request's history as one digest: a conversation's next request holds
    the previous one as a prefix, so the previous one's last digest is among these."""
    running = hashlib.sha256()
    out = []
    for fingerprint in fingerprints:
        running.update(fingerprint.encode())
        out.append(running.hexdigest()[:32])
    return out


def sorted_specs(specs: list[Spec]) -> list[Spec]:
    """`specs` with each run of results in the order `request_fingerprints` counts them."""
    return _in_order(specs, [""] * len(specs))[0]


@attrs.frozen
class History:
    """A request's history read for matching: its messages (as the wire read them), its specs
    in `sorted_specs`'s order with their fingerprints, and where each message's specs end
    (`ends`). Kept to read the conversation's next request, which repeats all of this but its
    tail: the messages equal to the ones kept at their places (a C-level comparison) are not
    decomposed or digested again, and their kept copies — the ones the session stored when
    they were new — are the ones held on to."""

    messages: list[Any]
    specs: list[Spec]
    fingerprints: list[str]
    ends: list[int]

    def reusable(self, messages: list[Any]) -> int:
        """How many of `messages` this reading covers: the ones equal to those kept, back to
        the last that ends outside a run of results (a run's order may take in the next
        message's results)."""
        kept = 0
        for old, new in zip(self.messages, messages, strict=False):
            if old != new:
                break
            kept += 1
        while (
            kept
            and self.ends[kept - 1]
            and isinstance(self.specs[self.ends[kept - 1] - 1], ResultSpec)
        ):
            kept -= 1
        return kept


def read_history(
    decompose: Callable[[Any], list[Spec]],
    messages: list[Any],
    earlier: History | None = None,
    *,
    by_message: bool = True,
    kept: int | None = None,
) -> History:
    """`messages` as specs with their fingerprints, reusing what `earlier` (the same
    conversation's previous request) read of the messages both start with (`kept`, when
    `earlier.reusable` told already). `by_message`: each message decomposes on its own (its
    specs never depend on its neighbours); otherwise the whole history is read at once and
    nothing is reused. `InvalidContent` as `decompose` raises it for the whole history."""
    if not by_message:
        specs = decompose(messages)
        ordered, fingerprints = _in_order(specs, [spec_fingerprint(s) for s in specs])
        return History([], ordered, fingerprints, [])
    if kept is None:
        kept = earlier.reusable(messages) if earlier is not None else 0
    held = earlier.ends[kept - 1] if earlier is not None and kept else 0
    fresh: list[Spec] = []
    ends = earlier.ends[:kept] if earlier is not None else []
    try:
        for message in messages[kept:]:
            fresh += decompose([message])
            ends.append(held + len(fresh))
    except InvalidContent:
        decompose(messages)  # raises it again, naming the message by its place in the request
        raise
    specs, fingerprints = _in_order(fresh, [spec_fingerprint(s) for s in fresh])
    if earlier is not None:
        specs = earlier.specs[:held] + specs
        fingerprints = earlier.fingerprints[:held] + fingerprints
    kept_messages = earlier.messages[:kept] if earlier is not None else []
    return History([*kept_messages, *messages[kept:]], specs, fingerprints, ends)


@attrs.frozen
class Match:
    """Where a request lands: on `branch`, after its first `shared` specs. `fork_at` is set
    when the request leaves the branch's thread: the node to fork a new branch at (None: a
    branch with no node), the branch's own steps being `held` long."""

    branch: str
    shared: int
    held: int
    fork_at: str | None = None

    @property
    def extends(self) -> bool:
        return self.shared == self.held


def match(graph: Graph, fingerprints: list[str], prefer: str | None = None) -> Match:
    """The branch whose thread shares the longest prefix with the request (ties: one the
    request extends, then `prefer`, then the current branch, then by name). A fork never
    separates a call from its result: when the first stored spec the request does not share
    is a result, the fork goes before that call's assistant node."""
    order = sorted(graph.branches, key=lambda b: (b != prefer, b != graph.current_branch, b))
    best: Match | None = None
    best_steps: list[Step] = []
    for branch in order:
        steps = list(branch_steps(graph, branch))
        shared = 0
        for step, fingerprint in zip(steps, fingerprints, strict=False):
            if step.fingerprint != fingerprint:
                break
            shared += 1
        candidate = Match(branch, shared, len(steps))
        better = best is None or shared > best.shared
        if not better and best is not None and shared == best.shared:
            better = candidate.extends and not best.extends
        if better:
            best, best_steps = candidate, steps
    assert best is not None  # a session always has its current branch
    if best.extends:
        return best
    shared = best.shared
    if shared < len(best_steps) and best_steps[shared].result:
        head = best_steps[shared].head
        while shared and best_steps[shared - 1].head == head:
            shared -= 1
    fork_at = best_steps[shared - 1].head if shared else None
    return Match(best.branch, shared, best.held, fork_at)
