"""Provider messages → nodes, and back out through a render.

What an agent appends must come back out as it went in: tool_use blocks at their place among
the assistant's blocks, results in call order, thinking byte-exact, OpenAI messages round trip.
"""

from __future__ import annotations

import copy
from typing import Any

import orjson
from compactd.context.decompose import (
    CallSpec,
    ResultSpec,
    ThreadSpec,
    from_anthropic,
    from_nodes,
    from_openai,
)
from compactd.context.engine import Engine
from compactd.context.turns import turns_of

from tests.engine.helpers import (
    assistant,
    call,
    new_session,
    render,
    result,
    results,
    thinking,
    tool_messages,
    user,
)
from tests.support.invariants import strip_cache_control, thinking_sequence


def test_anthropic_assistant_calls_become_tool_nodes() -> None:
    specs = from_anthropic(
        [
            assistant(
                "first",
                call("a", "Read", path="x"),
                "between",
                {**call("b", "Bash"), "caller": {"type": "direct"}},
            )
        ]
    )
    assert specs == [
        ThreadSpec(
            "assistant",
            [{"type": "text", "text": "first"}, {"type": "text", "text": "between"}],
            False,
            (
                CallSpec(1, "a", "Read", {"path": "x"}),
                CallSpec(3, "b", "Bash", {"command": "ls"}, {"caller": {"type": "direct"}}),
            ),
        )
    ]


def test_anthropic_user_results_and_text() -> None:
    only_results = from_anthropic([results(result("a", "A"), result("b", "B", is_error=True))])
    assert only_results == [ResultSpec("a", "A"), ResultSpec("b", "B", True)]
    with_text = from_anthropic([results(result("a"), text="note from a hook")])
    assert with_text == [
        ResultSpec("a", "ok"),
        ThreadSpec("user", [{"type": "text", "text": "note from a hook"}], meta=True),
    ]
    plain = from_anthropic([{"role": "user", "content": "hi"}])
    assert plain == [ThreadSpec("user", [{"type": "text", "text": "hi"}], meta=False)]
    flagged = from_anthropic([user("reminder", meta=True)])
    assert flagged == [ThreadSpec("user", [{"type": "text", "text": "reminder"}], meta=True)]


def test_raw_nodes() -> None:
    specs = from_nodes(
        [
            {"kind": "user", "id": "u1", "content": "hi"},
            {"kind": "assistant", "content": [{"type": "text", "text": "a"}]},
            {"kind": "tool", "tool_use_id": "t", "name": "Bash", "input": {"c": 1}, "result": "r"},
            {"kind": "tool", "tool_use_id": "t2", "name": "Read"},
        ]
    )
    assert specs == [
        ThreadSpec("user", [{"type": "text", "text": "hi"}], False, (), "u1"),
        ThreadSpec(
            "assistant",
            [{"type": "text", "text": "a"}],
            False,
            (CallSpec(1, "t", "Bash", {"c": 1}), CallSpec(2, "t2", "Read", {})),
        ),
        ResultSpec("t", "r"),
    ]


def test_result_text_is_meta_and_does_not_start_a_turn(engine: Engine) -> None:
    sid = new_session(engine, "meta")
    engine.append(
        sid,
        messages=[
            user("task"),
            assistant(call("a")),
            results(result("a"), text="system reminder"),
            assistant("done"),
        ],
    )
    g = engine.session(sid).graph
    path = g.branch_path()
    kinds = [(g.nodes[i].kind, g.nodes[i].meta) for i in path.ids]
    assert kinds == [("user", False), ("assistant", False), ("user", True), ("assistant", False)]
    assert len(turns_of(path)) == 1
    # rendered: results first, then the text, in one user message
    req = render(engine, sid).request
    assert [m["role"] for m in req["messages"]] == ["user", "assistant", "user", "assistant"]
    assert [b["type"] for b in req["messages"][2]["content"]] == ["tool_result", "text"]


def test_render_reproduces_what_was_appended(engine: Engine) -> None:
    sid = new_session(engine, "echo")
    sent = [
        user("please fix it"),
        assistant(
            thinking("plan it"),
            "I'll read first",
            call("r1", "Read", path="a.py"),
            call("r2", "Grep", pattern="bug"),
        ),
        results(result("r1", "code"), result("r2", [{"type": "text", "text": "hit"}])),
        assistant("edit", {**call("e1", "Edit", path="a.py"), "caller": {"type": "direct"}}),
        results(result("e1", "failed", is_error=True)),
        assistant("it failed; giving up"),
        user("ok thanks"),
    ]
    engine.append(sid, messages=copy.deepcopy(sent))
    got = strip_cache_control(render(engine, sid).request)["messages"]
    assert got == sent


def test_consecutive_same_role_messages_merge(engine: Engine) -> None:
    sid = new_session(engine, "merge")
    engine.append(
        sid,
        messages=[
            user("one"),
            user("two", meta=True),
            assistant("a"),
            assistant("b"),
        ],
    )
    req = strip_cache_control(render(engine, sid).request)
    assert req["messages"] == [
        {"role": "user", "content": [{"type": "text", "text": t} for t in ("one", "two")]},
        {"role": "assistant", "content": [{"type": "text", "text": t} for t in ("a", "b")]},
    ]
    oa = render(engine, sid, "openai").request
    assert oa["messages"] == [
        {"role": "user", "content": [{"type": "text", "text": t} for t in ("one", "two")]},
        {"role": "assistant", "content": [{"type": "text", "text": t} for t in ("a", "b")]},
    ]


