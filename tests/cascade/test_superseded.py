"""Superseded tool results: a file read again later or edited since, a command run again with
the same arguments — the rule on its own, and Tier 1 clearing them first (even among the newest
calls it keeps whole) with a placeholder that says why, the original kept and recallable."""

from __future__ import annotations

from typing import Any

from compactd.context.engine import Engine
from compactd.context.superseded import EDITED, READ_AGAIN, RUN_AGAIN, Use, superseded

from tests.cascade.helpers import (
    assistant,
    cascade,
    filler,
    open_session,
    params,
    records,
    result_blocks,
    results,
    tool_result,
    tool_use,
    user,
)


def read(use_id: str, path: str, **part: Any) -> Use:
    return Use(use_id, "Read", {"file_path": path, **part})


def test_a_file_read_again_supersedes_the_earlier_read() -> None:
    uses = [read("a", "/x.py"), read("b", "/y.py"), read("c", "/x.py")]
    assert superseded(uses) == {"a": READ_AGAIN}


def test_only_the_same_part_or_the_whole_file_supersedes_a_read() -> None:
    uses = [
        read("whole", "/x.py"),
        read("top", "/x.py", offset=1, limit=50),
        read("bottom", "/x.py", offset=400, limit=50),
        read("top again", "/x.py", offset=1, limit=50),
    ]
    # a part read later says nothing of the rest of the file
    assert superseded(uses) == {"top": READ_AGAIN}
    assert superseded([*uses, read("all", "/x.py")]) == {
        "whole": READ_AGAIN,
        "top": READ_AGAIN,
        "bottom": READ_AGAIN,
        "top again": READ_AGAIN,
    }


def test_an_edit_since_makes_a_read_stale_unless_it_failed() -> None:
    edit = Use("e", "Edit", {"file_path": "/x.py", "old_string": "a", "new_string": "b"})
    failed = Use(
        "f", "Edit", {"file_path": "/x.py", "old_string": "a", "new_string": "b"}, True, True
    )
    assert superseded([read("r", "/x.py"), edit]) == {"r": EDITED}
    assert superseded([read("r", "/x.py"), failed]) == {}
    assert superseded([edit, read("r", "/x.py")]) == {}  # read after the edit: current


def test_a_command_run_again_with_the_same_arguments_supersedes_the_first() -> None:
    def bash(use_id: str, command: str, **more: Any) -> Use:
        return Use(use_id, "Bash", {"command": command, **more})

    uses = [bash("1", "pytest -q"), bash("2", "pytest -q", timeout=60), bash("3", "pytest -q")]
    assert superseded(uses) == {"1": RUN_AGAIN}
    # a background shell's poll returns only what is new: never superseded
    polls = [Use("p1", "BashOutput", {"bash_id": "s1"}), Use("p2", "BashOutput", {"bash_id": "s1"})]
    assert superseded(polls) == {}


def test_a_newer_result_that_is_not_shown_stands_for_nothing() -> None:
    hidden = Use("c", "Read", {"file_path": "/x.py"}, visible=False)
    assert superseded([read("a", "/x.py"), hidden]) == {}
    # …though an edit changes the file whether or not its result is shown
    edit = Use("e", "Write", {"file_path": "/x.py", "content": "new"}, visible=False)
    assert superseded([read("a", "/x.py"), edit]) == {"a": EDITED}


def test_one_editor_tool_reads_and_edits_by_its_command() -> None:
    view = Use("v", "str_replace_editor", {"command": "view", "path": "/x.py"})
    change = Use(
        "s", "str_replace_editor", {"command": "str_replace", "path": "/x.py", "old_str": "a"}
    )
    assert superseded([view, change]) == {"v": EDITED}
    assert superseded(
        [view, Use("w", "str_replace_editor", {"command": "view", "path": "/x.py"})]
    ) == {"v": READ_AGAIN}


