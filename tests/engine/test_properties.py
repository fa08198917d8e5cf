"""Property tests: the DESIGN §3 invariants hold for random sessions, branches and records.

Hypothesis drives a random agent: user and meta messages, assistant messages with thinking and
parallel tool calls, results (big, block lists, errors, with hook text), functions run as
tools (left running or completed), functions not called as tools, abandoned calls, branches
forked at random thread nodes — and, between them, snip / clear / summary records written the
way the tiers write them (whole removable turns, single answered tools, a prefix of whole
removable turns). After every step each branch is rendered in both formats and checked.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

import attrs
import orjson
from compactd.context.budget_reduction import NOTE_ROOM
from compactd.context.engine import Engine
from compactd.context.errors import CannotFit, PendingToolResults
from compactd.context.graph import Graph, Node
from compactd.context.policy import RUNNING_FUNCTION_PLACEHOLDER, policy_from_config
from compactd.context.recall import handles_in, recall
from compactd.context.render.request import Rendered, RequestSpec, render_request
from compactd.context.stores.files import FileStore
from compactd.context.summarizer.driver import digest_answer, drive
from compactd.context.summarizer.types import SummaryNeeded
from compactd.context.tiers.rolling_summary import cut_points, in_turn_range
from compactd.context.tokens import Counter
from compactd.context.turns import Turn, has_running, plan_cuts, turn_node_ids, turns_of
from compactd.context.visibility import ViewOptions
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.engine.helpers import (
    FORMATS,
    blocks_of,
    check_rendered,
    new_session,
    params,
    stripped,
    wire,
)
from tests.support.invariants import thinking_sequence
from tests.support.media import image_block, pdf, pdf_block, png

SID = "prop"
# fsync is what the store tests are about; here it only costs time, so use tmpfs if there is one
FAST_DIR = "/dev/shm" if os.access("/dev/shm", os.W_OK) else None
# with recall, a lower arrival limit so that many results are cut and name a handle
RECALL = {
    "recall": True,
    "maxToolResultChars": 60,
    "truncateHeadChars": 30,
    "truncateTailChars": 20,
}
PREFIX_KEEPING = {"user", "meta", "assistant", "results", "function"}


@attrs.define
class World:
    """The session under test and what the checks remember between steps."""

    root: Path
    engine: Engine
    n: int = 0
    branch: str = "main"
    # last successful render per (branch, format), reset by anything but an append
    prev: dict[tuple[str, str], Rendered] = attrs.field(factory=dict)
    written: dict[str, str] = attrs.field(factory=dict)  # record id -> branch it was cut on

    def uid(self, prefix: str) -> str:
        self.n += 1
        return f"{prefix}{self.n}"

    @property
    def graph(self) -> Graph:
        return self.engine.sessions[SID].graph  # no catch-up: this process is the only writer

    def head(self) -> Node | None:
        head = self.graph.head(self.branch)
        return self.graph.nodes[head] if head is not None else None

    def open_calls(self) -> list[Node]:
        """Calls of the head still waiting for a `tool_result` (not bound to a function)."""
        head = self.head()
        if head is None or head.kind != "assistant":
            return []
        return [
            c
            for c in self.graph.calls_of(head)
            if c.kind == "tool" and not c.answered and c.function is None
        ]

    def head_pending(self) -> bool:
        head = self.head()
        return (
            head is not None and head.kind == "assistant" and bool(self.graph.pending_calls(head))
        )


# ---- content -------------------------------------------------------------------------------


def _text(draw: Any, world: World, tag: str) -> str:
    size = draw(st.sampled_from([0, 0, 1, 3, 30]))
    return f"{world.uid(tag)} " + "lorem ipsum " * size


def _result_content(draw: Any, world: World) -> Any:
    kind = draw(
        st.sampled_from(["short", "short", "big", "blocks", "many", "document", "edge", "empty"])
    )
    tag = world.uid("r")
    if kind == "short":
        return f"{tag} output"
    if kind == "empty":
        return ""
    if kind == "many":  # an MCP tool's result: text blocks each short, long together
        size = draw(st.integers(20, 900))
        return [
            {"type": "text", "text": f"{tag}.{i} " + "ab" * size}
            for i in range(draw(st.integers(2, 8)))
        ]
    if kind == "edge":  # just over the limit (with or without recall's lower one)
        return f"{tag} " + "z" * draw(st.sampled_from([55, 70, 3995, 4010, 4150, 4300]))
    if kind == "document":
        pages = draw(st.integers(1, 4))
        return [pdf_block(pdf(pages, tag)), {"type": "text", "text": f"{tag} pages {pages}"}]
    big = f"{tag} " + "".join(f"{i:05d}," for i in range(draw(st.integers(700, 1500))))
    if kind == "big":
        return big
    image = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "AA"}}
    return [{"type": "text", "text": big}, image, {"type": "text", "text": f"{tag} tail"}]


def _assistant(draw: Any, world: World) -> dict[str, Any]:
    blocks: list[dict[str, Any]] = []
    for _ in range(draw(st.integers(0, 2))):
        if draw(st.booleans()):
            blocks.append(
                {
                    "type": "thinking",
                    "thinking": f'{world.uid("th")} ✓ "q"',
                    "signature": world.uid("sig"),
                }
            )
        else:
            blocks.append({"type": "redacted_thinking", "data": world.uid("red")})
    if draw(st.booleans()) or not blocks:
        blocks.append({"type": "text", "text": _text(draw, world, "a")})
    for _ in range(draw(st.sampled_from([0, 0, 1, 1, 2, 3]))):
        blocks.append(
            {
                "type": "tool_use",
                "id": world.uid("call"),
                "name": draw(st.sampled_from(["Bash", "Read", "Task", "Grep"])),
                "input": {"arg": world.uid("in")},
            }
        )
    return {"role": "assistant", "content": blocks}


# ---- actions -------------------------------------------------------------------------------


def available(world: World) -> list[str]:
    head = world.head()
    acts = ["branch", "snip", "clear", "evidence", "summary", "inside"]
    if len(world.graph.branches) > 1:
        acts.append("checkout")
    if not world.head_pending():
        acts += ["user", "user", "assistant", "assistant", "meta"]
    else:
        acts.append("orphan")
    if world.open_calls():
        acts += ["results", "results", "results", "function"]
    if head is not None and head.kind == "assistant":
        acts.append("bare")
    if any(
        world.graph.nodes[f].anchor in world.graph.branch_path(world.branch)
        for f in world.graph.running
    ):
        acts.append("complete")
    return acts


def act(draw: Any, world: World, action: str) -> None:
    eng, g = world.engine, world.graph
    if action == "user":
        eng.append(SID, branch=world.branch, messages=[_user(draw, world)])
    elif action == "meta":
        msg = {"role": "user", "content": _text(draw, world, "m"), "meta": True}
        eng.append(SID, branch=world.branch, messages=[msg])
    elif action == "assistant":
        eng.append(SID, branch=world.branch, messages=[_assistant(draw, world)])
    elif action == "orphan":
        eng.append(SID, branch=world.branch, messages=[_user(draw, world)], allow_orphans=True)
    elif action == "results":
        calls = world.open_calls()
        chosen = draw(st.lists(st.sampled_from(calls), min_size=1, unique_by=lambda c: c.id))
        content: list[dict[str, Any]] = []
        for c in chosen:
            block = {"type": "tool_result", "tool_use_id": c.tool_use_id}
            block["content"] = _result_content(draw, world)
            if draw(st.integers(0, 4)) == 0:
                block["is_error"] = True
            content.append(block)
        answered = {c.id for c in chosen}
        head = world.head()
        assert head is not None
        rest_pending = any(c.id not in answered for c in g.pending_calls(head))
        if not rest_pending and draw(st.booleans()):
            content.append({"type": "text", "text": _text(draw, world, "hook")})
        eng.append(SID, branch=world.branch, messages=[{"role": "user", "content": content}])
    elif action == "function":
        tool = draw(st.sampled_from(world.open_calls()))
        session = eng.session(SID)
        expose = draw(st.sampled_from(["io", "io", "full", "none"]))
        fid = session.function_start(
            tool.name or "Task",
            {"task": world.uid("ft")},
            tool_use_id=tool.tool_use_id,
            expose=expose,
        )
        inner = world.uid("icall")
        eng.append(
            SID,
            function=fid,
            messages=[
                {"role": "user", "content": _text(draw, world, "fu")},
                _with_call(_assistant(draw, world), inner),
                *_answer_all(draw, world, [inner]),
                {"role": "assistant", "content": _text(draw, world, "fa")},
            ],
        )
        if draw(st.booleans()):
            _complete(draw, world, fid)
    elif action == "bare":
        fid = eng.session(SID).function_start("helper", world.uid("bare"), branch=world.branch)
        if draw(st.booleans()):
            _complete(draw, world, fid)
    elif action == "complete":
        path = g.branch_path(world.branch)
        running = sorted(f for f in g.running if g.nodes[f].anchor in path)
        _complete(draw, world, draw(st.sampled_from(running)))
    elif action == "branch":
        path = g.branch_path(world.branch)
        if not len(path):
            return
        at = draw(st.sampled_from(path.ids))
        name = world.uid("b")
        eng.session(SID).create_branch(name, from_node=at)
        eng.session(SID).checkout(name)
        world.branch = name
    elif action == "checkout":
        world.branch = draw(st.sampled_from(sorted(g.branches)))
        eng.session(SID).checkout(world.branch)
    else:
        record = _record(draw, world, action)
        if record is not None:
            (rid,) = eng.session(SID).add_records([record])
            world.written[rid] = world.branch


def _user(draw: Any, world: World) -> dict[str, Any]:
    content: list[dict[str, Any]] = [{"type": "text", "text": _text(draw, world, "u")}]
    attach = draw(st.sampled_from(["none", "none", "none", "image", "document"]))
    if attach == "image":
        size = (draw(st.integers(10, 3000)), draw(st.integers(10, 2000)))
        content.append(image_block(png(*size)))
    elif attach == "document":
        content.append(pdf_block(pdf(draw(st.integers(1, 3)), world.uid("doc"))))
    return {"role": "user", "content": content}


def _with_call(msg: dict[str, Any], use_id: str) -> dict[str, Any]:
    """`msg` with exactly one call, `use_id` (a function's thread answers its own calls)."""
    blocks = [b for b in msg["content"] if b["type"] != "tool_use"]
    blocks.append({"type": "tool_use", "id": use_id, "name": "Read", "input": {}})
    return {"role": "assistant", "content": blocks}


def _answer_all(draw: Any, world: World, ids: list[str]) -> list[dict[str, Any]]:
    return [
        {
            "role": "user",
            "content": [
                {"type": "tool_result", "tool_use_id": i, "content": _result_content(draw, world)}
                for i in ids
            ],
        }
    ]


def _complete(draw: Any, world: World, fid: str) -> None:
    status = draw(st.sampled_from(["completed", "completed", "error"]))
    world.engine.session(SID).function_complete(fid, _result_content(draw, world), status)


def _record(draw: Any, world: World, kind: str) -> dict[str, Any] | None:
    """A record as a tier would write it on the current branch, or None if none fits."""
    g = world.graph
    path = g.branch_path(world.branch)
    try:
        rendered = world.engine.render(SID, params(branch=world.branch), remember=False)
    except PendingToolResults:
        return None
    proj = rendered.projection
    hidden = set(proj.summary_turns) | set(proj.snipped) | set(proj.collapsed)
    turns = turns_of(path)
    removable = [
        t for t in plan_cuts(g, path, keep_first_turn=False).removable() if t.start_id not in hidden
    ]
    if kind == "snip":
        if not removable:
            return None
        chosen = draw(st.lists(st.sampled_from(removable), min_size=1, unique_by=lambda t: t.index))
        chosen.sort(key=lambda t: t.index)
        covers = [i for t in chosen for i in turn_node_ids(g, path, t)]
        return {"kind": "snip", "covers": covers, "data": {"turns": [t.start_id for t in chosen]}}
    if kind == "evidence":
        answered = [
            (c, t)
            for t in removable
            for i in path.ids[t.start : t.end]
            for c in g.calls_of(g.nodes[i])
            if c.kind == "tool" and c.answered and c.id not in proj.evidence
        ]
        if not answered:
            return None
        tool, turn = draw(st.sampled_from(answered))
        data = {"turns": [turn.start_id], "toolUseId": tool.tool_use_id, "isError": tool.is_error}
        return {"kind": "evidence", "covers": [tool.id], "data": {**data, "text": world.uid("e")}}
    if kind == "clear":
        tools = [
            c
            for t in removable
            for i in path.ids[t.start : t.end]
            for c in g.calls_of(g.nodes[i])
            if c.kind == "tool" and c.answered and c.id not in proj.cleared
        ]
        if not tools:
            return None
        tool = draw(st.sampled_from(tools))
        # "cache": the provider clears it (and, by its rule, every older compactable use)
        mode = draw(st.sampled_from(["time", "cache"]))
        return {"kind": "clear", "covers": [tool.id], "data": {"mode": mode}}
    if kind == "inside":
        return _inside(draw, world, rendered)
    # summary: a prefix of whole removable turns, folding the summary in force
    plan = plan_cuts(g, path, keep_first_turn=False)
    prefix = 0
    while prefix < len(turns) and turns[prefix].index not in plan.protected:
        prefix += 1
    least = max(
        (turns[i].index + 1 for i in range(len(turns)) if turns[i].start_id in proj.summary_turns),
        default=1,
    )
    if prefix < least:
        return None
    upto = draw(st.integers(least, prefix))
    chosen = turns[:upto]
    covers = [i for t in chosen for i in turn_node_ids(g, path, t)]
    # the images of the range stay after the marker (or, dropped, are named in it)
    media = list(proj.summary.data.get("media", [])) if proj.summary is not None else []
    for node_id in covers:
        node = g.nodes[node_id]
        source = node.result if node.kind == "tool" else node.content
        for at, block in enumerate(source if isinstance(source, list) else []):
            if block.get("type") in ("image", "document"):
                name = f"{block['type']} #{len(media) + 1}"
                media.append({"name": name, "node": node_id, "block": at})
    data = {"text": f"summary {world.uid('s')}", "turns": [t.start_id for t in chosen]}
    if media:
        data |= {"media": media, "mediaDropped": draw(st.booleans())}
    return {"kind": "summary", "covers": covers, "data": data}


def _inside(draw: Any, world: World, rendered: Rendered) -> dict[str, Any] | None:
    """A rolling summary that ends inside the latest complete or the active turn, cut where
    Tier 4 may cut (its own `cut_points`), folding the summary in force."""
    g = world.graph
    path = g.branch_path(world.branch)
    proj = rendered.projection
    turns = turns_of(path)
    done = -1
    if proj.summary_through is not None and proj.summary_through[1] in path:
        done = path.index(proj.summary_through[1])
    options = []
    for turn in turns[-2:]:
        if any(t.start_id in proj.snipped or t.start_id in proj.collapsed for t in [turn]):
            continue
        if any(has_running(g, path, t, pending=False) for t in turns[: turn.index]):
            continue
        options += [(turn, cut) for cut in cut_points(g, path, turn, done)]
    if not options:
        return None
    turn, cut = draw(st.sampled_from(options))
    rng = in_turn_range(g, path, proj, turns, turn, cut)
    return {
        "kind": "summary",
        "covers": rng.covers,
        "data": {
            "text": f"inside {world.uid('s')}",
            "turns": [t.start_id for t in rng.turns],
            "partialTurn": turn.start_id,
            "through": path.ids[cut],
        },
    }


# ---- checks --------------------------------------------------------------------------------


def check_branch(world: World, branch: str, fmt: str, action: str) -> Rendered | None:
    g = world.graph
    path = g.branch_path(branch)
    head = g.nodes[path.head] if path.head else None
    expected_pending = (
        [
            c.tool_use_id
            for c in g.calls_of(head)
            if c.kind == "tool" and not c.answered and c.function is None
        ]
        if head is not None and head.kind == "assistant"
        else []
    )
    try:
        rendered = world.engine.render(SID, params(fmt, branch=branch))
    except PendingToolResults as err:
        assert err.data["pendingToolUseIds"] == expected_pending
        return None
    assert not expected_pending, f"rendered although {expected_pending} wait for results"
    check_rendered(rendered, fmt)
    request = rendered.request
    # determinism
    assert wire(world.engine.render(SID, params(fmt, branch=branch)).request) == wire(request)
    check_protected_turns(world, branch, fmt, rendered)
    check_running_functions(world, branch, fmt, rendered)
    if fmt == "anthropic":
        check_thinking(world, branch, rendered)
    else:
        assert b'"thinking"' not in orjson.dumps(request)
    check_prefix(world, branch, fmt, rendered, action)
    check_handles(world, branch, rendered)
    if fmt == "anthropic":
        check_budget_reduction(world, rendered)
    return rendered


def check_budget_reduction(world: World, rendered: Rendered) -> None:
    """Budget Reduction holds per tool result, whatever its blocks: a result shown raw keeps
    its text whole up to the limit (and the room a cut's note takes), is never longer than it
    was, and a cut one keeps the first and last characters of its text end to end."""
    g = world.graph
    policy = policy_from_config(g.config)
    limit = policy.max_tool_result_chars
    by_use = {
        n.tool_use_id: n for n in g.nodes.values() if n.kind == "tool" and n.tool_use_id is not None
    }
    proj = rendered.projection
    for block in blocks_in(rendered.request):
        if block.get("type") != "tool_result":
            continue
        call = by_use.get(block["tool_use_id"])
        if call is None or call.function or not call.answered:
            continue
        if call.id in proj.cleared or call.id in proj.evidence:
            continue
        original = _joined(call.result)
        sent = _joined(block.get("content", ""))
        head, tail = policy.truncate_head_chars, policy.truncate_tail_chars
        if len(original) <= limit or len(original) - head - tail <= NOTE_ROOM:
            assert sent == original, "a result within the limit (and its note's room) was cut"
            continue
        assert len(sent) < len(original)
        assert sent.startswith(original[:head]) and sent.endswith(original[len(original) - tail :])


def _joined(content: Any) -> str:
    if isinstance(content, str):
        return content
    return "".join(b.get("text", "") for b in content if b.get("type") == "text")


def blocks_in(request: dict[str, Any]) -> list[dict[str, Any]]:
    return [b for m in request["messages"] for b in blocks_of(m)]


def check_handles(world: World, branch: str, rendered: Rendered) -> None:
    """Every handle a request shows recalls on its branch (and none shows without recall)."""
    g = world.graph
    handles = handles_in(rendered.request["messages"])
    if not g.config.get("recall"):
        assert not handles
        return
    for handle in sorted(handles):
        got = recall(g, handle, g.branch_path(branch), 3800)
        assert got.total_lines >= got.end_line >= got.start_line == 1


def _find_text(request: dict[str, Any], text: str) -> tuple[int, int]:
    for i, msg in enumerate(request["messages"]):
        for j, block in enumerate(blocks_of(msg)):
            if block.get("type") == "text" and block.get("text") == text:
                return i, j
    raise AssertionError(f"{text!r} is not in the request")


def latest_complete(g: Graph, turns: list[Turn], path_length: int, ids: list[str]) -> Turn | None:
    """The latest complete turn, where the last turn counts once it has been complete (an
    assistant message in it ended without tool calls) — it does not stop being the latest
    because the agent carries on in it — and every earlier turn is complete (a function still
    running in one protects it by itself): the latest complete turn only moves forward."""
    for turn in reversed(turns):
        nodes = [g.nodes[i] for i in ids[turn.start : turn.end]]
        if turn.end < path_length or any(n.kind == "assistant" and not n.calls for n in nodes):
            return turn
    return None


def check_protected_turns(world: World, branch: str, fmt: str, rendered: Rendered) -> None:
    """The active turn and the latest complete turn render exactly as with no records —
    except that the rolling summary may take the latest complete turn (the spec's "retain the
    latest turn" when keeping two does not fit; projection.py)."""
    g = world.graph
    path = g.branch_path(branch)
    turns = turns_of(path)
    if not turns:
        return
    kept = [turns[-1]]
    latest = latest_complete(g, turns, path.length, path.ids)
    summary = rendered.projection.summary
    inside = rendered.projection.summary_through
    keep = []
    if latest is not None and latest.index != turns[-1].index:
        if summary is not None and latest.start_id in rendered.projection.summary_turns:
            keep.append(summary)
        else:
            kept.insert(0, latest)
    # a summary inside one of these turns takes its earlier part by design: the request
    # before the marker and everything after the cut stay as they were
    if (
        summary is not None
        and inside is not None
        and summary not in keep
        and inside[0] in {t.start_id for t in kept}
    ):
        keep.append(summary)
    first = g.nodes[path.ids[kept[0].start]]
    assert first.kind == "user" and not first.meta, "sessions open with a user text"
    protected_tools = {
        c.id for t in kept for i in path.ids[t.start : t.end] for c in g.calls_of(g.nodes[i])
    }
    # clears written on another branch may reach a tool of this one's latest turns (as Tier 1
    # may, by design); everything else must leave these turns alone
    keep += [r for r in g.records if r.kind == "clear" and protected_tools & set(r.covers)]
    saved = g.records
    g.records = keep
    try:
        options, spec = ViewOptions(branch=branch), RequestSpec(format=fmt)
        policy = policy_from_config(g.config)
        plain = render_request(g, options, spec, policy, counter=Counter())
        proj = plain.projection
        if fmt != "anthropic" and proj.server_clears:  # no provider to clear: we do
            seen = (proj.cache_cleared.keys(), proj.cache_cleared_inputs.keys())
            plain = render_request(g, options, spec, policy, counter=Counter(), as_seen=seen)
        baseline = plain.request
    finally:
        g.records = saved
    text = first.content[0]["text"]
    got, base = stripped(rendered.request), stripped(baseline)
    (i, j), (bi, bj) = _find_text(got, text), _find_text(base, text)
    assert blocks_of(got["messages"][i])[j:] == blocks_of(base["messages"][bi])[bj:]
    assert got["messages"][i]["role"] == base["messages"][bi]["role"]
    assert got["messages"][i + 1 :] == base["messages"][bi + 1 :]


def check_running_functions(world: World, branch: str, fmt: str, rendered: Rendered) -> None:
    g = world.graph
    path = g.branch_path(branch)
    request = rendered.request
    for fid in g.running:
        fn = g.nodes[fid]
        if fn.anchor not in path or g.nodes[fn.anchor].owner is not None:
            continue
        top = g.nodes[fn.parent] if fn.parent else None
        if top is not None and top.kind == "tool":
            top = g.nodes[top.parent] if top.parent else None
        if top is None or top.owner is not None:
            continue  # a function inside a function's thread
        use = fn.tool_use_id or f"fn_{fid}"
        if fmt == "anthropic":
            got = [
                b
                for m in stripped(request)["messages"]
                for b in blocks_of(m)
                if b.get("type") == "tool_result" and b["tool_use_id"] == use
            ]
            assert [b["content"] for b in got] == [RUNNING_FUNCTION_PLACEHOLDER]
        else:
            got_oa = [m["content"] for m in request["messages"] if m.get("tool_call_id") == use]
            assert got_oa == [RUNNING_FUNCTION_PLACEHOLDER]


def check_thinking(world: World, branch: str, rendered: Rendered) -> None:
    """Thinking blocks of every visible turn, byte-exact and in order."""
    g = world.graph
    path = g.branch_path(branch)
    proj = rendered.projection
    hidden = set(proj.summary_turns) | set(proj.snipped) | set(proj.collapsed)
    cut = -1  # what a summary inside a turn replaced
    if proj.summary_through is not None:
        cut = path.index(proj.summary_through[1])
    expected = [
        orjson.dumps(b).decode()
        for t in turns_of(path)
        if t.start_id not in hidden
        for i in range(t.start, t.end)
        if i > cut or t.start_id != (proj.summary_through or ("",))[0]
        if g.nodes[path.ids[i]].kind == "assistant"
        for b in g.nodes[path.ids[i]].content
        if b["type"] in ("thinking", "redacted_thinking")
    ]
    assert thinking_sequence(rendered.request) == expected


def check_prefix(world: World, branch: str, fmt: str, rendered: Rendered, action: str) -> None:
    """After an append with no change to the records in force, the previous request is a
    prefix of the new one (the last previous message may have grown)."""
    prev = world.prev.get((branch, fmt))
    world.prev[(branch, fmt)] = rendered
    if prev is None or action not in PREFIX_KEEPING:
        return
    before, after = _hidden(prev), _hidden(rendered)
    if before != after:
        # a record came into force as this branch moved on (its turns stopped being the
        # latest here): only ever one written on another branch before this one forked
        for rec_id in {r for _turn, r in after - before}:
            assert world.written[rec_id] != branch, f"{rec_id} changed its own branch's past"
        return
    # what is sent (the server edit's `keep` counts from the end: it grows with every new
    # call, which is what holds still what the provider caches) and what the provider caches
    _check_extends(stripped(prev.request), stripped(rendered.request), {"context_management"})
    _check_extends(stripped(prev.seen_request), stripped(rendered.seen_request), set())


def _check_extends(old: dict[str, Any], new: dict[str, Any], besides: set[str]) -> None:
    skip = {"messages", *besides}
    assert {k: v for k, v in old.items() if k not in skip} == {
        k: v for k, v in new.items() if k not in skip
    }
    om, nm = old["messages"], new["messages"]
    if not om:
        return
    assert len(nm) >= len(om)
    assert nm[: len(om) - 1] == om[:-1]
    last, grown = om[-1], nm[len(om) - 1]
    assert last["role"] == grown["role"]
    lb, gb = blocks_of(last), blocks_of(grown)
    assert gb[: len(lb)] == lb
    lc, gc = last.get("tool_calls", []), grown.get("tool_calls", [])
    assert gc[: len(lc)] == lc
    assert last.get("tool_call_id") == grown.get("tool_call_id")


def _hidden(rendered: Rendered) -> set[tuple[str, str]]:
    """(turn start, record id) for every turn the render's records hide."""
    proj = rendered.projection
    out = {(start, rec.id) for start, rec in proj.snipped.items()}
    out |= {(start, rec.id) for start, rec in proj.collapsed.items()}
    if proj.summary is not None:
        out |= {(start, proj.summary.id) for start in proj.summary_turns}
        if proj.summary_through is not None:
            out.add((proj.summary_through[0], proj.summary.id))
    return out


def check_viewers(world: World) -> None:
    """Every function's own view (and with its callers) pairs and measures right."""
    g = world.graph
    for fid in sorted(n.id for n in g.nodes.values() if n.kind == "function"):
        for fmt in FORMATS:
            for callers in (False, True):
                try:
                    rendered = world.engine.render(
                        SID, params(fmt, viewer=fid, callers=callers), remember=False
                    )
                except PendingToolResults:
                    continue  # the caller prefix can end on an abandoned call of a fork
                check_rendered(rendered, fmt)


# ---- the property --------------------------------------------------------------------------


@settings(
    max_examples=50,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(data=st.data())
def test_random_sessions_keep_the_invariants(data: st.DataObject) -> None:
    root = Path(tempfile.mkdtemp(prefix="compactd-prop-", dir=FAST_DIR))
    try:
        world = World(root, Engine(FileStore(root), counter=Counter()))
        recall = data.draw(st.booleans(), label="recall")  # handles in markers, the tool
        new_session(world.engine, SID, config=RECALL if recall else None)
        world.engine.append(SID, messages=[_user(data.draw, world)])
        steps = data.draw(st.integers(4, 20), label="steps")
        for _ in range(steps):
            action = data.draw(st.sampled_from(available(world)), label="action")
            act(data.draw, world, action)
            if action not in PREFIX_KEEPING | {"branch", "checkout"}:
                world.prev.clear()  # records and completions may change any branch
            elif action in ("results", "function"):
                # a call answered on a fork point changes every branch sharing it
                world.prev = {k: v for k, v in world.prev.items() if k[0] == world.branch}
            for fmt in FORMATS:
                check_branch(world, world.branch, fmt, action)
        # every branch, every viewer, and a fresh engine renders the same bytes
        check_viewers(world)
        fresh = Engine(FileStore(root))
        for branch in sorted(world.graph.branches):
            for fmt in FORMATS:
                rendered = check_branch(world, branch, fmt, "final")
                if rendered is not None:
                    again = fresh.render(SID, params(fmt, branch=branch)).request
                    assert orjson.dumps(again) == orjson.dumps(rendered.request)
    finally:
        shutil.rmtree(root, ignore_errors=True)


# ---- a prepared checkpoint -------------------------------------------------------------------

REQUESTS = [  # (model, window): the request a checkpoint is prepared for, or used with
    ("claude-sonnet-4-5", None),
    ("claude-haiku-4-5", None),  # the same window, another model
    ("claude-sonnet-4-5", 100_000),  # the same model, half the window
    ("test-model", 64_000),
]


@settings(
    max_examples=25,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(data=st.data())
def test_a_prepared_checkpoint_is_used_only_for_the_request_it_was_prepared_for(
    data: st.DataObject,
) -> None:
    """The spec's "reuse checkpoints only for an identical source prefix and model": a summary
    prepared in the background for one request (model, budget) is committed by a /compact of
    the very same request, and never by one for another model or another budget."""
    root = Path(tempfile.mkdtemp(prefix="compactd-prop-", dir=FAST_DIR))
    try:
        engine = Engine(FileStore(root), counter=Counter(), summary_provider="digest")
        world = World(root, engine)
        new_session(engine, SID, config={"prepareOccupancy": 0.01, "evidenceEnabled": False})
        for _ in range(data.draw(st.integers(3, 7), label="turns")):  # complete turns
            engine.append(SID, messages=[_user(data.draw, world)])
            for _ in range(data.draw(st.integers(0, 3), label="calls")):
                act(data.draw, world, "assistant")
                if world.open_calls():
                    act(data.draw, world, "results")
                while world.open_calls():  # every call answered before the turn ends
                    act(data.draw, world, "results")
            engine.append(SID, messages=[{"role": "assistant", "content": "done"}])
        (model_a, window_a), (model_b, window_b) = (
            data.draw(st.sampled_from(REQUESTS), label="prepared for"),
            data.draw(st.sampled_from(REQUESTS), label="used with"),
        )
        p_a, p_b = params(model=model_a, window=window_a), params(model=model_b, window=window_b)
        try:
            steps = engine.prepare(SID, p_a)
            if steps is None or not drive(steps, digest_answer):
                return  # nothing to prepare for that request
            asked: list[SummaryNeeded] = []
            out = drive(
                engine.cascade(SID, p_b, manual=True),
                lambda need: asked.append(need) or digest_answer(need),
            )
        except (PendingToolResults, CannotFit):
            return
        summary = next(e for e in out.events if e.tier == "summary")
        same = model_a == model_b and p_a.spec.budget().limit == p_b.spec.budget().limit
        reused = summary.applied and summary.details["reused"]
        if same:  # the very request: the prepared checkpoint is the one used, nothing asked
            assert not asked and (reused or not summary.applied)
        else:
            assert not reused
    finally:
        shutil.rmtree(root, ignore_errors=True)
