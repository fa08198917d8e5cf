"""Tier 3 — Context Collapse at the engine: how segments are cut, when collapse has material at
all (Snip comes first), and auto-compact going ahead when collapse cannot hold the request
under its blocking limit. (The daemon-level behaviour is in tests/summary/test_collapse.py.)"""

from __future__ import annotations

from compactd.context.engine import Engine
from compactd.context.tiers.collapse import segments
from compactd.context.turns import Turn

from tests.cascade.helpers import (
    Recorder,
    assistant,
    cascade,
    exchange,
    filler,
    open_session,
    params,
    records,
    results,
    tool_result,
    tool_use,
    user,
)


def fake_turns(indexes: list[int]) -> list[Turn]:
    return [Turn(i, i, i + 1, f"n{i}", True) for i in indexes]


def test_segments_are_runs_of_five_to_ten_consecutive_turns() -> None:
    cut = segments(fake_turns(list(range(1, 24))), 5, 10)
    assert [[t.index for t in s] for s in cut] == [list(range(1, 11)), list(range(11, 21))]
    # a gap (a turn that may not be collapsed) ends a run; a short run is left alone
    cut = segments(fake_turns([1, 2, 3, 4, 5, 6, 8, 9, 10]), 5, 10)
    assert [[t.index for t in s] for s in cut] == [[1, 2, 3, 4, 5, 6]]
    assert segments(fake_turns([1, 2, 3, 4]), 5, 10) == []


def talk(engine: Engine, config: dict[str, object], turns: int, words: int = 420) -> str:
    """Turns whose bulk is the assistant's explanation (a checkpoint does not quote it)."""
    sid = open_session(engine, {"summaryProvider": "digest", **config})
    for t in range(turns):
        engine.append(
            sid,
            messages=[
                user(f"request t{t:02d}"),
                assistant(filler(f"a{t}", words)),
                assistant(f"done t{t:02d}"),
            ],
        )
    return sid


def test_with_snip_on_collapse_has_nothing_to_do(engine: Engine) -> None:
    sid = talk(engine, {}, 22)
    recorder = Recorder()
    out = cascade(engine, sid, params(), answer=recorder)
    assert [e.tier for e in out.events if e.applied] == ["snip"]
    assert recorder.needs == []
    assert records(engine, sid, "collapse") == []


def test_when_collapse_cannot_hold_the_blocking_limit_auto_compact_goes_ahead(
    engine: Engine,
) -> None:
    """Big protected turns around seven small old ones: collapsing those is not enough."""
    sid = open_session(engine, {"summaryProvider": "digest", "snipEnabled": False})

    def explained(tag: str, words: int) -> list[dict[str, object]]:
        return [user(f"request {tag}"), assistant(filler(tag, words)), assistant(f"done {tag}")]

    engine.append(sid, messages=explained("t00", 2250))
    for t in range(1, 8):
        engine.append(sid, messages=explained(f"t{t:02d}", 250))
    engine.append(sid, messages=explained("t08", 2250))
    engine.append(
        sid,
        messages=[
            user("request t09"),
            assistant(filler("t09", 1200), tool_use("toolu_t09", "Read")),
            results(tool_result("toolu_t09", "the file is empty")),
        ],
    )
    recorder = Recorder()
    out = cascade(engine, sid, params(), answer=recorder)
    tiers = [e.tier for e in out.events if e.applied]
    assert tiers == ["collapse", "summary"]
    assert [n.tier for n in recorder.needs] == ["collapse", "rolling"]
    (collapse,) = records(engine, sid, "collapse")
    assert len(collapse.data["turns"]) == 7
    collapse_event = next(e for e in out.events if e.tier == "collapse")
    assert collapse_event.tokens_after > 0.95 * out.rendered.budget.limit
    assert out.rendered.total <= 0.85 * out.rendered.budget.limit
    # the summary did not split the collapsed segment: it took it whole or not at all
    (summary,) = records(engine, sid, "summary")
    segment = set(collapse.data["turns"])
    assert segment <= set(summary.data["turns"]) or segment.isdisjoint(summary.data["turns"])


def test_without_a_provider_the_llm_tiers_say_so(engine: Engine) -> None:
    sid = open_session(engine, {"snipEnabled": False})
    for t in range(14):
        engine.append(sid, messages=exchange(f"t{t:02d}", [], ask=filler(f"a{t}", 420)))
    out = cascade(engine, sid, params(window=34_700))  # between 85 % and the limit
    notes = {e.tier: e.reason for e in out.events if not e.applied}
    assert "collapse" not in notes  # nothing to say beyond the summary's note
    assert notes["summary"].startswith("no summary provider is configured")
    assert records(engine, sid) == []
