"""Recall through the real daemon: every marker names a handle, and
`context/recall` with that handle gives back what the marker stands for."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
from compactd.clients.client import CompactdClient, RpcError
from compactd.context.policy import CLEARED_PLACEHOLDER

from tests.support.invariants import (
    check_anthropic_pairing,
    check_openai_pairing,
    strip_cache_control,
)

from .conftest import running
from .convo import all_text, assistant, filler, results_of, tool_results, tool_turns, tool_use, user
from .wire import log_bytes

pytestmark = pytest.mark.asyncio(loop_scope="module")

HANDLE = re.compile(r"recall:[A-Za-z0-9_.-]+")
CUT = re.compile(r"\(lines (\d+)–(\d+) of (\d+) omitted\) truncated by compactd; compactd_recall")
BIG = 20_000


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("recall") / "data"


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def client(data_dir: Path) -> AsyncIterator[CompactdClient]:
    async with running(data_dir, "--summary-provider", "digest") as c:
        yield c


def numbered(tag: str, lines: int) -> str:
    """A file of `lines` lines, each naming its number (so a line shows where it came from)."""
    return "".join(f"{tag} line {i}: def f{i}(x): return x + {i}\n" for i in range(1, lines + 1))


async def read_all(client: CompactdClient, sid: str, handle: str, start: int, end: int) -> str:
    """Lines `start..end` of a handle, page by page (each page is bounded)."""
    pages = []
    while start <= end:
        got = await client.recall(sid, handle, start, end)
        assert got.start_line == start and got.end_line <= end
        assert len(got.text) <= 3800  # recallMaxChars
        pages.append(got.text)
        if not got.truncated:
            assert got.end_line == end
            break
        start = got.end_line + 1
    return "\n".join(pages)


def said(request: dict[str, Any]) -> str:
    """Every string of a request's messages (not its tool definitions)."""
    return all_text({"messages": request["messages"]})


def lines_of(text: str, start: int, end: int) -> str:
    return "\n".join(text.split("\n")[start - 1 : end])


async def test_a_cut_result_names_a_handle_that_returns_the_cut_lines(
    client: CompactdClient, data_dir: Path
) -> None:
    sid = "r-cut"
    original = numbered("big", 500)
    assert len(original) > BIG
    await client.open_session(sid)
    await client.append(
        sid,
        [
            user("read the big file"),
            assistant("reading", tool_use("t1", "Read", file_path="big.py")),
            tool_results(("t1", original)),
            assistant("read it"),
        ],
    )
    plain = await client.render(sid)
    assert "recall:" not in all_text(plain.request) and "tools" not in plain.request
    rendered = await client.render(sid, recall=True)
    check_anthropic_pairing(rendered.request)
    assert [t["name"] for t in rendered.request["tools"]] == ["compactd_recall"]
    (content,) = results_of(rendered.request)
    assert len(content) < 4200
    (handle,) = HANDLE.findall(content)
    first, last, total = (int(g) for g in CUT.search(content).groups())  # type: ignore[union-attr]
    assert total == 500 and 1 < first < last < total
    assert "big line 250:" not in content  # the middle is cut …
    recalled = await read_all(client, sid, handle, first, last)
    assert recalled == lines_of(original, first, last)  # … and comes back, every line
    assert "big line 250: def f250(x)" in recalled
    # no lines: from the first line the cut left out (the model has those before it), a page
    whole = await client.recall(sid, handle)
    assert whole.start_line == first and whole.total_lines == 500 and whole.truncated is True
    assert whole.text.startswith(lines_of(original, first, first))
    # the same handle on every render (the cached prefix stays byte-stable)
    again = await client.render(sid, recall=True)
    assert again.request == rendered.request
    measured = await client.measure(sid, recall=True)
    assert measured.total == rendered.tokens.total
    openai = await client.render(sid, recall=True, format="openai")
    check_openai_pairing(openai.request)
    assert [t["function"]["name"] for t in openai.request["tools"]] == ["compactd_recall"]
    assert handle in said(openai.request)


