"""Measure == render: the tally of a request equals an independent recount of its bytes."""

from __future__ import annotations

from typing import Any

import pytest
from compactd.context.engine import Engine
from compactd.context.render.conversation import (
    ASSISTANT,
    MARKERS,
    SCHEMA,
    SYSTEM,
    THINKING,
    TOOL_CALLS,
    TOOL_RESULTS,
    TOOLS,
    USER,
)
from compactd.context.tokens import Counter
from compactd.context.turns import turn_node_ids, turns_of

from tests.engine.helpers import (
    FORMATS,
    assistant,
    call,
    new_session,
    render,
    result,
    results,
    thinking,
    user,
)
from tests.support.invariants import recount_anthropic, recount_openai

PNG = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "iVBO"}}
PDF = {
    "type": "document",
    "source": {"type": "base64", "media_type": "application/pdf", "data": "JVBERi0xLjQK" * 400},
}
TOOLS_DEF = [
    {
        "name": "Bash",
        "description": "run a command",
        "input_schema": {"type": "object", "properties": {"command": {"type": "string"}}},
    },
    {"name": "Read", "input_schema": {"type": "object", "properties": {}}},
]
SCHEMA_DEF = {"type": "object", "properties": {"answer": {"type": "string"}}}
SYSTEM_BLOCKS = [
    {"type": "text", "text": "You are careful."},
    {"type": "text", "text": "Be brief."},
]


def _rich(engine: Engine, sid: str) -> None:
    new_session(engine, sid)
    engine.append(
        sid,
        messages=[
            {"role": "user", "content": [{"type": "text", "text": "look at these"}, PNG, PDF]},
            assistant(thinking("hmm"), {"type": "redacted_thinking", "data": "x" * 80}, "ok"),
            user("now run things"),
            assistant("running", call("a", command="ls -la"), call("b", "Read")),
            results(
                result("a", "x" * 6000),
                result("b", [{"type": "text", "text": "part"}, PNG, {"type": "text", "text": "2"}]),
                text="hook says hi",
            ),
            assistant("", call("c")),
            results(result("c", "", is_error=True)),
            assistant("done"),
            user("thanks"),
        ],
    )


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize(
    "extra",
    [
        {},
        {"system": "You are careful."},
        {"system": SYSTEM_BLOCKS, "tools": TOOLS_DEF, "response_schema": SCHEMA_DEF},
        {"tools": TOOLS_DEF, "model": "claude-haiku-4-5", "cache_ttl": "1h"},
    ],
)
def test_measure_equals_render(engine: Engine, fmt: str, extra: dict[str, Any]) -> None:
    _rich(engine, "m")
    rendered = render(engine, "m", fmt, **extra)  # checks recount == estimate and the sums
    recount = (recount_anthropic if fmt == "anthropic" else recount_openai)(
        rendered.request, Counter()
    )
    assert rendered.estimate == recount
    tokens = rendered.tokens()
    cats = tokens["categories"]
    assert cats[USER] > 0 and cats[ASSISTANT] > 0 and cats[TOOL_CALLS] > 0
    assert cats[TOOL_RESULTS] > 0
    assert (cats[THINKING] > 0) == (fmt == "anthropic")
    assert (cats[SYSTEM] > 0) == ("system" in extra)
    assert (cats[TOOLS] > 0) == ("tools" in extra)
    assert (cats[SCHEMA] > 0) == ("response_schema" in extra)


@pytest.mark.parametrize("fmt", FORMATS)
def test_markers_are_measured(engine: Engine, fmt: str) -> None:
    _rich(engine, "mk")
    for k in range(3):
        engine.append("mk", messages=[assistant(f"a{k}"), user(f"u{k}")])
    s = engine.session("mk")
    path = s.graph.branch_path()
    turns = turns_of(path)
    covers = [i for t in turns[:2] for i in turn_node_ids(s.graph, path, t)]
    s.add_records(
        [
            {
                "kind": "summary",
                "covers": covers,
                "data": {
                    "text": "earlier: pictures and commands",
                    "turns": [turns[0].start_id, turns[1].start_id],
                },
            }
        ]
    )
    rendered = render(engine, "mk", fmt)
    assert rendered.tokens()["categories"][MARKERS] > 0


def test_document_sent_to_openai_is_counted_as_sent(engine: Engine) -> None:
    """OpenAI has no document part: whatever stands in for it is what gets counted."""
    _rich(engine, "doc")
    rendered = render(engine, "doc", "openai")
    first = rendered.request["messages"][0]["content"]
    assert first[0] == {"type": "text", "text": "look at these"}
    assert first[1]["type"] == "image_url"
    sent = first[2]
    assert sent["type"] == "text"
    assert "JVBERi0xLjQK" * 400 not in sent["text"], "a base64 document sent as text"
