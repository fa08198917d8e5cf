"""Superseded tool results: ones the conversation holds a newer answer to.

A file read again later (the same part of it, or the whole file), a file edited or written
since it was read, a command run again with the same arguments: the earlier result is stale
and the newer one is visible, so clearing it first loses nothing the model still needs. Tier 1
clears them beside the old results it clears anyway — even among the newest calls it otherwise
keeps whole — on every pass of the time path, and on the server path whenever the window
forces a change (there compactd's placeholder re-writes the cache from the result); the
placeholder says why, with the handle.

Pure: it reads tool names and inputs, nothing else.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import attrs
import orjson

from .policy import COMPACTABLE_TOOLS

READS = frozenset(COMPACTABLE_TOOLS["FileRead"]) - {"str_replace_editor", "cat"}
EDITS = frozenset(COMPACTABLE_TOOLS["FileEdit"] + COMPACTABLE_TOOLS["FileWrite"]) - {
    "str_replace_editor",
    "apply_patch",
}
# a shell's output is the command's at that moment; a background shell's poll
# (`BashOutput`) returns only what is new, so it is never superseded
SHELLS = frozenset(COMPACTABLE_TOOLS["Shell"]) - {"BashOutput", "swe_agent_command"}
EDITOR = "str_replace_editor"  # one tool for both, by its `command`
PATH_KEYS = ("file_path", "path", "notebook_path", "filename")
# a read's arguments that pick a part of the file: without them the read is of all of it
PART_KEYS = ("offset", "limit", "view_range", "start_line", "end_line", "pages")

READ_AGAIN = "the file was read again later"
EDITED = "the file was edited since"
RUN_AGAIN = "the same command was run again later"


@attrs.frozen
class Use:
    """One tool call as the rule reads it: its id, the tool's name and its input."""

    id: str
    name: str | None
    input: Any
    visible: bool = True  # its result is shown (not cleared): it can stand for older ones
    failed: bool = False  # an edit that failed changed nothing


def _path(args: Mapping[str, Any]) -> str | None:
    for key in PATH_KEYS:
        value = args.get(key)
        if isinstance(value, str) and value:
            return value
    return None


def _kind(use: Use) -> tuple[str, str] | None:
    """("read" | "edit" | "shell", what it is of), or None for a call the rule ignores."""
    args = use.input if isinstance(use.input, Mapping) else None
    if args is None or use.name is None:
        return None
    name = use.name
    if name == EDITOR:
        name = "Read" if args.get("command") == "view" else "Edit"
    if name in READS or name in EDITS:
        path = _path(args)
        if path is None:
            return None
        return ("read" if name in READS else "edit"), path
    if name in SHELLS:
        return "shell", orjson.dumps(args, option=orjson.OPT_SORT_KEYS).decode()
    return None


def _part(args: Mapping[str, Any]) -> str:
    """Which part of a file a read took ("" for all of it)."""
    picked = {k: args[k] for k in PART_KEYS if args.get(k) is not None}
    return orjson.dumps(picked, option=orjson.OPT_SORT_KEYS).decode() if picked else ""


def superseded(uses: Sequence[Use]) -> dict[str, str]:
    """Call id -> why, for every use in `uses` (in call order) whose result a later one makes
    stale: a read whose part of the file (or the whole file) a later visible read took, a read
    of a file edited since, a command a later visible call ran with the same arguments."""
    out: dict[str, str] = {}
    read_later: set[tuple[str, str]] = set()  # (path, part) of later visible reads
    edited_later: set[str] = set()
    run_later: set[str] = set()
    for use in reversed(uses):
        kind = _kind(use)
        if kind is None:
            continue
        what, of = kind
        if what == "edit":
            if not use.failed:
                edited_later.add(of)
            continue
        if what == "shell":
            if of in run_later:
                out[use.id] = RUN_AGAIN
            elif use.visible:
                run_later.add(of)
            continue
        part = _part(use.input)
        if of in edited_later:
            out[use.id] = EDITED
        elif (of, part) in read_later or (of, "") in read_later:
            out[use.id] = READ_AGAIN
        if use.visible and use.id not in out:
            read_later.add((of, part))
    return out


def placeholder(why: str) -> str:
    """What a superseded result leaves (fixed bytes per reason: every later render is
    identical)."""
    return (
        f"[Tool result cleared by compactd: superseded ({why}). "
        "The original is kept in the session graph.]"
    )
