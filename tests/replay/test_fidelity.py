"""Fidelity, the replay's other half: which terms of the agent's recorded answers it had only
seen in tool results (a use), and whether each policy's request kept them in view, one recall
call away, or further."""

from __future__ import annotations

from compactd.context.importers.plan import ImportedSession, Messages, ModelCall
from compactd.context.recall import page
from compactd.context.replay.fidelity import Fidelity, Use, pages_to, terms, uses_by_call

from tests.replay.test_recall_counts import run_with_recall


def test_terms_are_names_paths_and_numbers_not_words() -> None:
    found = terms(
        "The handler HandleWidget in internal/widget/store.go (line 1234) calls "
        "store.Save and widget_cache; commit 3f9a2c1e; see README.md. Just plain words here."
    )
    assert found == {
        "HandleWidget",
        "internal/widget/store.go",
        "1234",
        "store.Save",
        "widget_cache",
        "3f9a2c1e",
        "README.md",
    }


def read(use_id: str, text: str) -> dict:
    return {
        "role": "user",
        "content": [{"type": "tool_result", "tool_use_id": use_id, "content": text}],
    }


def test_a_use_is_a_term_the_answer_took_from_a_result_alone() -> None:
    """An answer uses what only a result had shown; once the agent has written a term, or the
    user has, a later mention is not a use of the result any more."""
    call = {"type": "tool_use", "id": "t1", "name": "Read", "input": {"file_path": "app/main.go"}}
    edit = {
        "type": "tool_use",
        "id": "t2",
        "name": "Edit",
        "input": {"file_path": "internal/widget/store.go", "old_string": "HandleWidget"},
    }
    ops = [
        Messages([{"role": "user", "content": "find where widgets are saved (see app/main.go)"}]),
        ModelCall(),
        Messages([{"role": "assistant", "content": [call]}]),
        Messages([read("t1", "func HandleWidget() { save(internal/widget/store.go, 4096) }")]),
        ModelCall(),
        Messages(
            [{"role": "assistant", "content": [{"type": "text", "text": "Editing it."}, edit]}]
        ),
        Messages([read("t2", "ok")]),
        ModelCall(),
        Messages([{"role": "assistant", "content": "HandleWidget now saves through 4096."}]),
    ]
    uses = uses_by_call(ImportedSession("test", "s", ops))
    assert uses == {
        1: [Use("HandleWidget", ("t1",)), Use("internal/widget/store.go", ("t1",))],
        2: [Use("4096", ("t1",))],  # the number only the result had; the name the agent wrote
    }


def test_paging_counts_the_pages_a_model_reads_to_reach_a_line() -> None:
    text = "".join(f"line {i}: value {i * 3}\n" for i in range(1, 2001))
    first = page(text, 3800, 100)
    assert pages_to(text, "line 150:", 100, 3800) == 1 and first.end_line >= 150
    far = pages_to(text, "line 1999:", 100, 3800)
    assert far > 5
    assert pages_to(text, "line 5:", 100, 3800) == 1  # only before the start: from line 1
    assert pages_to(text, "no such line", 1, 3800) == 0


def test_the_replay_reports_fidelity_for_compactd_and_every_anchor() -> None:
    """On the bundled session at 64K with recall: every policy sees the same uses; compactd's
    hidden ones are mostly one recall call away (the anchors have no recall); the shares add
    up to one."""
    report = run_with_recall().to_json()
    main = report["mainThread"]
    names = ("compactd", "codex", "opencode", "claude-code", "server")
    uses = {name: main[name]["fidelity"]["uses"] for name in names}
    assert len(set(uses.values())) == 1 and uses["compactd"] > 100
    for name in names:
        f = main[name]["fidelity"]
        assert abs(f["visible"] + f["oneCall"] + f["further"] - 1) < 0.001
        if name != "compactd":
            assert f["oneCall"] == 0
    mine = main["compactd"]["fidelity"]
    assert mine["oneCall"] > 0.3 and mine["further"] < 0.1
    assert mine["oneCallByPaging"] < mine["oneCall"]  # before search, fewer in one call
    assert all(main[n]["fidelity"]["further"] > mine["further"] for n in names[1:])


def test_fidelity_adds_up() -> None:
    f = Fidelity()
    for where, pages in (("visible", 0), ("oneCall", 1), ("oneCall", 3), ("further", 0)):
        f.add(where, pages)
    assert (f.uses, f.visible, f.one_call, f.one_page, f.further, f.pages) == (4, 1, 2, 1, 1, 4)
    assert f.to_json()["oneCall"] == 0.5
