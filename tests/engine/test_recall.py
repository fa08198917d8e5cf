"""Recall in the engine: on the shared transcripts a render with `recall` differs from one
without only by its handles and the tool, every handle shown gives back what its note says was
left out, and the line arithmetic behind "lines a–b of n omitted" holds at the edges."""

from __future__ import annotations

import re
import tempfile
from pathlib import Path
from typing import Any

import orjson
import pytest
from compactd.context.budget_reduction import omitted_lines, truncate_result
from compactd.context.engine import Engine
from compactd.context.errors import InvalidContent, UnknownHandle
from compactd.context.policy import CLEARED_PLACEHOLDER
from compactd.context.recall import (
    LINE_WIDTH,
    content_text,
    handle_for,
    handles_in,
    line_starts,
    recall,
    resolve,
    shown_content,
)
from compactd.context.stores.files import FileStore

from tests.engine.helpers import (
    FORMATS,
    assistant,
    call,
    check_rendered,
    new_session,
    params,
    result,
    results,
    user,
)

DATA = Path(__file__).resolve().parents[1] / "data" / "transcripts"
TRANSCRIPTS = sorted(
    [
        *(p for p in DATA.glob("*/*") if p.is_file() and p.suffix in (".jsonl", ".traj")),
        *(DATA / "more" / "codex").glob("*.jsonl"),  # the newer Codex rollouts (0.140, 0.142)
    ]
)

CUT_NOTE = re.compile(
    r"\[… ([\d,]+) characters(?: \(lines (\d+)–(\d+) of (\d+) omitted\))? truncated by "
    r"compactd; compactd_recall with handle (recall:[A-Za-z0-9_.-]+) returns them, or with "
    r"search the lines that match …\]"
)
CLEARED_NOTE = re.compile(
    r"\[Old tool result content cleared by compactd; compactd_recall with handle "
    r"recall:[A-Za-z0-9_.-]+ returns its \d+ lines?, or searches them\.\]"
)
RANGE_NOTE = re.compile(
    r"\n\n\[compactd_recall with handle recall:\S+ returns the messages of these turns[^\x00]*$"
)


def without_recall(value: Any) -> Any:
    """A recall render with its notes put back to what they say without recall."""
    if isinstance(value, str):
        value = CUT_NOTE.sub(
            lambda m: f"[… {m.group(1)} characters truncated by compactd …]", value
        )
        value = CLEARED_NOTE.sub(CLEARED_PLACEHOLDER, value)
        return RANGE_NOTE.sub("", value)
    if isinstance(value, list):
        return [without_recall(v) for v in value]
    if isinstance(value, dict):
        return {k: without_recall(v) for k, v in value.items()}
    return value


def drop_tool(request: dict[str, Any]) -> dict[str, Any]:
    out = dict(request)
    tools = [
        t
        for t in out.get("tools", [])
        if "compactd_recall" not in (t.get("name"), (t.get("function") or {}).get("name"))
    ]
    if tools:
        out["tools"] = tools
    else:
        out.pop("tools", None)
    return out


@pytest.fixture
def engine(tmp_path: Path) -> Engine:
    return Engine(FileStore(tmp_path))


