"""The anchor policies a replay prices compactd against, on hand-built requests: what the
Codex-like and opencode-like policies keep, when they compact, and when they overflow."""

from __future__ import annotations

import itertools

from compactd.context.replay.anchors import CodexLike, Item, OpencodeLike

SYSTEM = {"main": (b"system", 20_000), "function": (b"system", 20_000)}


def item(name: str, tokens: int, category: str, turn: int, message: int) -> Item:
    return Item(name.encode(), tokens, category, turn, message)


def history(steps: int, result_tokens: int) -> list[list[Item]]:
    """One user turn, then `steps` steps of a call and its result each: the items every
    step's request holds (each a prefix of the next)."""
    items = [item("ask", 1_500, "user", 0, 0)]
    out = []
    for i in range(steps):
        items = [
            *items,
            item(f"call{i}", 100, "tool_calls", 0, 2 * i + 1),
            item(f"result{i}", result_tokens, "tool_results", 0, 2 * i + 2),
        ]
        out.append(items)
    return out


def test_codex_like_compacts_after_a_request_at_90_percent_and_keeps_only_user_messages() -> None:
    codex = CodexLike(SYSTEM, window=48_000)
    steps = history(20, 2_000)
    sent = [codex.request("main", "main", items) for items in steps]
    sizes = [sum(t for _, t in s.blocks) for s in sent]
    first = next(i for i, s in enumerate(sizes) if s >= 0.9 * 48_000)
    # the compaction comes with the request after the one that reached 90 % of the window
    assert [len(s.calls) for s in sent[: first + 2]] == [0] * (first + 1) + [1]
    # its summary call read the whole request it replaced
    assert sent[first + 1].calls[0].input == 20_000 + sum(i.tokens for i in steps[first + 1])
    # then: the system prompt, the user's message and a 2,000-token summary — nothing else
    assert sizes[first + 1] == 20_000 + 1_500 + 2_000


def test_codex_like_sends_a_step_over_the_limit_when_it_jumps_past_the_trigger() -> None:
    """It looks at the last request's size, not at what a step adds."""
    codex = CodexLike(SYSTEM, window=48_000)
    small = history(3, 4_000)  # 20K + 1.5K + 3 x 4.1K = 33.8K: under 90 %
    for items in small:
        codex.request("main", "main", items)
    jump = [
        *small[-1],
        item("call3", 100, "tool_calls", 0, 7),
        item("big", 12_000, "tool_results", 0, 8),
    ]
    sent = codex.request("main", "main", jump)
    assert not sent.calls and sum(t for _, t in sent.blocks) > 48_000 - 8_000


def test_codex_like_keeps_the_newest_user_messages_up_to_20k_cutting_the_first_over() -> None:
    codex = CodexLike(SYSTEM, window=48_000)
    asks = [item(f"ask{i}", 8_000, "user", i, i) for i in range(4)]
    codex.request("main", "main", asks)  # 52K: over 90 %, compacted on the next request
    sent = codex.request("main", "main", asks)
    kept = [t for _, t in sent.blocks[1:-1]]
    assert kept == [4_000, 8_000, 8_000]  # the newest two whole, the third cut to what is left


def test_opencode_like_prunes_old_tool_output_once_20k_of_it_could_go() -> None:
    opencode = OpencodeLike(SYSTEM, window=200_000, limit=192_000)
    steps = history(40, 1_500)  # 60K of results
    sizes = [sum(t for _, t in opencode.request("main", "main", s).blocks) for s in steps]
    # 40K protected, so nothing goes until more than 20K lies beyond it (at 41 x 1.5K)...
    assert all(b > a for a, b in itertools.pairwise(sizes))
    steps = history(50, 1_500)
    opencode = OpencodeLike(SYSTEM, window=200_000, limit=192_000)
    sizes = [sum(t for _, t in opencode.request("main", "main", s).blocks) for s in steps]
    drop = next(i for i in range(1, len(sizes)) if sizes[i] < sizes[i - 1])
    grown = 100 + 1_500  # what the step itself added
    assert sizes[drop - 1] + grown - sizes[drop] > 20_000  # ...then all of it at once
    assert not any(opencode.request("main", "main", steps[-1]).calls)


def test_opencode_like_compacts_over_its_usable_window_keeping_a_bounded_tail() -> None:
    opencode = OpencodeLike(SYSTEM, window=48_000, limit=40_000)
    sent = None
    for items in history(12, 2_000):
        sent = opencode.request("main", "main", items)
        if sent.calls:
            break
    assert sent is not None and sent.calls
    tokens = sum(t for _, t in sent.blocks)
    # the summary and at most min(15K, max(2K, a quarter of the limit)) of the newest messages
    assert tokens <= 20_000 + 2_000 + 10_000
    assert tokens <= 40_000


def test_cc_like_compacts_over_its_threshold_into_a_summary_and_restored_files() -> None:
    """Claude Code's autocompact: window − min(reserve, 20K) − 13K; after it, the summary and
    ~10K of restored files stand for everything before. At 48K the system prompt, the summary
    and the restored files are over that line already: it summarizes on every request."""
    from compactd.context.replay.anchors import ClaudeCodeLike

    cc = ClaudeCodeLike(SYSTEM, window=64_000, limit=56_000)
    assert cc.threshold == 64_000 - 8_000 - 13_000
    sent = [cc.request("main", "main", items) for items in history(20, 2_000)]
    first = next(i for i, s in enumerate(sent) if s.calls)
    assert sum(t for _, t in sent[first - 1].blocks) <= cc.threshold
    assert sum(t for _, t in sent[first].blocks) == 20_000 + 2_000 + 10_000
    small = ClaudeCodeLike(SYSTEM, window=48_000, limit=40_000)
    calls = [len(small.request("main", "main", items).calls) for items in history(12, 1_000)]
    first = calls.index(1)
    assert all(calls[first:])  # once over, a summary with every request


def test_server_side_compaction_summarizes_as_a_cached_fork_and_cannot_serve_under_50k() -> None:
    """anthropic-api.md §2a: the trigger is min(150K, limit − 10K), never under the API's 50K
    minimum; the request over it is summarized first, reading what the previous request cached
    (priced as a fork), and later requests carry the summary and what follows it."""
    from compactd.context.replay.anchors import ServerSideCompaction
    from compactd.context.replay.cache_model import price_call

    server = ServerSideCompaction(SYSTEM, window=64_000, limit=56_000)
    assert (server.trigger, server.serves) == (50_000, True)
    assert ServerSideCompaction(SYSTEM, 200_000, 192_000).trigger == 150_000
    small = ServerSideCompaction(SYSTEM, window=48_000, limit=40_000)
    assert (small.trigger, small.serves) == (50_000, False)
    assert small.notes() == {"trigger": 50_000, "servesWindow": False}
    steps = history(20, 2_000)
    sent = [server.request("main", "main", items) for items in steps]
    first = next(i for i, s in enumerate(sent) if s.calls)
    (call,) = sent[first].calls
    previous = sum(t for _, t in sent[first - 1].blocks)
    assert call.purpose == "compaction" and call.read == previous and call.input > 50_000
    assert price_call(call.purpose, call.input, call.output, read=call.read) == (
        call.input - previous + 0.1 * previous + 5 * 2_000
    )
    assert sum(t for _, t in sent[first].blocks) == 20_000 + 2_000
    # then only the summary and what follows: the next request is it plus one step
    assert sum(t for _, t in sent[first + 1].blocks) == 20_000 + 2_000 + 100 + 2_000
