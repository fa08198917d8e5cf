"""Every method of DESIGN §6 through the real daemon and the product's Python client, with the
core shapes a client relies on. One daemon (digest summary provider) serves the module; each
test works on its own sessions."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
from compactd.clients.client import CompactdClient, RpcError
from compactd.context.budget import prior_ratio
from compactd.context.policy import CLEARED_PLACEHOLDER, RUNNING_FUNCTION_PLACEHOLDER
from compactd.protocol import types as t
from compactd.protocol.convert import ParamsError, unstructure

from tests.support.invariants import check_anthropic_pairing, check_openai_pairing, server_view
from tests.support.logs import log_bytes

from .conftest import node_ids, running
from .convo import (
    all_text,
    assistant,
    filler,
    openai_turn,
    tool_results,
    tool_turns,
    tool_use,
    user,
)
from .wire import session_log

pytestmark = pytest.mark.asyncio(loop_scope="module")

TRANSCRIPT = next((Path(__file__).parents[1] / "data/transcripts/codex").glob("rollout-*.jsonl"))
TRANSCRIPT_CALLS = 39  # function_call / function_call_output pairs (tests/data/transcripts/README)
MODEL = "claude-sonnet-4-5"
HEADROOM_OFF = {"cascadeTarget": 0.85}  # free only down to the threshold


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("methods") / "data"


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def client(data_dir: Path) -> AsyncIterator[CompactdClient]:
    async with running(data_dir, "--summary-provider", "digest") as c:
        yield c


async def new_session(
    client: CompactdClient,
    sid: str,
    messages: list[dict[str, Any]],
    config: dict[str, Any] | None = None,
) -> str:
    await client.open_session(sid, config)
    if messages:
        await client.append(sid, messages)
    return sid


def records(view: dict[str, Any], kind: str) -> list[dict[str, Any]]:
    return [r for r in view["records"] if r["kind"] == kind]


def check_measure(tokens: Any) -> None:
    """The context panel's arithmetic: categories add up to the total, and with the output
    reserve and the free space to the window."""
    cats = tokens.categories
    prompt = {k: v for k, v in cats.items() if k not in ("output_reserve", "free")}
    assert all(v >= 0 for v in cats.values()), cats
    assert sum(prompt.values()) == tokens.total
    assert tokens.total + cats["output_reserve"] + cats["free"] == tokens.window


# ---- sessions ------------------------------------------------------------------------------


@pytest.mark.files_only
async def test_open_creates_then_loads_and_list_shows_them(
    client: CompactdClient, data_dir: Path
) -> None:
    fresh = await client.open_session()
    assert fresh.created is True and fresh.branch == "main" and fresh.head is None
    assert len(fresh.session_id) >= 16  # a generated id
    named = await client.open_session("m-open", config={"microcompactKeepRecent": 3})
    assert (named.session_id, named.created) == ("m-open", True)
    again = await client.open_session("m-open")
    assert again.created is False
    view = await client.get("m-open")
    assert view["config"] == {"microcompactKeepRecent": 3}
    listed = {s.session_id: s for s in (await client.list_sessions()).sessions}
    assert {fresh.session_id, "m-open"} <= set(listed)
    info = listed["m-open"]
    assert info.loaded is True
    assert info.size_bytes == session_log(data_dir, "m-open").stat().st_size > 0


async def test_list_shows_what_each_session_holds_newest_first(client: CompactdClient) -> None:
    older = await new_session(client, "m-list-a", [user("first request")])
    newer = await new_session(client, "m-list-b", tool_turns("lb", 2, 300))
    await client.append(newer, [{"role": "user", "content": "and one more"}])
    sessions = (await client.list_sessions()).sessions
    assert [s.modified for s in sessions] == sorted((s.modified for s in sessions), reverse=True)
    listed = {s.session_id: s for s in sessions}
    assert listed[newer].turns == 3 and listed[older].turns == 1
    assert listed[newer].tokens == (await client.measure(newer)).total > listed[older].tokens > 0
    assert listed[older].source is None  # made live, not imported
    only = (await client.list_sessions(prefix="m-list-")).sessions
    assert {s.session_id for s in only} == {older, newer}
    # a session appended to since the last listing is listed afresh, not from the cache
    await client.append(older, [{"role": "assistant", "content": "done"}])
    await client.append(older, [user("second request")])
    assert {s.session_id: s for s in (await client.list_sessions()).sessions}[older].turns == 2


async def test_append_anthropic_makes_tool_nodes_and_results(client: CompactdClient) -> None:
    sid = await new_session(client, "m-anthropic", [])
    first = await client.append(
        sid,
        [
            user("check the build"),
            assistant("two things", tool_use("a1", "Bash", command="make"), tool_use("a2", "Grep")),
            tool_results(("a1", "build ok")),
            tool_results(("a2", "no match"), is_error=True),
            assistant("the build is fine"),
        ],
    )
    view = await client.get(sid)
    nodes = view["nodes"]
    assert [n["kind"] for n in nodes] == ["user", "assistant", "assistant"]
    assert node_ids(nodes) == [first.node_ids[0], first.node_ids[1], first.head]
    calls = nodes[1]["calls"]
    assert [(c["tool_use_id"], c["name"], c["result"], c["isError"]) for c in calls] == [
        ("a1", "Bash", "build ok", False),
        ("a2", "Grep", "no match", True),
    ]
    request = (await client.render(sid)).request
    check_anthropic_pairing(request)
    results = [b for m in request["messages"] for b in m["content"] if b["type"] == "tool_result"]
    assert [(b["tool_use_id"], b.get("is_error", False)) for b in results] == [
        ("a1", False),
        ("a2", True),
    ]


async def test_append_openai_renders_in_both_formats(client: CompactdClient) -> None:
    sid = await new_session(client, "m-openai", [])
    appended = await client.append(sid, openai_turn("o1"), format="openai")
    assert len(appended.node_ids) == 4  # user, assistant, its tool call, the closing assistant
    openai = (await client.render(sid, format="openai")).request
    check_openai_pairing(openai)
    roles = [m["role"] for m in openai["messages"]]
    assert roles == ["user", "assistant", "tool", "assistant"]
    assert openai["messages"][1]["tool_calls"][0]["id"] == "call_o1"
    assert openai["messages"][2]["tool_call_id"] == "call_o1"
    anthropic = (await client.render(sid, format="anthropic")).request
    check_anthropic_pairing(anthropic)
    uses = [b for m in anthropic["messages"] for b in m["content"] if b["type"] == "tool_use"]
    assert [(u["id"], u["name"], u["input"]) for u in uses] == [
        ("call_o1", "shell", {"cmd": "ls -la"})
    ]


async def test_append_raw_nodes_keeps_given_ids(client: CompactdClient) -> None:
    sid = await new_session(client, "m-raw", [])
    appended = await client.append(
        sid,
        nodes=[
            {"kind": "user", "id": "q1", "content": "where is the config?"},
            {"kind": "assistant", "id": "a1", "content": [{"type": "text", "text": "searching"}]},
            {
                "kind": "tool",
                "tool_use_id": "raw-1",
                "name": "Grep",
                "input": {"pattern": "config"},
                "result": "conf/app.toml",
            },
            {"kind": "assistant", "id": "a2", "content": "in conf/app.toml"},
        ],
    )
    assert appended.head == "a2"
    assert appended.node_ids[:2] == ["q1", "a1"] and appended.node_ids[-1] == "a2"
    one = await client.get(sid, node_id="a1")
    assert one["node"]["id"] == "a1"
    (tool,) = one["children"]
    assert (tool["tool_use_id"], tool["result"]) == ("raw-1", "conf/app.toml")
    assert "conf/app.toml" in all_text((await client.render(sid)).request)


async def test_expected_head_guards_the_thread(client: CompactdClient, data_dir: Path) -> None:
    sid = await new_session(client, "m-head", [])
    first = await client.append(sid, [user("one")], expected_head=None)  # an empty thread
    second = await client.append(sid, [assistant("two")], expected_head=first.head)
    before = log_bytes(data_dir, sid)
    with pytest.raises(RpcError) as caught:
        await client.append(sid, [user("three")], expected_head=first.head)
    assert caught.value.code == 4030 and caught.value.kind == "head_conflict"
    assert second.head in json.dumps(caught.value.data)  # says where the head really is
    with pytest.raises(RpcError) as empty:
        await client.append(sid, [user("three")], expected_head=None)
    assert empty.value.code == 4030
    assert log_bytes(data_dir, sid) == before


async def test_tool_result_answers_a_pending_call(client: CompactdClient) -> None:
    sid = await new_session(
        client, "m-pending", [user("run it"), assistant("running", tool_use("p1", "Bash"))]
    )
    with pytest.raises(RpcError) as caught:
        await client.render(sid)
    assert caught.value.code == 4020
    assert caught.value.data["pendingToolUseIds"] == ["p1"]
    head = (await client.get(sid))["head"]
    answered = await client.tool_result(sid, "p1", [{"type": "text", "text": "exit 0"}])
    assert answered.head == head  # a result hangs off its call; the thread does not move
    request = (await client.render(sid)).request
    check_anthropic_pairing(request)
    assert "exit 0" in all_text(request)


async def test_branch_and_checkout(client: CompactdClient) -> None:
    sid = await new_session(client, "m-branch", [user("start"), assistant("base answer")])
    base = (await client.get(sid))["head"]
    await client.append(sid, [user("main only")])
    forked = await client.branch(sid, "alt", from_node=base)
    assert forked == t.BranchResult("alt", base)
    on_alt = await client.append(sid, [user("alt only")], branch="alt")
    alt = all_text((await client.render(sid, branch="alt")).request)
    main = all_text((await client.render(sid)).request)
    assert "alt only" in alt and "main only" not in alt
    assert "main only" in main and "alt only" not in main
    assert (await client.checkout(sid, "alt")) == t.BranchResult("alt", on_alt.head)
    view = await client.get(sid)
    assert view["currentBranch"] == "alt" and view["branches"]["alt"] == on_alt.head
    assert "alt only" in all_text((await client.render(sid)).request)  # the checked-out branch
    main_view = await client.get(sid, branch="main")
    assert main_view["head"] != on_alt.head
    assert (await client.checkout(sid, "main")).branch == "main"


async def test_import_a_real_transcript(client: CompactdClient) -> None:
    imported = await client.import_transcript(str(TRANSCRIPT))
    assert len(imported.session_ids) == 1
    (sid,) = imported.session_ids
    listed = [s.session_id for s in (await client.list_sessions()).sessions]
    assert sid in listed
    view = await client.get(sid)
    assert sum(len(n.get("calls", [])) for n in view["nodes"]) == TRANSCRIPT_CALLS
    rendered = await client.render(sid)
    check_anthropic_pairing(rendered.request)
    uses = [
        b for m in rendered.request["messages"] for b in m["content"] if b["type"] == "tool_use"
    ]
    assert len(uses) == TRANSCRIPT_CALLS
    check_measure(rendered.tokens)
    check_openai_pairing((await client.render(sid, format="openai")).request)


async def test_function_internals_stay_in_the_graph(client: CompactdClient) -> None:
    sid = await new_session(
        client, "m-func", [user("delegate"), assistant("asking a helper", tool_use("t-f", "Task"))]
    )
    fid = (
        await client.function_start(sid, "Task", {"prompt": "dig"}, tool_use_id="t-f")
    ).function_id
    inside = await client.append(
        sid, [user("dig into the logs"), assistant("found the bug in parse()")], function_id=fid
    )
    running_view = all_text((await client.render(sid)).request)
    assert RUNNING_FUNCTION_PLACEHOLDER in running_view
    assert "dig into the logs" in all_text((await client.render(sid, viewer=fid)).request)
    await client.function_complete(sid, fid, "the bug is in parse()")
    request = (await client.render(sid)).request
    check_anthropic_pairing(request)
    seen = all_text(request)
    assert "the bug is in parse()" in seen  # its output, as the call's result
    assert "dig into the logs" not in seen and "found the bug" not in seen  # not its internals
    one = await client.get(sid, node_id=fid)
    assert one["node"]["status"] == "completed"
    assert one["node"]["output"] == "the bug is in parse()"
    assert node_ids(one["children"]) == inside.node_ids
    assert one["children"][0]["content"][0]["text"] == "dig into the logs"


# ---- rendering and the cascade ---------------------------------------------------------------


async def test_render_with_and_without_cascade(client: CompactdClient) -> None:
    # the target at the threshold: a clear that gets under it is all the cascade does here
    # the five newest kept whatever they cost (their share of the limit is another test's)
    keep_five = {**HEADROOM_OFF, "microcompactKeepRecentShare": 1.0}
    sid = await new_session(client, "m-cascade", tool_turns("r", 8, 2000), keep_five)
    full = (await client.measure(sid)).total
    # over its limit: the clear is needed (one that only bought headroom would have to pay)
    window = {"window": full + 300, "max_output_tokens": 500}
    plain = await client.render(sid, **window)
    assert plain.events == [] and plain.tokens.total == full  # no cascade: nothing changes
    assert records(await client.get(sid), "clear") == []
    for fmt, check in (("anthropic", check_anthropic_pairing), ("openai", check_openai_pairing)):
        rendered = await client.render(sid, cascade=True, format=fmt, **window)
        check(rendered.request)
        check_measure(rendered.tokens)
        assert rendered.tokens.total <= rendered.tokens.limit
        # Anthropic: the provider clears (the edit and its beta header are sent, the
        # messages are unchanged); OpenAI: the same three calls cleared client-side
        seen = server_view(rendered.request)
        assert all_text(seen).count(CLEARED_PLACEHOLDER) == 3  # 8 reads, 5 kept
        server = fmt == "anthropic"
        assert (CLEARED_PLACEHOLDER in all_text(rendered.request)) is not server
        assert bool(rendered.headers) is server
        assert (rendered.tokens.cleared_by_provider > 0) is server
    view = await client.get(sid)
    (clear,) = records(view, "clear")  # written once; the second render reused it
    cleared = clear["covers"][0]
    one = await client.get(sid, node_id=cleared)
    assert one["node"]["result"] == filler("r-0", 2000)  # the original is kept in the graph


async def test_cascade_events_name_the_tier(client: CompactdClient) -> None:
    sid = await new_session(client, "m-events", tool_turns("e", 8, 2000), HEADROOM_OFF)
    full = (await client.measure(sid)).total
    heard: list[dict[str, Any]] = []
    client.on_notification("context/compacted", heard.append)
    rendered = await client.render(sid, cascade=True, window=full + 600, max_output_tokens=500)
    # the notification came before the response, and says what the render's events say
    (note,) = [n for n in heard if n["sessionId"] == sid]
    (event,) = [e for e in rendered.events if e.applied]
    assert note == {"sessionId": sid, **unstructure(event)}
    assert event.tier == "microcompact"
    assert event.details["trigger"] == "forced"
    assert event.tokens_before == full > event.tokens_after == rendered.tokens.total
    assert event.record_ids == [records(await client.get(sid), "clear")[0]["id"]]


async def test_a_dry_run_previews_the_cascade_and_writes_nothing(
    client: CompactdClient, data_dir: Path
) -> None:
    """`dryRun`: the tiers' changes are rendered and reported, nothing is written (no record,
    no activity, no notification), a reported overflow is left for the next render — and the
    preview is the very request the cascade then sends."""
    sid = await new_session(client, "m-dry-run", tool_turns("p", 8, 2000, "Deploy"))
    full = (await client.measure(sid)).total
    window = {"window": full // 2, "max_output_tokens": 500}
    estimate = (await client.render(sid, **window)).tokens.estimate
    message = f"prompt is too long: {estimate + 1000} tokens > {estimate} maximum"
    await client.report_usage(sid, MODEL, error={"status": 400, "message": message})
    heard: list[dict[str, Any]] = []
    client.on_notification("context/compacted", heard.append)
    before, view = log_bytes(data_dir, sid), await client.get(sid)
    previews = [await client.render(sid, cascade=True, dry_run=True, **window) for _ in "ab"]
    preview = previews[0]
    applied = [e.tier for e in preview.events if e.applied]
    # Tier 5 first, then the tiers it leaves over the threshold for
    assert applied[0] == "reactive" and len(applied) > 1, preview.events
    assert all(e.record_ids == [] for e in preview.events)
    assert preview.tokens.total < full // 2 - 500
    check_anthropic_pairing(preview.request)
    assert log_bytes(data_dir, sid) == before and await client.get(sid) == view
    assert [n for n in heard if n["sessionId"] == sid] == []
    assert previews[1].request == preview.request  # nothing moved: the same preview again
    done = await client.render(sid, cascade=True, **window)  # the overflow is still reported
    assert [e.tier for e in done.events if e.applied] == applied
    assert done.request == preview.request and done.tokens.total == preview.tokens.total
    assert log_bytes(data_dir, sid) != before


async def test_measure_categories_add_up(client: CompactdClient) -> None:
    sid = await new_session(client, "m-measure", tool_turns("m", 3, 800))
    budget: dict[str, Any] = {
        "system": "You are a careful coding agent.",
        "tools": [
            {
                "name": "Read",
                "description": "read a file",
                "input_schema": {"type": "object", "properties": {"path": {"type": "string"}}},
            }
        ],
        "window": 50_000,
        "max_output_tokens": 4_000,
    }
    measured = await client.measure(sid, **budget)
    assert measured.window == 50_000 and measured.output_reserve == 4_000
    assert measured.limit == 46_000
    cats = measured.categories
    assert cats["system"] > 0 and cats["tools"] > 0 and cats["tool_results"] > 0
    check_measure(measured)
    assert measured.free == cats["free"]
    rendered = await client.render(sid, **budget)
    assert rendered.tokens.total == measured.total  # the panel and the request agree
    assert rendered.tokens.categories == cats
    assert measured.turns == measured.turns_shown == 3


async def test_compact_with_the_digest_provider(client: CompactdClient) -> None:
    sid = await new_session(client, "m-compact", tool_turns("c", 6, 1500, "Deploy"))
    result = await client.compact(sid, "keep the deploy targets")
    assert result.applied is True and result.provider == "digest"
    assert result.tokens_after < result.tokens_before
    assert result.covered_turns >= 1
    (summary,) = records(await client.get(sid), "summary")
    assert summary["data"]["instructions"] == "keep the deploy targets"
    request = (await client.render(sid)).request
    check_anthropic_pairing(request)
    seen = all_text(request)
    assert "task c-0" in seen  # the digest keeps every user request verbatim …
    assert filler("c-0", 1500)[:200] not in seen  # … while the old results are gone
    assert (await client.measure(sid)).total == result.tokens_after


async def test_snip_removes_whole_old_turns(client: CompactdClient) -> None:
    sid = await new_session(client, "m-snip", tool_turns("s", 6, 1500, "Deploy"))
    before = await client.measure(sid)
    result = await client.snip(sid, target_tokens=before.total // 2)
    assert result.applied is True and result.removed_turns >= 1
    assert result.tokens_before == before.total
    assert result.tokens_after <= before.total // 2
    (snip,) = records(await client.get(sid), "snip")
    assert len(snip["data"]["turns"]) == result.removed_turns
    after = await client.measure(sid)
    assert after.total == result.tokens_after
    assert after.turns_shown == before.turns_shown - result.removed_turns
    seen = all_text((await client.render(sid)).request)
    assert "task s-0" in seen  # the first user turn is protected …
    for turn in snip["data"]["turns"]:  # … the snipped turns are gone, with their requests
        request = (await client.get(sid, node_id=turn))["node"]["content"][0]["text"]
        assert request.startswith("task s-") and request not in seen
    none = await client.snip(sid, target_tokens=10 * before.total)
    assert none.applied is False and none.removed_turns == 0
    assert records(await client.get(sid), "snip") == [snip], "nothing written when not applied"


async def test_collapse_then_uncollapse(client: CompactdClient) -> None:
    sid = "m-collapse"
    await client.open_session(sid, config={"snipEnabled": False})
    await client.append(sid, tool_turns("k", 12, 1500, "Deploy"))
    full = (await client.measure(sid)).total
    rendered = await client.render(
        sid, cascade=True, window=int(full / 0.93) + 500, max_output_tokens=500
    )
    (collapse,) = [e for e in rendered.events if e.applied]
    assert collapse.tier == "collapse"
    collapse_id = collapse.record_ids[0]
    collapsed = await client.measure(sid)
    assert collapsed.total < full
    undone = await client.uncollapse(sid, collapse_id)
    assert undone.applied is True and undone.record_id
    assert (await client.measure(sid)).total == full  # the originals show again
    assert (await client.uncollapse(sid, collapse_id)) == t.UncollapseResult(False, None)
    with pytest.raises(RpcError) as caught:
        await client.uncollapse(sid, undone.record_id)  # not a collapse record
    assert caught.value.code == 4012


async def test_reported_usage_calibrates_the_next_measure(client: CompactdClient) -> None:
    sid = await new_session(client, "m-usage", tool_turns("u", 2, 400))
    rendered = await client.render(sid, model=MODEL)
    estimate = rendered.tokens.estimate
    assert rendered.tokens.calibration == prior_ratio(MODEL) > 1  # Claude's, before a report
    report = await client.report_usage(
        sid,
        MODEL,
        usage={"input_tokens": 10, "cache_read_input_tokens": 2 * estimate - 10},
    )
    assert report.reported_tokens == 2 * estimate and report.estimated_tokens == estimate
    assert report.calibration == pytest.approx(2.0)
    assert report.overflow is False
    measured = await client.measure(sid, model=MODEL)
    assert measured.total == pytest.approx(2 * estimate, abs=12)  # rounded per category
    check_measure(measured)
    other = await client.measure(sid, model="gpt-4o")
    assert other.total == estimate  # calibration is per model


async def test_prompt_too_long_runs_tier_5_on_the_next_render(client: CompactdClient) -> None:
    sid = await new_session(client, "m-overflow", tool_turns("o", 6, 1500, "Deploy"))
    estimate = (await client.render(sid, model=MODEL)).tokens.estimate
    reported, maximum = 2 * estimate, int(1.2 * estimate)
    report = await client.report_usage(
        sid,
        MODEL,
        error=t.ProviderError(400, f"prompt is too long: {reported} tokens > {maximum} maximum"),
    )
    assert report.overflow is True and report.limit_tokens == maximum
    # a plain render (no `cascade`): resending the same request would only fail again
    rendered = await client.render(sid, model=MODEL)
    tiers = [e.tier for e in rendered.events if e.applied]
    assert tiers[0] == "reactive" and len(tiers) > 1
    assert rendered.tokens.calibration == pytest.approx(reported / estimate)
    assert rendered.tokens.total < maximum
    check_anthropic_pairing(rendered.request)
    (reactive,) = records(await client.get(sid), "reactive")
    assert reactive["data"]["limit"] == maximum
    # taken once: the render after that is an ordinary one
    assert (await client.render(sid, model=MODEL)).events == []


async def test_plain_dicts_work_wherever_a_wire_type_does(client: CompactdClient) -> None:
    """`report_usage(error={...})` is what a user writes with a provider's JSON error at hand;
    a wrong type fails in the client, naming the field, before anything is sent."""
    sid = await new_session(client, "m-dicts", tool_turns("d", 6, 1500, "Deploy"))
    estimate = (await client.render(sid, model=MODEL)).tokens.estimate
    message = f"prompt is too long: {2 * estimate} tokens > {int(1.2 * estimate)} maximum"
    report = await client.report_usage(sid, MODEL, error={"status": 400, "message": message})
    assert isinstance(report, t.ReportUsageResult) and report.overflow is True
    rendered = await client.render(sid, model=MODEL, system="You are terse.")
    assert isinstance(rendered.tokens, t.RenderTokens)
    assert all(isinstance(e, t.CompactionEvent) for e in rendered.events) and rendered.events
    with pytest.raises(ParamsError) as caught:
        await client.render(sid, window="big")  # type: ignore[arg-type]
    assert "params.window" in str(caught.value)


async def test_tier_5_runs_once_per_turn(client: CompactdClient, data_dir: Path) -> None:
    sid = await new_session(client, "m-overflow-twice", tool_turns("w", 4, 1500, "Deploy"))
    estimate = (await client.render(sid, model=MODEL)).tokens.total
    error = t.ProviderError(400, f"prompt is too long: {2 * estimate} tokens > {estimate} maximum")
    await client.report_usage(sid, MODEL, error=error)
    first = await client.render(sid, model=MODEL, cascade=True)
    assert first.events[0].tier == "reactive"
    before = log_bytes(data_dir, sid)
    await client.report_usage(sid, MODEL, error=error)
    with pytest.raises(RpcError) as caught:
        await client.render(sid, model=MODEL, cascade=True)
    assert caught.value.code == 4040 and caught.value.kind == "cannot_fit"
    assert log_bytes(data_dir, sid) == before


@pytest.mark.files_only
async def test_status_reports_the_daemon(client: CompactdClient, data_dir: Path) -> None:
    await client.open_session("m-status")
    status = await client.status()
    assert status.data_dir == str(data_dir)
    assert status.summary_provider == "digest"
    assert "m-status" in status.loaded_sessions
    assert status.version
    assert status.idle_seconds == 90 * 60  # the spec's default threshold, in force here