async def test_the_session_config_turns_recall_on(client: CompactdClient) -> None:
    sid = "r-config"
    await client.open_session(sid, config={"recall": True, "recallMaxChars": 500})
    await client.append(
        sid,
        [
            user("read"),
            assistant("reading", tool_use("c1", "Read", file_path="c.py")),
            tool_results(("c1", numbered("cfg", 400))),
        ],
    )
    rendered = await client.render(sid)
    (handle,) = HANDLE.findall(said(rendered.request))
    got = await client.recall(sid, handle, 10, 300)
    assert got.truncated is True and len(got.text) <= 500
    assert got.text.startswith("cfg line 10:")
    assert "recall:" not in said((await client.render(sid, recall=False)).request)
    for bad in ({"recall": "yes"}, {"recallMaxChars": "many"}):
        with pytest.raises(RpcError) as caught:
            await client.open_session("r-config-bad", config=bad)
        assert caught.value.kind == "invalid_config"


async def test_a_result_cleared_by_tier_1_comes_back(client: CompactdClient) -> None:
    """The time path (the issue's subject: on the server path the provider writes its own
    placeholder, which compactd does not render)."""
    sid = "r-clear"
    config = {"cascadeTarget": 0.85, "recall": True, "microcompactMode": "time"}
    config["microcompactKeepRecentShare"] = 1.0  # the five newest kept, whatever they cost
    await client.open_session(sid, config=config)
    await client.append(sid, tool_turns("cl", 8, 2000))
    full = (await client.measure(sid)).total
    # over its limit: the clear is forced (one that only bought headroom would have to pay)
    rendered = await client.render(sid, cascade=True, window=full + 300, max_output_tokens=500)
    assert [e.tier for e in rendered.events if e.applied] == ["microcompact"]
    cleared = [c for c in results_of(rendered.request) if "cleared by compactd" in c]
    assert len(cleared) == 3 and CLEARED_PLACEHOLDER not in said(rendered.request)
    assert all(c.endswith("or searches them.]") for c in cleared)
    (handle,) = HANDLE.findall(cleared[0])
    got = await client.recall(sid, handle)
    assert got.text == filler("cl-0", 2000).rstrip("\n") and got.truncated is False
    openai = await client.render(sid, format="openai", window=full + 300, max_output_tokens=500)
    assert handle in said(openai.request)


