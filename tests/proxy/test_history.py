"""Reading a request's history with the previous request's reading: what is reused must be
exactly what a fresh reading gives (specs, their order, their fingerprints), whatever the
client changed between the two requests."""

from __future__ import annotations

from typing import Any

import pytest
from compactd.context.decompose import from_anthropic, from_openai
from compactd.context.errors import InvalidContent
from compactd.proxy.history import History, read_history, request_fingerprints, sorted_specs
from hypothesis import given, settings
from hypothesis import strategies as st

TEXT = st.text(alphabet="abc \n", max_size=6)


@st.composite
def step(draw: st.DrawFn, n: int) -> list[dict[str, Any]]:
    """An assistant turn with calls, then one user message answering them (in any order)."""
    calls = draw(st.integers(0, 3))
    ids = [f"toolu_{n}_{k}" for k in range(calls)]
    content: list[dict[str, Any]] = [{"type": "text", "text": draw(TEXT)}]
    content += [
        {"type": "tool_use", "id": i, "name": "Bash", "input": {"command": draw(TEXT)}} for i in ids
    ]
    results = [
        {"type": "tool_result", "tool_use_id": i, "content": draw(TEXT)}
        for i in draw(st.permutations(ids))
    ]
    texts = draw(st.lists(st.builds(lambda t: {"type": "text", "text": t}, TEXT), max_size=1))
    split = draw(st.integers(0, len(results)))  # one message's results sent as two messages
    out: list[dict[str, Any]] = [{"role": "assistant", "content": content}]
    if 0 < split < len(results):
        out.append({"role": "user", "content": results[:split]})
        results = results[split:]
    out.append({"role": "user", "content": results + texts or "go on"})
    return out


@st.composite
def history(draw: st.DrawFn) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = [{"role": "user", "content": draw(TEXT)}]
    for n in range(draw(st.integers(0, 6))):
        out += draw(step(n))
    return out


@st.composite
def next_request(draw: st.DrawFn) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Two requests of a conversation: the second repeats a prefix of the first, then differs
    (it grew, the client compacted or edited it, or it is the same)."""
    first = draw(history())
    shared = draw(st.integers(0, len(first)))
    second = [dict(m) for m in first[:shared]] + draw(history())[1:]
    return first, second


def fresh(messages: list[dict[str, Any]]) -> tuple[list[Any], list[str]]:
    specs = sorted_specs(from_anthropic(messages))
    return specs, request_fingerprints(specs)


def read(history: History) -> tuple[list[Any], list[str]]:
    return history.specs, history.fingerprints


@settings(max_examples=200, deadline=None)
@given(next_request())
def test_a_reused_reading_is_the_fresh_reading(pair: tuple[list[Any], list[Any]]) -> None:
    first, second = pair
    earlier = read_history(from_anthropic, first)
    assert read(earlier) == fresh(first)
    assert read(read_history(from_anthropic, second, earlier)) == fresh(second)


def test_repeated_messages_are_held_as_first_read() -> None:
    first = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]
    second = [dict(m) for m in first] + [{"role": "user", "content": "more"}]
    later = read_history(from_anthropic, second, read_history(from_anthropic, first))
    assert [m is o for m, o in zip(later.messages, first, strict=False)] == [True, True]
    assert later.messages[2] is second[2]


def test_a_bad_message_is_named_by_its_place_in_the_request() -> None:
    good = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]
    bad = [*good, {"role": "user", "content": [{"type": "text"}]}]
    with pytest.raises(InvalidContent, match=r"messages\[2\]"):
        read_history(from_anthropic, bad, read_history(from_anthropic, good))


def test_a_history_that_decomposes_whole_is_read_whole() -> None:
    """OpenAI's tool messages join the results before them: nothing is read one by one."""
    messages = [
        {"role": "user", "content": "go"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {"id": f"c{k}", "type": "function", "function": {"name": "f", "arguments": "{}"}}
                for k in range(2)
            ],
        },
        {"role": "tool", "tool_call_id": "c1", "content": "one"},
        {"role": "tool", "tool_call_id": "c0", "content": "zero"},
    ]
    whole = read_history(from_openai, messages, by_message=False)
    specs = sorted_specs(from_openai(messages))
    assert read(whole) == (specs, request_fingerprints(specs))


def test_results_sent_as_two_messages_are_read_again_together() -> None:
    """A run of results over two messages is sorted as one: when the second message goes, the
    first is read again rather than cut out of the run's order."""
    call = [{"type": "tool_use", "id": f"t{k}", "name": "f", "input": {}} for k in (1, 2)]
    first = [
        {"role": "user", "content": "go"},
        {"role": "assistant", "content": call},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t2"}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1"}]},
    ]
    second = [*first[:3], {"role": "assistant", "content": "done"}]
    later = read_history(from_anthropic, second, read_history(from_anthropic, first))
    assert read(later) == fresh(second)
