"""Bad input gets a typed error that names the problem, and changes nothing.

Every case runs against a session with some history; afterwards the log must be byte-identical
and the in-memory graph (seq, heads, nodes) untouched, so a client can retry safely.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from compactd.context.engine import Engine
from compactd.context.errors import (
    CompactdError,
    HeadConflict,
    InvalidContent,
    InvalidGraph,
    InvalidPairing,
    UnknownBranch,
    UnknownNode,
)
from compactd.context.session import Library
from compactd.context.stores.files import FileStore

from tests.engine.helpers import (
    assistant,
    call,
    log_bytes,
    new_session,
    render,
    result,
    results,
    user,
)

SID = "v"


@pytest.fixture
def base(engine: Engine) -> Engine:
    """user → assistant(t1) → result → assistant; plus a running function f off a call."""
    new_session(engine, SID)
    engine.append(
        SID,
        messages=[
            user("hello"),
            assistant("let me look", call("t1")),
            results(result("t1", "file.txt")),
            assistant("done", call("t_fn", "Task")),
        ],
    )
    engine.session(SID).function_start("Task", {"prompt": "sub"}, tool_use_id="t_fn")
    fid = next(n.id for n in engine.session(SID).graph.nodes.values() if n.kind == "function")
    engine.session(SID).function_complete(fid, "sub done")
    return engine


def _state(engine: Engine) -> tuple[Any, ...]:
    g = engine.session(SID).graph
    return (g.seq, dict(g.branches), g.current_branch, sorted(g.nodes), len(g.records))


def expect(
    engine: Engine, error: type[CompactdError], words: str, action: Callable[[], Any]
) -> CompactdError:
    """Run `action`; it must raise exactly `error` mentioning `words`, writing nothing."""
    before_bytes = log_bytes(engine, SID)
    before = _state(engine)
    with pytest.raises(CompactdError) as info:
        action()
    assert type(info.value) is error, f"{type(info.value).__name__}: {info.value}"
    assert words in str(info.value), str(info.value)
    assert log_bytes(engine, SID) == before_bytes
    assert _state(engine) == before
    reloaded = Library(FileStore(engine.store.root)).load(SID)
    assert reloaded.graph.seq == before[0] and reloaded.report.clean
    return info.value


def append(engine: Engine, **kw: Any) -> Callable[[], Any]:
    return lambda: engine.append(SID, **kw)


# ---- graph shape ---------------------------------------------------------------------------


def test_unknown_node_kind(base: Engine) -> None:
    err = expect(
        base,
        InvalidGraph,
        "unknown node kind 'banana'",
        append(
            base,
            nodes=[
                {"kind": "user", "content": "fine"},
                {"kind": "banana", "content": "x"},
            ],
        ),
    )
    assert err.data["nodeKind"] == "banana"
    expect(base, InvalidGraph, "function/start", append(base, nodes=[{"kind": "function"}]))


def test_duplicate_node_id(base: Engine) -> None:
    base.append(SID, nodes=[{"kind": "user", "id": "mine", "content": "a"}])
    expect(
        base,
        InvalidGraph,
        "duplicate node id 'mine'",
        append(base, nodes=[{"kind": "assistant", "id": "mine", "content": "b"}]),
    )
    expect(
        base,
        InvalidGraph,
        "duplicate node id 'twice'",
        append(
            base,
            nodes=[
                {"kind": "assistant", "id": "twice", "content": "b"},
                {"kind": "user", "id": "twice", "content": "c"},
            ],
        ),
    )
    expect(
        base,
        InvalidContent,
        "invalid node id '../x'",
        append(base, nodes=[{"kind": "assistant", "id": "../x", "content": "b"}]),
    )


def test_parent_given_or_unknown(base: Engine) -> None:
    s = base.session(SID)
    head = s.graph.head()
    expect(
        base,
        InvalidGraph,
        "fork with session/branch",
        append(base, nodes=[{"kind": "user", "parent": head, "content": "x"}]),
    )
    expect(base, InvalidGraph, "got 'nowhere'", lambda: s.function_start("f", {}, parent="nowhere"))
    expect(base, UnknownNode, "'nowhere'", lambda: s.create_branch("b2", from_node="nowhere"))
    expect(
        base,
        InvalidGraph,
        "must follow an assistant node",
        append(base, nodes=[{"kind": "tool", "tool_use_id": "z", "name": "n"}]),
    )


def test_branch_errors(base: Engine) -> None:
    s = base.session(SID)
    tool_node = s.graph.tool_by_use_id("t1")
    assert tool_node is not None
    expect(
        base, InvalidGraph, "is a tool node", lambda: s.create_branch("b2", from_node=tool_node.id)
    )
    expect(base, InvalidContent, "invalid branch name", lambda: s.create_branch("../b"))
    expect(base, InvalidGraph, "already exists", lambda: s.create_branch("main"))
    expect(base, UnknownBranch, "no branch 'nope'", lambda: s.checkout("nope"))
    expect(
        base, UnknownBranch, "no branch 'nope'", append(base, messages=[user("x")], branch="nope")
    )


def test_expected_head_conflict(base: Engine) -> None:
    err = expect(
        base,
        HeadConflict,
        "expected head 'old'",
        append(base, messages=[user("x")], expected_head="old"),
    )
    assert err.data["head"] == base.session(SID).graph.head()


# ---- pairing -------------------------------------------------------------------------------


def test_result_for_unknown_tool_use_id(base: Engine) -> None:
    err = expect(
        base,
        InvalidPairing,
        "unknown tool_use_id 'ghost'",
        append(base, messages=[results(result("ghost"))]),
    )
    assert err.data["toolUseId"] == "ghost"
    expect(base, InvalidPairing, "'ghost'", lambda: base.session(SID).tool_result("ghost", "x"))
    expect(
        base,
        InvalidPairing,
        "'ghost'",
        append(
            base,
            messages=[{"role": "tool", "tool_call_id": "ghost", "content": "x"}],
            format="openai",
        ),
    )


def test_result_for_answered_call(base: Engine) -> None:
    expect(
        base,
        InvalidPairing,
        "'t1' already has a result",
        append(base, messages=[results(result("t1", "again"))]),
    )
    expect(
        base,
        InvalidPairing,
        "already has a result",
        lambda: base.session(SID).tool_result("t1", "again"),
    )
    # twice in one message, for a call of the same append
    expect(
        base,
        InvalidPairing,
        "'n1' already has a result",
        append(
            base,
            messages=[
                user("again"),
                assistant(call("n1")),
                results(result("n1"), result("n1")),
            ],
        ),
    )


def test_result_for_a_call_run_as_a_function(base: Engine) -> None:
    s = base.session(SID)
    base.append(SID, messages=[user("go"), assistant(call("t_run", "Task"))])
    before = _state(base)
    fid = s.function_start("Task", {}, tool_use_id="t_run")
    assert _state(base) != before
    expect(
        base,
        InvalidPairing,
        "finish it with function/complete",
        lambda: s.tool_result("t_run", "x"),
    )
    expect(
        base,
        InvalidPairing,
        "already has a result or a function",
        lambda: s.function_start("Task", {}, tool_use_id="t_run"),
    )
    s.function_complete(fid, "ok")
    expect(base, InvalidGraph, "already completed", lambda: s.function_complete(fid, "again"))
    expect(
        base,
        InvalidGraph,
        "is not a function",
        lambda: s.function_complete(s.graph.head() or "", "x"),
    )
    expect(base, InvalidContent, "status", lambda: s.function_complete(fid, "x", "weird"))
    expect(base, InvalidContent, "expose", lambda: s.function_start("F", {}, expose="most"))
    expect(base, InvalidContent, "name", lambda: s.function_start("", {}))


def test_duplicate_tool_use_ids(base: Engine) -> None:
    expect(
        base,
        InvalidPairing,
        "duplicate tool_use_id 'd'",
        append(base, messages=[user("x"), assistant(call("d"), call("d"))]),
    )
    expect(
        base,
        InvalidPairing,
        "duplicate tool_use_id 'd'",
        append(
            base,
            messages=[
                user("x"),
                assistant(call("d")),
                results(result("d")),
                assistant(call("d")),
            ],
        ),
    )
    expect(
        base,
        InvalidPairing,
        "duplicate tool_use_id 't1'",
        append(base, messages=[user("x"), assistant(call("t1"))]),
    )
    expect(
        base,
        InvalidPairing,
        "duplicate tool_use_id 'oa'",
        append(
            base,
            format="openai",
            messages=[
                {"role": "user", "content": "x"},
                {
                    "role": "assistant",
                    "tool_calls": [
                        {
                            "id": "oa",
                            "type": "function",
                            "function": {"name": "f", "arguments": "{}"},
                        },
                        {
                            "id": "oa",
                            "type": "function",
                            "function": {"name": "f", "arguments": "{}"},
                        },
                    ],
                },
            ],
        ),
    )


# ---- messages and roles --------------------------------------------------------------------


@pytest.mark.parametrize("role", ["system", "developer"])
@pytest.mark.parametrize("fmt", ["anthropic", "openai"])
def test_system_messages_are_not_history(base: Engine, role: str, fmt: str) -> None:
    expect(
        base,
        InvalidContent,
        f"{role} messages are not history",
        append(
            base,
            format=fmt,
            messages=[{"role": "user", "content": "x"}, {"role": role, "content": "be nice"}],
        ),
    )


def test_roles_and_placement(base: Engine) -> None:
    expect(
        base,
        InvalidContent,
        "unknown role 'robot'",
        append(base, messages=[{"role": "robot", "content": "x"}]),
    )
    expect(
        base,
        InvalidContent,
        "tool_result blocks belong in user messages",
        append(base, messages=[{"role": "assistant", "content": [result("t1")]}]),
    )
    expect(
        base,
        InvalidContent,
        "tool_use blocks belong in assistant messages",
        append(base, messages=[{"role": "user", "content": [call("u1")]}]),
    )
    expect(base, InvalidContent, "messages must be a list", append(base, messages={"a": 1}))
    expect(base, InvalidContent, "must be an object", append(base, messages=["hi"]))
    expect(base, InvalidContent, "exactly one of", lambda: base.append(SID))
    expect(base, InvalidContent, "format", append(base, messages=[user("x")], format="xml"))
    expect(
        base,
        InvalidContent,
        "meta must be a boolean",
        append(base, messages=[{"role": "user", "content": "x", "meta": "yes"}]),
    )


def test_openai_shapes(base: Engine) -> None:
    def oa(*msgs: dict[str, Any]) -> Callable[[], Any]:
        return append(base, format="openai", messages=[{"role": "user", "content": "x"}, *msgs])

    expect(base, InvalidContent, "needs 'tool_call_id'", oa({"role": "tool", "content": "x"}))
    expect(
        base,
        InvalidContent,
        "needs 'id' and 'function'",
        oa({"role": "assistant", "tool_calls": [{"id": "a"}]}),
    )
    expect(
        base,
        InvalidContent,
        "arguments are not valid JSON",
        oa(
            {
                "role": "assistant",
                "tool_calls": [{"id": "a", "function": {"name": "f", "arguments": "{nope"}}],
            }
        ),
    )
    expect(
        base,
        InvalidContent,
        "unsupported content part 'audio'",
        oa({"role": "user", "content": [{"type": "audio"}]}),
    )
    expect(
        base,
        InvalidContent,
        "image_url needs a url",
        oa({"role": "user", "content": [{"type": "image_url", "image_url": {}}]}),
    )
    expect(
        base,
        InvalidContent,
        "content must be a string or a list",
        oa({"role": "user", "content": 5}),
    )


# ---- content blocks: every check in blocks.py ------------------------------------------------

_IMG = {"type": "base64", "media_type": "image/png", "data": "AAAA"}

BAD_BLOCKS: list[tuple[Any, str]] = [
    ("just a string", "must be an object"),
    ({"text": "no type"}, "needs a string 'type'"),
    ({"type": "", "text": "x"}, "needs a string 'type'"),
    ({"type": 3}, "needs a string 'type'"),
    ({"type": "text"}, "'text' block needs a string 'text'"),
    ({"type": "text", "text": 5}, "'text' block needs a string 'text'"),
    ({"type": "thinking", "signature": "s"}, "needs a string 'thinking'"),
    ({"type": "thinking", "thinking": "t", "signature": 1}, "'signature' must be a string"),
    ({"type": "redacted_thinking"}, "needs a string 'data'"),
    ({"type": "image"}, "needs a 'source' object"),
    ({"type": "image", "source": "http://x"}, "needs a 'source' object"),
    ({"type": "image", "source": {"data": "AAAA"}}, "needs a 'source' object"),
    ({"type": "image", "source": {"type": "base64", "media_type": "image/png"}}, "'data'"),
    ({"type": "image", "source": {**_IMG, "media_type": "image/tiff"}}, "media_type must be"),
    ({"type": "document"}, "needs a 'source' object"),
    ({"type": "document", "source": {"type": "base64", "media_type": "x"}}, "'data'"),
]

BAD_CALLS: list[tuple[Any, str]] = [
    ({"type": "tool_use", "name": "f", "input": {}}, "needs a string 'id'"),
    ({"type": "tool_use", "id": "", "name": "f", "input": {}}, "needs a string 'id'"),
    ({"type": "tool_use", "id": "a", "input": {}}, "needs a string 'name'"),
    ({"type": "tool_use", "id": "a", "name": "", "input": {}}, "needs a string 'name'"),
    ({"type": "tool_use", "id": "a", "name": "f", "input": "ls"}, "'input' must be an object"),
    ({"type": "tool_use", "id": "a", "name": "f"}, "'input' must be an object"),
]

BAD_RESULTS: list[tuple[Any, str]] = [
    ({"type": "tool_result", "content": "x"}, "needs a string 'tool_use_id'"),
    ({"type": "tool_result", "tool_use_id": "", "content": "x"}, "needs a string 'tool_use_id'"),
    ({"type": "tool_result", "tool_use_id": "t9", "content": 42}, "a string or a list of blocks"),
    (
        {
            "type": "tool_result",
            "tool_use_id": "t9",
            "content": [{"type": "thinking", "thinking": "x"}],
        },
        "'thinking' block is not allowed here",
    ),
    (
        {"type": "tool_result", "tool_use_id": "t9", "content": [{"type": "text"}]},
        "needs a string 'text'",
    ),
    (
        {"type": "tool_result", "tool_use_id": "t9", "content": "x", "is_error": "yes"},
        "'is_error' must be a boolean",
    ),
]


@pytest.mark.parametrize(("block", "words"), BAD_BLOCKS)
@pytest.mark.parametrize("role", ["user", "assistant"])
def test_malformed_blocks(base: Engine, block: Any, words: str, role: str) -> None:
    msgs = [user("ok")] if role == "assistant" else []
    msgs.append({"role": role, "content": [{"type": "text", "text": "fine"}, block]})
    err = expect(base, InvalidContent, words, append(base, messages=msgs))
    assert err.data["where"].startswith(f"messages[{len(msgs) - 1}].content[1]")


@pytest.mark.parametrize(("block", "words"), BAD_CALLS)
def test_malformed_tool_use(base: Engine, block: Any, words: str) -> None:
    expect(base, InvalidContent, words, append(base, messages=[user("x"), assistant(block)]))
    if "input" not in block:
        return  # raw tool nodes may leave `input` out (it defaults to {})
    node = {
        "kind": "tool",
        "tool_use_id": block.get("id"),
        "name": block.get("name"),
        "input": block["input"],
    }
    expect(
        base,
        InvalidContent,
        words,
        append(base, nodes=[{"kind": "assistant", "content": "x"}, node]),
    )


@pytest.mark.parametrize(("block", "words"), BAD_RESULTS)
def test_malformed_tool_result(base: Engine, block: Any, words: str) -> None:
    base.append(SID, messages=[user("x"), assistant(call("t9"))])
    expect(base, InvalidContent, words, append(base, messages=[results(block)]))
    if "content" in block and block.get("tool_use_id") == "t9" and "is_error" not in block:
        expect(
            base,
            InvalidContent,
            words,
            lambda: base.session(SID).tool_result("t9", block["content"]),
        )
    base.session(SID).tool_result("t9", "finally fine")  # the call still takes a good result


def test_message_content_shape(base: Engine) -> None:
    expect(
        base,
        InvalidContent,
        "content must be a string or a list of blocks",
        append(base, messages=[{"role": "user", "content": {"type": "text"}}]),
    )
    expect(
        base,
        InvalidContent,
        "content must be a string or a list of blocks",
        append(base, messages=[{"role": "user"}]),
    )
    expect(
        base,
        InvalidContent,
        "give calls as tool nodes",
        append(base, nodes=[{"kind": "assistant", "content": [call("zz")]}]),
    )
    expect(
        base,
        InvalidContent,
        "is_error must be a boolean",
        append(
            base,
            nodes=[
                {"kind": "assistant", "content": "x"},
                {"kind": "tool", "tool_use_id": "q", "name": "f", "result": "r", "is_error": 1},
            ],
        ),
    )
    expect(
        base,
        InvalidContent,
        "tool result content must be",
        lambda: base.session(SID).function_complete("f9", 5),
    )


def test_an_error_in_a_later_message_writes_none_of_the_earlier_ones(base: Engine) -> None:
    expect(
        base,
        InvalidPairing,
        "unknown tool_use_id 'nope'",
        append(
            base,
            messages=[
                user("first, valid"),
                assistant("valid too", call("fresh")),
                results(result("fresh")),
                results(result("nope")),
            ],
        ),
    )
    # and the session is still usable afterwards
    render(base, SID)
    base.append(SID, messages=[user("after")])