async def test_snipped_turns_name_their_results(client: CompactdClient) -> None:
    sid = "r-snip"
    await client.open_session(sid, config={"recall": True})
    await client.append(sid, tool_turns("sn", 6, 1500, "Deploy"))
    before = await client.measure(sid)
    snipped = await client.snip(sid, target_tokens=before.total // 2)
    assert snipped.applied is True
    text = said((await client.render(sid)).request)
    transcript, *handles = HANDLE.findall(text[text.index("removed here") :])
    assert ".from." in transcript and len(handles) == snipped.removed_turns
    assert "Deploy src/sn_1.py" in text and filler("sn-1", 1500)[:100] not in text
    got = await client.recall(sid, handles[0])
    assert got.text == filler("sn-1", 1500).rstrip("\n")


async def test_a_summarized_range_names_its_results(client: CompactdClient) -> None:
    sid = "r-summary"
    await client.open_session(sid, config={"recall": True})
    await client.append(sid, tool_turns("su", 6, 1500, "Deploy"))
    assert (await client.compact(sid)).applied is True
    request = (await client.render(sid)).request
    check_anthropic_pairing(request)
    text = said(request)
    assert filler("su-0", 1500)[:200] not in text
    start = text.index("returns the messages of these turns verbatim, from the first on")
    handles = HANDLE.findall(text[start:])
    assert handles
    got = await client.recall(sid, handles[0])
    assert got.text == filler("su-0", 1500).rstrip("\n")


async def test_one_search_of_a_summarized_range_finds_a_line_in_its_results(
    client: CompactdClient, data_dir: Path
) -> None:
    """A name the agent read in a result the summary replaced is one call away: a search of
    the range's transcript handle looks in the transcript and in every result it names, and
    shows each match under the handle that pages it, with that handle's line number."""
    sid = "r-range-search"
    await client.open_session(sid, config={"recall": True})
    await client.append(sid, tool_turns("rs", 6, 1500, "Deploy"))
    assert (await client.compact(sid)).applied is True
    text = said((await client.render(sid)).request)
    assert "rs-3 def handler(request): return request.body  # line 7" not in text
    (transcript,) = [h for h in HANDLE.findall(text) if ".from." in h]
    pages = {h: (await client.recall(sid, h)).text for h in HANDLE.findall(text)}
    (result,) = [h for h, page in pages.items() if page.startswith("rs-3 ")]
    before = log_bytes(data_dir, sid)
    wanted = "rs-3 def handler(request): return request.body  # line 7"
    got = await client.recall(sid, transcript, search=wanted, context=0)
    assert got.matches == 1 and got.truncated is False
    lines = got.text.split("\n")
    assert lines[1] == f"── {result} ──"
    number, line = re.fullmatch(r"(\d+):(.*)", lines[2]).groups()
    assert line == wanted
    # the number is the result's own: a page of that handle from it starts with that line
    assert (await client.recall(sid, result, int(number))).text.startswith(line)
    # a search that matches the transcript and several results names each by its handle
    many = await client.recall(sid, transcript, search=r"rs-[0-5] def", regex=True, context=0)
    assert many.matches >= 6 and len({h for h in HANDLE.findall(many.text)}) >= 6
    none = await client.recall(sid, transcript, search="not in any of them")
    assert none.matches == 0 and "no line matches" in none.text
    # bounded: with a small page what does not fit is named by handle, to be searched there
    await client.open_session("r-range-small", config={"recall": True, "recallMaxChars": 600})
    await client.append("r-range-small", tool_turns("rt", 6, 1500, "Deploy"))
    assert (await client.compact("r-range-small")).applied is True
    small = said((await client.render("r-range-small")).request)
    (small_transcript,) = [h for h in HANDLE.findall(small) if ".from." in h]
    cut = await client.recall("r-range-small", small_transcript, search="def handler")
    assert len(cut.text) <= 600 and cut.text.endswith("; search those handles]")
    assert log_bytes(data_dir, sid) == before  # a recall writes nothing


async def test_unknown_and_foreign_handles_are_errors_that_write_nothing(
    client: CompactdClient, data_dir: Path
) -> None:
    await client.open_session("r-mine")
    await client.append(
        "r-mine",
        [
            user("read"),
            assistant("reading", tool_use("m1", "Read")),
            tool_results(("m1", numbered("mine", 400))),
        ],
    )
    (theirs,) = HANDLE.findall(said((await client.render("r-cut", recall=True)).request))
    before = log_bytes(data_dir, "r-mine")  # the file, or the events in the database
    for bad in ("recall:n999.0a1b2c3d", "recall:nope", "n1", theirs):
        with pytest.raises(RpcError) as caught:
            await client.recall("r-mine", bad)
        assert caught.value.code == 4007 and caught.value.kind == "unknown_handle", bad
    (mine,) = HANDLE.findall(said((await client.render("r-mine", recall=True)).request))
    with pytest.raises(RpcError) as caught:
        await client.recall("r-mine", mine, 401)
    assert caught.value.kind == "invalid_content"
    answer = await client.answer_recall(
        "r-mine", {"id": "x", "name": "compactd_recall", "input": {"handle": theirs}}
    )
    assert answer["is_error"] is True and "does not belong" in answer["content"]
    assert log_bytes(data_dir, "r-mine") == before  # a refusal writes nothing


async def test_a_handle_from_another_branch_is_refused(client: CompactdClient) -> None:
    sid = "r-branch"
    await client.open_session(sid)
    head = await client.append(sid, [user("start"), assistant("ok")])
    await client.append(
        sid,
        [
            user("read"),
            assistant("reading", tool_use("b1", "Read")),
            tool_results(("b1", numbered("branch", 400))),
        ],
    )
    (handle,) = HANDLE.findall(said((await client.render(sid, recall=True)).request))
    await client.branch(sid, "other", head.head)
    await client.checkout(sid, "other")
    with pytest.raises(RpcError) as caught:
        await client.recall(sid, handle)
    assert caught.value.kind == "unknown_handle"
    assert (await client.recall(sid, handle, branch="main")).total_lines == 400


async def test_an_agent_loop_recalls_the_cut_lines(client: CompactdClient) -> None:
    """A scripted model reads a big file, sees the cut, recalls the lines it needs; the next
    request holds them and everything before is the previous request, unchanged."""
    sid = "r-loop"
    await client.open_session(sid)
    await client.append(sid, [user("find f250 in big.py and tell me what it returns")])
    big = numbered("loop", 400)
    requests: list[dict[str, Any]] = []
    for step in range(4):
        out = await client.render(sid, recall=True, cascade=True, system="agent")
        requests.append(out.request)
        last = out.request["messages"][-1]
        if step == 0:
            reply = assistant("reading", tool_use("l1", "Read", file_path="big.py"))
        elif step == 1:  # the model reads the marker and asks for the lines it lacks
            content = results_of(out.request)[-1]
            (handle,) = HANDLE.findall(content)
            reply = assistant(
                "recalling",
                tool_use("l2", "compactd_recall", handle=handle, startLine=248, endLine=252),
            )
        elif step == 2:
            assert "loop line 250: def f250(x): return x + 250" in all_text(last)
            reply = assistant("f250 returns x + 250")
        else:
            break
        await client.append(sid, [reply])
        for block in reply["content"]:
            if block.get("type") != "tool_use":
                continue
            if block["name"] == "compactd_recall":
                answer = await client.answer_recall(sid, block)
                assert "is_error" not in answer
                await client.append(sid, [{"role": "user", "content": [answer]}])
            else:
                await client.append(sid, [tool_results((block["id"], big))])
    before, after = (strip_cache_control(r) for r in requests[1:3])
    assert after["messages"][: len(before["messages"])] == before["messages"]
    assert after["tools"] == before["tools"] and after["system"] == before["system"]
    assert "loop line 250:" not in said(before)


async def test_a_search_finds_the_line_in_one_call_and_a_bad_one_writes_nothing(
    client: CompactdClient, data_dir: Path
) -> None:
    """The model that needs one identifier from a 60,000-character result asks for it by
    name: one call, its line and number, a line of context either side — through the RPC and
    through the client's helper, as the tool's input says. A search RE2 will not run is
    4016, a foreign handle 4007; the helper turns both into an error the model reads."""
    sid = "r-search"
    original = numbered("find", 1500)
    assert len(original) > 60_000
    await client.open_session(sid)
    await client.append(
        sid,
        [
            user("read it"),
            assistant("reading", tool_use("s1", "Read", file_path="find.py")),
            tool_results(("s1", original)),
        ],
    )
    rendered = await client.render(sid, recall=True)
    (content,) = results_of(rendered.request)
    assert "or with search the lines that match" in content
    assert "def f1234(" not in content
    (handle,) = HANDLE.findall(content)
    got = await client.recall(sid, handle, search="def f1234(")
    assert got.matches == 1 and got.truncated is False and len(got.text) <= 3800
    assert "\n1234:find line 1234: def f1234(x): return x + 1234" in got.text
    assert "\n1233-find line 1233:" in got.text and "\n1235-find line 1235:" in got.text
    tool = {
        "id": "s2",
        "name": "compactd_recall",
        "input": {"handle": handle, "search": r"def f120\d\(", "regex": True, "context": 0},
    }
    answer = await client.answer_recall(sid, tool)
    assert "is_error" not in answer and answer["content"].count("\n") == 10  # f1200–f1209
    many = await client.recall(sid, handle, search="def f1", context=0)  # a page cannot hold all
    assert many.truncated and many.matches == 612 and len(many.text) <= 3800
    rest = await client.recall(sid, handle, many.end_line + 1, search="def f1", context=0)
    assert rest.text.split("\n")[1].startswith(f"{many.end_line + 1}:")
    before = log_bytes(data_dir, sid)
    with pytest.raises(RpcError) as caught:
        await client.recall(sid, handle, search="(a)\\1", regex=True)
    assert caught.value.code == 4016 and caught.value.kind == "invalid_search"
    (theirs,) = HANDLE.findall(said((await client.render("r-cut", recall=True)).request))
    with pytest.raises(RpcError) as caught:
        await client.recall(sid, theirs, search="line")
    assert caught.value.code == 4007
    for bad, said_why in (
        ({"search": "foo(?=bar)", "regex": True}, "lookaround"),
        ({"search": "x", "context": 40}, "context must be between 0 and 5"),
    ):
        answer = await client.answer_recall(
            sid, {"id": "s3", "name": "compactd_recall", "input": {"handle": handle, **bad}}
        )
        assert answer["is_error"] is True and said_why in answer["content"]
    assert log_bytes(data_dir, sid) == before  # a refusal writes nothing
