"""Recall that finds: `compactd_recall` with a search returns the lines of a handle's content
that match — plain text or an RE2 regular expression — with their numbers and a little
context, the whole answer under `recallMaxChars`. On the bundled session's cut results, the
line an agent needs from a cut result is one call away whatever page it lies on; a search
compactd will not run is a typed error that writes nothing."""

from __future__ import annotations

import re
import tempfile
from pathlib import Path

import pytest
from compactd.context.budget_reduction import omitted_lines
from compactd.context.engine import Engine
from compactd.context.errors import InvalidContent, InvalidSearch, UnknownHandle
from compactd.context.recall import (
    LINE_WIDTH,
    SEARCH_MAX_CHARS,
    Search,
    content_text,
    handles_in,
    line_starts,
    search_lines,
    shown_content,
)
from compactd.context.replay.fidelity import pages_to
from compactd.context.stores.files import FileStore

from tests.engine.helpers import log_bytes, params
from tests.engine.test_recall import DATA, session_with_a_big_read

BUNDLED = DATA / "claude-code" / "64da7265-8f07-4967-b79f-0ae374c13330.jsonl"
GREP_LINE = re.compile(r"^(\d+)([:-])(.*)$")


def grep_lines(text: str) -> dict[int, tuple[str, str]]:
    """An answer's numbered lines: number -> (":" a match or "-" context, the line)."""
    out = {}
    for line in text.split("\n")[1:]:
        if line == "--":
            continue
        m = GREP_LINE.match(line)
        assert m, line
        out[int(m.group(1))] = (m.group(2), m.group(3))
    return out


def numbered(text: str) -> list[str]:
    """`text` as recall numbers its lines (long lines wrapped)."""
    starts = line_starts(text)
    bounds = [*starts, len(text)]
    return [text[bounds[i] : bounds[i + 1]].rstrip("\n") for i in range(len(starts))]


def test_a_search_returns_every_matching_line_with_its_number_and_context() -> None:
    rows = [
        f"row {i}: value {i * 7}" + (" ctx.Done()" if i % 97 == 0 else "") for i in range(1, 2001)
    ]
    text = "\n".join(rows) + "\n"
    got = search_lines(text, Search("ctx.Done()"), 3800)  # plain text: the dot and () literal
    assert (got.matches, got.truncated, got.end_line, got.total_lines) == (20, False, 2000, 2000)
    assert got.text.startswith("[compactd: 20 lines match the text “ctx.Done()” (lines 1–2000")
    shown = grep_lines(got.text)
    hits = [n for n, (kind, _) in shown.items() if kind == ":"]
    assert hits == [i for i in range(1, 2001) if i % 97 == 0]
    for n, (kind, line) in shown.items():
        assert line == rows[n - 1]
        assert kind == ":" or (n - 1) in hits or (n + 1) in hits  # one line either side
    assert "\n--\n" in got.text and len(got.text) <= 3800
    # a regular expression, no context, lines bounded
    got = search_lines(text, Search(r"value 1\d{3}\b", regex=True, context=0), 3800, 140, 160)
    assert set(grep_lines(got.text)) == {n for n in range(143, 161)}
    assert got.matches == 18 and not got.truncated
    # case: plain text is exact, RE2's (?i) ignores it
    assert search_lines(text, Search("CTX.DONE()"), 3800).matches == 0
    assert search_lines(text, Search("(?i)CTX\\.DONE", regex=True), 3800).matches == 20
    none = search_lines(text, Search("no such thing"), 3800)
    assert none.matches == 0 and not none.truncated and "no line matches" in none.text


def test_a_search_too_big_for_one_answer_is_cut_at_a_group_and_goes_on() -> None:
    text = "".join(
        f"line {i} has the needle\n" if i % 3 == 0 else f"line {i}\n" for i in range(3000)
    )
    seen: set[int] = set()
    start, calls = 1, 0
    while True:
        got = search_lines(text, Search("needle", context=2), 3800, start)
        calls += 1
        assert len(got.text) <= 3800 and got.matches is not None
        seen |= {n for n, (kind, _) in grep_lines(got.text).items() if kind == ":"}
        if not got.truncated:
            break
        assert got.end_line >= start  # it moves on
        start = got.end_line + 1
    assert seen == {i + 1 for i in range(3000) if i % 3 == 0}
    assert calls > 1


def test_a_long_single_line_is_searched_in_every_wrapped_line() -> None:
    blob = ",".join(f'"k{i}":"v{i}"' for i in range(2000))  # minified JSON, one physical line
    wanted = [f'"k{i}":"v{i}"' for i in (5, 700, 1999)]
    lines = numbered(blob)
    assert len(lines) > 10
    for needle in wanted:
        expected = {n + 1 for n, line in enumerate(lines) if needle in line}
        for search in (Search(needle), Search(re.escape(needle), regex=True)):
            got = search_lines(blob, search, 10**6)
            assert {n for n, (k, _) in grep_lines(got.text).items() if k == ":"} == expected
    # every wrapped line with a key on it, not only the first on the physical line
    everything = search_lines(blob, Search('"k\\d+"', regex=True, context=0), 10**7)
    assert everything.matches == len(lines)
    assert all(len(line) <= LINE_WIDTH for line in lines)


