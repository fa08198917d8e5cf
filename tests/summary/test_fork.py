"""The rolling summary asked as a fork of the cached request: the request just rendered, byte for
byte, with one more user turn that names the part to replace — at the engine (what Tier 4 offers
and how an answer, a plain answer or a failure is taken) and through the real SDK against the
strict fake Messages server (what goes on the wire)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import attrs
import pytest
from compactd.context.engine import Engine
from compactd.context.summarizer.driver import digest_answer
from compactd.context.summarizer.types import Fork, SummaryFailure, SummaryNeeded, SummaryResult
from compactd.context.tiers.reactive import Overflow
from compactd.service.providers.anthropic_provider import AnthropicSummaryProvider, fork_body

from tests.cascade.helpers import (
    MODEL,
    Recorder,
    assistant,
    cascade,
    check_wire,
    filler,
    log_bytes,
    open_session,
    params,
    records,
    results,
    texts,
    tool_result,
    tool_use,
    user,
)
from tests.summary.helpers import turn
from tests.support.fake_anthropic import FakeAnthropic, Reply
from tests.support.invariants import strip_cache_control

ASK = "[compactd] This message is not from the user."


@pytest.fixture
def engine(store: Any) -> Engine:
    return Engine(store, summary_provider="digest", defaults={"evidenceEnabled": False})


def six_turns(engine: Engine, config: dict[str, Any] | None = None) -> str:
    sid = open_session(engine, config)
    engine.append(sid, messages=[m for k in range(6) for m in turn(f"k{k}")])
    engine.append(sid, messages=[user("Request k6: go on.")])
    return sid


def talky(engine: Engine, config: dict[str, Any] | None = None) -> str:
    """Six complete turns whose bulk is the assistant's explanations (no clear can take it),
    then a new request."""
    sid = open_session(engine, config)
    for k in range(6):
        engine.append(
            sid,
            messages=[
                user(f"Request t{k}: explain module t{k}."),
                assistant(filler(f"t{k}x", 900)),
                assistant(f"Module t{k} explained."),
            ],
        )
    engine.append(sid, messages=[user("Request t6: go on.")])
    return sid


def test_the_summary_forks_the_request_it_would_have_sent(engine: Engine) -> None:
    """Offered as a fork: the very request a render without the cascade sends (system, tools,
    messages and breakpoints, byte for byte), and an instruction that names what it replaces
    — everything before the last messages the summary keeps, how the first of them begins —
    with the checkpoint's own rules. The digest answers it in one call, the summary is written
    and the request it leaves is consistent."""
    sid = six_turns(engine)
    p = params(system="You are a coding agent.", tools=[{"name": "Bash", "input_schema": {}}])
    sent = engine.render(sid, p, remember=False).request
    recorder = Recorder()
    out = cascade(engine, sid, p, answer=recorder, manual=True)
    (need,) = recorder.needs
    fork = need.request.fork
    assert fork is not None and fork.format == "anthropic"
    assert fork.request == sent  # breakpoints included: what the provider cached
    assert fork.instruction.startswith(ASK)
    # the two latest complete turns and the active one stay: 2 × 4 messages and the request
    assert "up to the last 9 message(s)" in fork.instruction
    assert "begins with «Request k4: inspect module k4 and report what it does.»" in (
        fork.instruction
    )
    assert need.request.system in fork.instruction  # the checkpoint's headings and size
    assert fork.input_tokens_estimate > engine.render(sid, p, remember=False).estimate // 2
    (summary,) = records(engine, sid, "summary")
    assert summary.data["usage"]["calls"] == 1 and summary.data["usage"]["forked"] is True
    shown = texts(out.rendered.request)
    assert "Request k6: go on." in shown and "Request k4: inspect module k4" in shown[1]
    check_wire(out.rendered)


def test_inside_a_turn_the_fork_says_which_request_stays(engine: Engine) -> None:
    """A cut inside the turn in progress: its request stays verbatim before the summary, and
    the fork says so (the model must not fold it away)."""
    sid = open_session(engine)
    ask = "Request long: read every module and report."
    engine.append(sid, messages=[user(ask)])
    for k in range(8):  # the bulk is the assistant's own reasoning: no clear can take it
        use = f"toolu_m{k}"
        engine.append(
            sid,
            messages=[
                assistant(filler(f"m{k}", 700), tool_use(use)),
                results(tool_result(use, f"module m{k}: ok")),
            ],
        )
    recorder = Recorder()
    cascade(engine, sid, params(), answer=recorder)
    (need,) = recorder.needs
    fork = need.request.fork
    assert fork is not None
    assert f"stays too, verbatim, before your checkpoint: «{ask}»" in fork.instruction
    (summary,) = records(engine, sid, "summary")
    assert summary.data.get("through")


@pytest.mark.parametrize(
    ("config", "spec"),
    [
        ({"summaryFork": False}, {}),
        ({"summaryModel": "claude-haiku-4-5"}, {}),  # another model's cache: nothing to read
        ({}, {"format": "openai"}),
        ({}, {"cache": False}),
        ({}, {"model": None}),
    ],
)
def test_no_fork_where_nothing_cached_could_be_read(
    engine: Engine, config: dict[str, Any], spec: dict[str, Any]
) -> None:
    sid = six_turns(engine, config)
    recorder = Recorder()
    cascade(engine, sid, params(**spec), answer=recorder, manual=True)
    assert recorder.needs and all(n.request.fork is None for n in recorder.needs)
    assert len(records(engine, sid, "summary")) == 1


def test_no_fork_of_a_request_the_provider_refused(engine: Engine) -> None:
    """Tier 5: the request the cascade starts from is the one the provider said is too long;
    a fork of it would be refused the same way."""
    sid = talky(engine, {"snipEnabled": False})  # the summary, not a snip, makes it fit
    total = engine.render(sid, params(), remember=False).total
    recorder = Recorder()
    overflow = Overflow(413, "request too large", total, total // 2)
    cascade(engine, sid, params(), answer=recorder, overflow=overflow)
    assert recorder.needs and all(n.request.fork is None for n in recorder.needs)


def plain_chunks(need: SummaryNeeded) -> SummaryResult | SummaryFailure:
    """A provider that cannot fork: it answers each prompt it is given."""
    return SummaryResult(text=f"checkpoint of {len(need.request.prompt)} chars", model="plain")


def test_a_provider_that_cannot_fork_answers_the_plain_prompt_chunk_by_chunk(
    engine: Engine,
) -> None:
    sid = six_turns(engine, {"summaryInputMaxTokens": 2000})
    recorder = Recorder(plain_chunks)
    cascade(engine, sid, params(), answer=recorder, manual=True)
    assert len(recorder.needs) >= 2
    first, *rest = [n.request for n in recorder.needs]
    assert first.fork is not None and all(r.fork is None for r in rest)
    assert "part 1 of" in first.prompt and "<previous_checkpoint>" in rest[0].prompt
    (summary,) = records(engine, sid, "summary")
    assert summary.data["usage"]["calls"] == len(recorder.needs)
    assert "forked" not in summary.data["usage"]


def failing_fork(kind: str) -> Any:
    def answer(need: SummaryNeeded) -> SummaryResult | SummaryFailure:
        if need.request.fork is not None:
            return SummaryFailure(kind, "the fork went wrong", forked=True)
        return digest_answer(need)

    return answer


@pytest.mark.parametrize("kind", ["prompt_too_long", "truncated", "other", "empty"])
def test_a_fork_the_provider_could_not_make_is_followed_by_the_plain_prompt(
    engine: Engine, kind: str
) -> None:
    sid = six_turns(engine)
    recorder = Recorder(failing_fork(kind))
    cascade(engine, sid, params(), answer=recorder, manual=True)
    assert [n.request.fork is not None for n in recorder.needs] == [True, False]
    (summary,) = records(engine, sid, "summary")
    assert summary.data["usage"]["forkFailed"] == kind


@pytest.mark.parametrize("kind", ["overloaded", "rate_limited", "auth", "timeout"])
def test_a_provider_that_is_down_fails_the_summary_after_the_fork(
    engine: Engine, kind: str
) -> None:
    """Down, refusing the key or out of time, the provider would fail the plain prompt too:
    nothing more is asked and nothing is written."""
    sid = six_turns(engine)
    log = log_bytes(engine, sid)
    recorder = Recorder(failing_fork(kind))
    out = cascade(engine, sid, params(), answer=recorder, manual=True)
    assert len(recorder.needs) == 1
    assert records(engine, sid, "summary") == []
    assert log_bytes(engine, sid) == log
    (event,) = out.events
    assert not event.applied and kind in event.reason


def test_a_fork_that_would_not_fit_the_window_is_not_offered(engine: Engine) -> None:
    """The fork is the whole request plus the instruction and the summary's output: when that
    is over the window (a request far over its limit), the plain prompt is asked instead."""
    sid = talky(engine)
    p = params(window=12_000)
    assert engine.render(sid, p, remember=False).total > 12_000
    recorder = Recorder()
    cascade(engine, sid, p, answer=recorder)
    assert recorder.needs and all(n.request.fork is None for n in recorder.needs)


# ---- on the wire ---------------------------------------------------------------------------


@pytest.fixture
def fake() -> Iterator[FakeAnthropic]:
    with FakeAnthropic(api_key="test") as server:
        yield server


def offered_fork(engine: Engine, **spec: Any) -> SummaryNeeded:
    sid = six_turns(engine)
    p = params(system="You are a coding agent.", tools=[{"name": "Bash", "input_schema": {}}])
    if spec:
        p = attrs.evolve(p, spec=attrs.evolve(p.spec, **spec))
    gen = engine.cascade(sid, p, manual=True)
    need: SummaryNeeded = next(gen)
    gen.close()
    assert need.request.fork is not None
    return need


async def ask(fake: FakeAnthropic, need: SummaryNeeded, **options: Any) -> Any:
    provider = AnthropicSummaryProvider(
        api_key="test", base_url=fake.base_url, max_retries=0, **options
    )
    try:
        return await provider.summarize(need.request)
    except SummaryFailure as failure:
        return failure
    finally:
        await provider.aclose()


async def test_the_fork_goes_out_as_the_request_with_the_instruction_last(
    engine: Engine, fake: FakeAnthropic
) -> None:
    """On the request's own model, with its system prompt, tools and messages as rendered
    (breakpoints too), the instruction after the tool results of the last user message; the
    provider says it answered the fork, with what it read from its cache."""
    need = offered_fork(engine)
    fork = need.request.fork
    assert fork is not None
    fake.push(Reply.answer("CHECKPOINT via fork", cache_read_input_tokens=3_000))
    answer = await ask(fake, need)
    assert isinstance(answer, SummaryResult) and answer.forked
    assert answer.text == "CHECKPOINT via fork" and answer.cache_read_input_tokens == 3_000
    (sent,) = fake.messages_requests()
    body = sent.body
    assert body["model"] == MODEL
    assert body["system"] == fork.request["system"] and body["tools"] == fork.request["tools"]
    assert body["messages"][:-1] == fork.request["messages"][:-1]
    last, rendered_last = body["messages"][-1], fork.request["messages"][-1]
    assert last["content"][:-1] == rendered_last["content"]
    assert last["content"][-1] == {"type": "text", "text": fork.instruction}
    assert body["max_tokens"] == need.request.max_output_tokens


async def test_the_fork_keeps_the_request_s_thinking_and_context_edits(
    engine: Engine, fake: FakeAnthropic
) -> None:
    """Thinking settings and context edits are part of what the cache keys: the fork sends
    them as they were (with room for the summary beside the thinking budget), and the beta
    the edits need."""
    need = offered_fork(engine)
    fork = need.request.fork
    assert fork is not None
    edits = {
        "edits": [{"type": "clear_tool_uses_20250919", "keep": {"type": "tool_uses", "value": 1}}]
    }
    request = {
        **fork.request,
        "thinking": {"type": "enabled", "budget_tokens": 2_000},
        "context_management": edits,
    }
    headers = {"anthropic-beta": "context-management-2025-06-27"}
    forked = attrs.evolve(need.request, fork=attrs.evolve(fork, request=request, headers=headers))
    fake.push(Reply.answer("CHECKPOINT"))
    answer = await ask(fake, attrs.evolve(need, request=forked))
    assert isinstance(answer, SummaryResult) and answer.forked
    (sent,) = fake.messages_requests()
    assert sent.body["thinking"] == request["thinking"]
    assert sent.body["context_management"] == edits
    assert "context-management-2025-06-27" in sent.betas
    assert sent.body["max_tokens"] == 2_000 + need.request.max_output_tokens


async def test_a_named_summary_model_is_asked_the_plain_prompt(
    engine: Engine, fake: FakeAnthropic
) -> None:
    need = offered_fork(engine)
    fake.push(Reply.answer("CHECKPOINT, plain"))
    answer = await ask(fake, need, model="claude-haiku-4-5")
    assert isinstance(answer, SummaryResult) and not answer.forked
    (sent,) = fake.messages_requests()
    assert sent.body["model"] == "claude-haiku-4-5"
    assert sent.body["messages"] == [{"role": "user", "content": need.request.prompt}]
    assert "tools" not in sent.body


async def test_a_fork_answered_with_a_tool_call_is_a_failure_the_plain_prompt_follows(
    engine: Engine, fake: FakeAnthropic
) -> None:
    need = offered_fork(engine)
    call = {"type": "tool_use", "id": "toolu_x", "name": "Bash", "input": {"command": "ls"}}
    fake.push(Reply.blocks([call], stop_reason="tool_use"))
    answer = await ask(fake, need)
    assert isinstance(answer, SummaryFailure) and answer.forked and answer.kind == "other"
    assert "called a tool" in answer.message


def test_a_forced_tool_choice_is_not_forked() -> None:
    fork = Fork("anthropic", {"model": "m", "messages": [{"role": "user", "content": "hi"}]}, "?")
    assert fork_body(fork, 100) is not None
    for choice in ({"type": "any"}, {"type": "tool", "name": "Bash"}):
        forced = attrs.evolve(fork, request={**fork.request, "tool_choice": choice})
        assert fork_body(forced, 100) is None
    # a last assistant message (a prefill) gets the instruction as a user message of its own
    ending = attrs.evolve(
        fork,
        request={
            **fork.request,
            "messages": [*fork.request["messages"], {"role": "assistant", "content": "ok"}],
        },
    )
    body = fork_body(ending, 100)
    assert body is not None and body["messages"][-1] == {
        "role": "user",
        "content": [{"type": "text", "text": "?"}],
    }
    assert strip_cache_control(body)["messages"][:2] == ending.request["messages"]