def test_thinking_blocks_byte_exact_and_in_order(engine: Engine) -> None:
    """Thinking and redacted thinking come out with the same bytes (key order, unicode,
    signatures) in the same order, in every turn, whatever breakpoints land nearby."""
    sid = new_session(engine, "think")
    blocks: list[dict[str, Any]] = []
    for k in range(4):
        th = {"signature": f"Eq{k}==", "thinking": f"step {k}: ünïcode ✓ \n\t quotes \" '"}
        red = {"type": "redacted_thinking", "data": f"opaque+{k}/=="}
        th = {"type": "thinking", **th}
        blocks += [th, red]
        engine.append(
            sid,
            messages=[
                user(f"q{k}"),
                assistant(th, red, f"answer {k}", call(f"c{k}")),
                results(result(f"c{k}")),
                assistant(thinking(f"after {k}", f"s{k}")),
            ],
        )
        blocks.append(thinking(f"after {k}", f"s{k}"))
    for kw in ({}, {"system": "sys"}, {"tools": [{"name": "t", "input_schema": {}}]}):
        req = render(engine, sid, **kw).request
        assert thinking_sequence(req) == [orjson.dumps(b).decode() for b in blocks]
    # OpenAI has no place for thinking: none is sent, and nothing else is lost
    oa = render(engine, sid, "openai").request
    assert b"thinking" not in orjson.dumps(oa) and b"opaque" not in orjson.dumps(oa)
    assert "answer 3" in orjson.dumps(oa).decode()


OPENAI_HISTORY: list[dict[str, Any]] = [
    {"role": "user", "content": "list the files"},
    {
        "role": "assistant",
        "content": "sure",
        "tool_calls": [
            {
                "id": "call_1",
                "type": "function",
                "function": {"name": "shell", "arguments": '{"cmd":"ls"}'},
            },
            {
                "id": "call_2",
                "type": "function",
                "function": {"name": "read_file", "arguments": '{"path":"a.txt","n":3}'},
            },
        ],
    },
    {"role": "tool", "tool_call_id": "call_1", "content": "a.txt\nb.txt"},
    {"role": "tool", "tool_call_id": "call_2", "content": "hello"},
    {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {
                "id": "call_3",
                "type": "function",
                "function": {"name": "shell", "arguments": '{"cmd":"false"}'},
            }
        ],
    },
    {"role": "tool", "tool_call_id": "call_3", "content": "exit 1"},
    {"role": "assistant", "content": "two files"},
    {
        "role": "user",
        "content": [
            {"type": "text", "text": "and this?"},
            {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo="}},
            {"type": "image_url", "image_url": {"url": "https://example.com/x.png"}},
        ],
    },
]


def test_openai_round_trip(engine: Engine) -> None:
    sid = new_session(engine, "oa")
    engine.append(sid, messages=copy.deepcopy(OPENAI_HISTORY), format="openai")
    req = render(engine, sid, "openai", system="be brief").request
    assert req["messages"][0] == {"role": "system", "content": "be brief"}
    assert req["messages"][1:] == OPENAI_HISTORY
    # the same history in Anthropic's shape
    an = strip_cache_control(render(engine, sid).request)["messages"]
    assert an[1]["content"] == [
        {"type": "text", "text": "sure"},
        {"type": "tool_use", "id": "call_1", "name": "shell", "input": {"cmd": "ls"}},
        {
            "type": "tool_use",
            "id": "call_2",
            "name": "read_file",
            "input": {"path": "a.txt", "n": 3},
        },
    ]
    assert an[2]["content"] == [
        {"type": "tool_result", "tool_use_id": "call_1", "content": "a.txt\nb.txt"},
        {"type": "tool_result", "tool_use_id": "call_2", "content": "hello"},
    ]
    assert an[-1]["content"][1] == {
        "type": "image",
        "source": {"type": "base64", "media_type": "image/png", "data": "iVBORw0KGgo="},
    }
    assert an[-1]["content"][2] == {
        "type": "image",
        "source": {"type": "url", "url": "https://example.com/x.png"},
    }


def test_openai_messages_render_in_anthropic_and_back(engine: Engine) -> None:
    """Appending in one format and rendering in the other keeps every call and result."""
    sid = new_session(engine, "mixed")
    engine.append(sid, messages=[user("x"), assistant(call("m1", "f", a=1))])
    engine.append(
        sid, messages=[{"role": "tool", "tool_call_id": "m1", "content": "r"}], format="openai"
    )
    engine.append(sid, messages=[{"role": "assistant", "content": "fin"}], format="openai")
    oa = render(engine, sid, "openai").request
    assert tool_messages(oa) == {"m1": "r"}
    assert oa["messages"][1]["tool_calls"][0]["function"] == {"name": "f", "arguments": '{"a":1}'}


def test_openai_non_object_arguments_are_wrapped() -> None:
    specs = from_openai(
        [
            {
                "role": "assistant",
                "tool_calls": [{"id": "x", "function": {"name": "f", "arguments": "[1,2]"}}],
            }
        ]
    )
    assert isinstance(specs[0], ThreadSpec)
    assert specs[0].calls[0].input == {"arguments": [1, 2]}