@pytest.mark.parametrize(
    ("pattern", "regex", "context"),
    [
        ("", False, 1),
        ("x" * (SEARCH_MAX_CHARS + 1), False, 1),
        ("(a)\\1", True, 1),  # a backreference: RE2 has none
        ("foo(?=bar)", True, 1),  # lookahead
        ("(((a{1000}){1000}){1000})", True, 1),  # a program no time bound could make safe
        ("a{2000}", True, 1),
        ("[unclosed", True, 1),
        ("fine", False, 6),
    ],
)
def test_a_search_compactd_will_not_run_is_refused_before_it_reads(
    pattern: str, regex: bool, context: int
) -> None:
    with pytest.raises(InvalidSearch) as caught:
        Search(pattern, regex, context)
    assert caught.value.kind == "invalid_search"


def test_wire_values_of_the_wrong_type_are_refused_as_the_search() -> None:
    assert Search.of(None) is None
    assert Search.of("x", None, None) == Search("x")
    for args in ((5,), ("x", "yes"), ("x", False, "2"), ("x", False, True)):
        with pytest.raises(InvalidSearch):
            Search.of(*args)


def test_backtracking_patterns_run_in_linear_time_over_a_megabyte() -> None:
    """The patterns that hang a backtracking engine are answered (RE2 never backtracks):
    correctly, over a megabyte, with nothing refused."""
    text = ("x" * 999 + "\n") * 1000 + "xxxxy\n"
    for pattern in ("(x+x+)+y", "(x|xx)+y", "^(x*)*y$"):
        got = search_lines(text, Search(pattern, regex=True, context=0), 10**6)
        assert got.matches == 1 and "1001:xxxxy" in got.text


def test_the_engine_searches_a_handle_and_refuses_a_foreign_one_writing_nothing(
    tmp_path: Path,
) -> None:
    engine = Engine(FileStore(tmp_path))
    handle = session_with_a_big_read(engine, "finds", 3000)
    other = session_with_a_big_read(engine, "other", 10)
    before = log_bytes(tmp_path, "finds")
    got = engine.recall("finds", handle, search=Search("row 2345"))
    assert grep_lines(got.text) == {
        2344: ("-", "row 2344"),
        2345: (":", "row 2345"),
        2346: ("-", "row 2346"),
    }
    cut = handles_in(engine.render("finds", params(recall=True)).request)
    (cut_handle,) = cut
    assert engine.recall("finds", cut_handle, search=Search("row 2345")).text == got.text
    assert engine.recall("finds", "t1", search=Search("row 2345")).text == got.text  # by id
    with pytest.raises(UnknownHandle):
        engine.recall("finds", other, search=Search("row 1"))
    with pytest.raises(InvalidContent):
        engine.recall("finds", handle, 3001, search=Search("row"))
    assert log_bytes(tmp_path, "finds") == before  # reading and refusing write nothing


def test_on_the_bundled_session_a_cut_line_is_one_search_away() -> None:
    """For every cut result of the bundled session and every line its cut left out, paging
    from the cut (recall before it could search) takes up to many calls; one search finds the
    line, however far it lies, and its answer is under `recallMaxChars`."""
    with tempfile.TemporaryDirectory() as tmp:
        engine = Engine(FileStore(tmp))
        (sid,) = engine.import_file(str(BUNDLED)).session_ids[:1]
        g = engine.session(sid).graph
        request = engine.render(sid, params(recall=True)).request
        cut_handles = sorted(h for h in handles_in(request["messages"]) if ".cut." in h)
        assert len(cut_handles) > 10
        paging: list[int] = []
        for handle in cut_handles:
            node = g.nodes[handle[len("recall:") :].split(".")[0]]
            text = content_text(shown_content(g, node))
            assert "returns them, or with search the lines that match" in str(request)
            lines = numbered(text)
            start = engine.recall(sid, handle).start_line  # the first line the cut left out
            # the last line the cut left out (or the nearest before it whose text is its own)
            omitted = omitted_lines(text, 2400, len(text) - 1600)
            last = omitted[1] if omitted else start
            unique = [
                n
                for n in range(last, start - 1, -1)
                if lines[n - 1].strip() and text.count(lines[n - 1]) == 1
            ]
            if not unique:
                continue
            target = unique[0]
            needle = lines[target - 1]
            paging.append(pages_to(text, needle, start, 3800))
            got = engine.recall(sid, handle, search=Search(needle, context=0))
            assert len(got.text) <= 3800 and got.matches == 1
            assert grep_lines(got.text) == {target: (":", needle)}
        assert len(paging) > 10
        assert max(paging) > 4  # paging from the cut, the line is many calls away…
        assert sum(p > 1 for p in paging) > len(paging) // 2  # …and usually more than one