@pytest.mark.parametrize("path", TRANSCRIPTS, ids=lambda p: f"{p.parent.name}/{p.name[:24]}")
def test_recall_changes_only_the_notes_on_the_transcripts(path: Path) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        engine = Engine(FileStore(tmp), summary_provider="digest")
        ids = engine.import_file(str(path)).session_ids
        sid = ids[0]
        g = engine.session(sid).graph
        for fmt in FORMATS:
            plain = engine.render(sid, params(fmt))
            assert engine.render(sid, params(fmt, recall=False)).request == plain.request
            assert not handles_in(plain.request) and "compactd_recall" not in str(plain.request)
            with_recall = engine.render(sid, params(fmt, recall=True))
            check_rendered(with_recall, fmt)
            assert orjson.dumps(drop_tool(without_recall(with_recall.request))) == orjson.dumps(
                plain.request
            )
            cuts = list(CUT_NOTE.finditer(handles_text(with_recall.request)))
            for match in cuts:
                check_cut(g, match)
            if path.name.startswith("64da7265"):  # it has results cut on arrival, by lines
                assert len(cuts) > 10 and all(m.group(2) for m in cuts[:10])
        # with records in force: snip half of it away, then the same comparison
        engine.snip(sid, params(), engine.render(sid, params()).total // 2)
        plain = engine.render(sid, params())
        with_recall = engine.render(sid, params(recall=True))
        check_rendered(with_recall, "anthropic")
        assert without_recall(drop_tool(with_recall.request)) == plain.request
        for handle in handles_in(with_recall.request["messages"]):
            assert recall(g, handle, g.branch_path(), 3800).total_lines >= 1


def handles_text(request: dict[str, Any]) -> str:
    return orjson.dumps(request["messages"]).decode("utf-8").replace("\\n", "\n")


def check_cut(g: Any, match: re.Match[str]) -> None:
    """The cut note's numbers are the recall's: its lines hold what the note says was cut."""
    chars, first, last, total, handle = match.groups()
    node, part = resolve(g, handle, g.branch_path())
    assert part == "cut"
    content = shown_content(g, node)
    text = content_text(content)
    got = recall(g, handle, g.branch_path(), 10**9)
    assert got.text == text.rstrip("\n")
    if first is None:
        return
    assert int(total) == got.total_lines
    page = recall(g, handle, g.branch_path(), 10**9, int(first), int(last))
    assert page.end_line == int(last)
    if isinstance(content, str):  # one part: the cut characters are exactly its middle
        middle = content[2400 : len(content) - 1600]
        assert len(middle) == int(chars.replace(",", "")) and middle.rstrip("\n") in page.text


# ---- lines ------------------------------------------------------------------------------------


def test_lines_wrap_long_lines_and_ignore_a_final_newline() -> None:
    assert line_starts("") == [0]
    assert line_starts("a\nb\n") == [0, 2]
    assert line_starts("a\nb") == [0, 2]
    one = "x" * (2 * LINE_WIDTH + 5)
    assert line_starts(one) == [0, LINE_WIDTH, 2 * LINE_WIDTH]
    assert omitted_lines("just one line", 2, 5) is None
    text = "".join(f"{i:03d}\n" for i in range(1, 101))  # 4 characters a line
    assert omitted_lines(text, 8, 20) == (3, 5, 100)  # 8 starts line 3; 19 ends line 5
    assert omitted_lines(text, 9, 21) == (3, 6, 100)  # partly shown lines count as cut


def test_a_cut_result_of_several_blocks_counts_lines_across_them() -> None:
    small = {"type": "text", "text": "a\nb\nc"}
    big = {"type": "text", "text": "".join(f"line {i}\n" for i in range(1, 2001))}
    cut = truncate_result([small, {"type": "image"}, big], 4000, 2400, 1600, "recall:n1.00000000")
    note = CUT_NOTE.search(cut[2]["text"])
    assert note is not None
    first, last, total = int(note.group(2)), int(note.group(3)), int(note.group(4))
    whole = content_text([small, {"type": "image"}, big]).split("\n")
    assert total == len(whole) - 1  # the final newline opens no line
    assert whole[0] == "a" and whole[3].startswith("[image")  # 3 lines, then the image's 1
    text = big["text"]
    # the cut is over the result's text end to end: 2,400 characters in, 5 of them the first
    # block's
    assert first == 4 + text.count("\n", 0, 2400 - 5) + 1  # the line the cut starts in
    assert last == 4 + text.count("\n", 0, len(text) - 1600 - 1) + 1  # … and ends in
    shown = cut[2]["text"]
    assert f"\n{whole[first]}\n" not in shown and f"\n{whole[last - 2]}\n" not in shown
    assert f"\n{whole[first - 2]}\n" in shown and f"\n{whole[last]}\n" in shown


# ---- the engine -------------------------------------------------------------------------------


def session_with_a_big_read(engine: Engine, sid: str, lines: int = 800) -> str:
    new_session(engine, sid)
    big = "".join(f"row {i}\n" for i in range(1, lines + 1))
    engine.append(
        sid,
        messages=[
            user("read it"),
            assistant(call("t1", "Read", file_path="a.py")),
            results(result("t1", big)),
            assistant("done"),
        ],
    )
    return handle_for(sid, engine.session(sid).graph.tool_by_use_id("t1").id)  # type: ignore[union-attr]


def test_pages_are_whole_lines_under_the_limit(engine: Engine) -> None:
    handle = session_with_a_big_read(engine, "pages")
    g = engine.session("pages").graph
    path = g.branch_path()
    first = recall(g, handle, path, 100)
    assert first.text == "\n".join(f"row {i}" for i in range(1, first.end_line + 1))
    assert len(first.text) <= 100 < len(first.text) + len(f"row {first.end_line + 1}\n") + 1
    assert first.truncated and first.total_lines == 800
    nxt = recall(g, handle, path, 100, first.end_line + 1)
    assert nxt.text.startswith(f"row {first.end_line + 1}\n")
    last = recall(g, handle, path, 100, 799, 900)  # an end past the content is clamped
    assert (last.text, last.end_line, last.truncated) == ("row 799\nrow 800", 800, False)
    with pytest.raises(InvalidContent):
        recall(g, handle, path, 100, 801)
    with pytest.raises(InvalidContent):
        recall(g, handle, path, 100, 5, 4)


def test_handles_are_the_sessions_own(engine: Engine) -> None:
    mine = session_with_a_big_read(engine, "mine")
    theirs = session_with_a_big_read(engine, "theirs")
    assert mine != theirs and mine.rpartition(".")[0] == theirs.rpartition(".")[0]
    g = engine.session("mine").graph
    for bad in (theirs, "recall:", "recall:n1", "recall:zz.00000000", "t9", mine + "0"):
        with pytest.raises(UnknownHandle):
            recall(g, bad, g.branch_path(), 100)
    # a call's own tool_use id stands for it (the provider's placeholder names no handle)
    by_id = recall(g, "t1", g.branch_path(), 100)
    assert by_id == recall(g, mine, g.branch_path(), 100)
    # the same bytes from a fresh engine: handles are a pure function of the graph
    shown = engine.render("mine", params(recall=True)).request
    fresh = Engine(engine.store).render("mine", params(recall=True)).request
    cut = handle_for("mine", mine[len("recall:") :].partition(".")[0], "cut")
    assert orjson.dumps(shown) == orjson.dumps(fresh) and handles_in(shown) == {cut}
    assert recall(g, cut, g.branch_path(), 100) == recall(g, mine, g.branch_path(), 100)


def test_a_functions_output_and_a_turn_index_come_back(engine: Engine) -> None:
    sid = new_session(engine, "fn")
    engine.append(sid, messages=[user("go"), assistant(call("t1", "Task", prompt="dig"))])
    session = engine.session(sid)
    fid = session.function_start("Task", {"prompt": "dig"}, tool_use_id="t1")
    report = "".join(f"finding {i}: parse() at line {i}\n" for i in range(1, 400))
    session.function_complete(fid, report, "completed")
    request = engine.render(sid, params(recall=True)).request
    (handle,) = handles_in(request["messages"])
    g = session.graph
    got = recall(g, handle, g.branch_path(), 10**6)
    assert got.text == report.rstrip("\n")
    turn = g.branch_path().ids[0]
    asked = recall(g, handle_for(sid, turn), g.branch_path(), 10**6)  # a message: its words
    assert asked.text == "go"
    index = recall(g, handle_for(sid, turn, "from"), g.branch_path(), 10**6)
    call_id = g.tool_by_use_id("t1").id  # type: ignore[union-attr]
    assert f"→ {handle_for(sid, call_id)} Task dig (399 lines)" in index.text
    assert index.text.startswith(f"── user {turn} ──\ngo")