def test_unknown_tools_and_odd_inputs_are_left_alone() -> None:
    uses = [
        Use("a", "TodoWrite", {"todos": []}),
        Use("b", "TodoWrite", {"todos": []}),
        Use("c", "Read", "not a mapping"),
        Use("d", "Read", {"file_path": ""}),
        Use("e", None, {"file_path": "/x.py"}),
    ]
    assert superseded(uses) == {}


# ---- Tier 1 ------------------------------------------------------------------------------------

WINDOW = 32_000  # limit 24,000: the session below sits over its threshold


def session_with_a_re_read(engine: Engine, config: dict[str, Any] | None = None) -> str:
    """An agent that read /src/app.py, worked, and read it again as its newest step but one —
    both reads among the five newest calls Tier 1 keeps whole — with old results enough to put
    the request over its threshold."""
    sid = open_session(
        engine, {"microcompactMode": "time", "microcompactKeepRecentShare": 1.0, **(config or {})}
    )
    msgs: list[dict[str, Any]] = [user("the task: tidy the app")]
    for k in range(12):
        use_id = f"toolu_old{k}"
        msgs.append(assistant(f"step {k}", tool_use(use_id, "Read", file_path=f"/src/m{k}.py")))
        msgs.append(results(tool_result(use_id, filler(f"old{k}", 1800))))
    newest = [
        ("toolu_first", "/src/app.py", filler("first read", 900)),
        ("toolu_other", "/src/util.py", filler("util", 300)),
        ("toolu_again", "/src/app.py", filler("second read", 900)),
        ("toolu_last", "/src/cli.py", filler("cli", 300)),
    ]
    for use_id, path, content in newest:
        msgs.append(assistant(f"reading {path}", tool_use(use_id, "Read", file_path=path)))
        msgs.append(results(tool_result(use_id, content)))
    engine.append(sid, messages=msgs)
    return sid


def test_tier_1_clears_a_superseded_read_among_the_newest_and_says_why(engine: Engine) -> None:
    sid = session_with_a_re_read(engine)
    out = cascade(engine, sid, params(WINDOW))
    shown = result_blocks(out.rendered.request)
    first = shown["toolu_first"]["content"]
    assert "superseded (the file was read again later)" in str(first)
    # the newer read and the other newest calls stay whole
    assert "second read" in str(shown["toolu_again"]["content"])
    assert "util" in str(shown["toolu_other"]["content"])
    (clear,) = [r for r in records(engine, sid, "clear") if r.data.get("superseded")]
    first_node = next(
        n for n in engine.session(sid).graph.nodes.values() if n.tool_use_id == "toolu_first"
    )
    assert clear.data["superseded"] == {first_node.id: READ_AGAIN}
    assert "first read" in str(first_node.result)  # the original is kept in the graph
    (event,) = [e for e in out.events if e.tier == "microcompact" and e.applied]
    assert event.details["superseded"] == 1 and "1 superseded" in event.reason


def test_a_superseded_placeholder_names_its_handle_and_recall_returns_the_original(
    engine: Engine,
) -> None:
    sid = session_with_a_re_read(engine, {"recall": True})
    out = cascade(engine, sid, params(WINDOW))
    text = str(result_blocks(out.rendered.request)["toolu_first"]["content"])
    assert text.startswith("[Tool result cleared by compactd: superseded (the file was read again")
    handle = text.split("handle ", 1)[1].split(" ", 1)[0]
    recalled = engine.recall(sid, handle)
    assert "first read" in recalled.text


def test_without_the_rule_the_newest_reads_stay_whole(engine: Engine) -> None:
    sid = session_with_a_re_read(engine, {"microcompactClearSuperseded": False})
    out = cascade(engine, sid, params(WINDOW))
    assert "first read" in str(result_blocks(out.rendered.request)["toolu_first"]["content"])
    assert not [r for r in records(engine, sid, "clear") if r.data.get("superseded")]
