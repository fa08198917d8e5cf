"""How a recalled page reads to the model, for every client that answers `compactd_recall`
(the Python client's helper, the proxy): a page that was cut says where to continue, and so
does a search whose matches did not all fit."""

from __future__ import annotations


def page_text(
    text: str,
    start_line: int,
    end_line: int,
    total_lines: int,
    truncated: bool,
    matches: int | None = None,
) -> str:
    if not truncated:
        return text
    if matches is not None:
        return (
            f"{text}\n[compactd: matches shown up to line {end_line} of {total_lines}; call "
            f"compactd_recall with the same search and startLine={end_line + 1} for the rest]"
        )
    return (
        f"{text}\n[compactd: lines {start_line}–{end_line} of {total_lines}; "
        f"call compactd_recall with startLine={end_line + 1} for more]"
    )
