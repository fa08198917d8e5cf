"""What a Budget Reduction cut keeps, judged by fidelity: on the fourteen shared Claude Code
sessions, the later uses of a term (`context/replay/fidelity.py`) whose only copies were tool
results over the cut, and whether the result as cut shows the term — the spec's head and tail
(2,400 + 1,600 characters) against the same 4,000 characters with some of them given to lines
from the cut middle that look worth more: an error, a declaration, a name the thread already
mentions.

    .venv/bin/python bench/cut_fidelity.py

Prints, per variant and share of the 4,000 characters given to kept lines, the uses it makes
visible that the plain cut did not, those it loses (the head and tail get shorter), and the
change in characters sent. Static: no cascade runs (what a cut keeps does not depend on it).
"""

from __future__ import annotations

import re
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

from compactd.context.budget_reduction import truncate_result
from compactd.context.importers import load_transcript
from compactd.context.importers.apply import as_sent, steps
from compactd.context.importers.plan import Messages
from compactd.context.recall import line_starts
from compactd.context.replay.fidelity import block_text, terms, uses_by_call

sys.path.insert(0, str(Path(__file__).resolve().parent))
from replays import SESSIONS

MAX, HEAD, TAIL = 4000, 2400, 1600
HANDLE = "recall:n1.cut.0a1b2c3d"
ERROR = re.compile(
    r"\b(?:error|errors|fail|failed|failure|panic|traceback|exception|fatal|denied|undefined|"
    r"cannot|not found)\b",
    re.I,
)
DECLARATION = re.compile(
    r"^\s*(?:\d+→)?\s*(?:func|def|class|type|interface|struct|const|var|export|async def|fn|impl)\b"
)
VARIANTS = ("error", "error+declaration", "mentioned", "error+declaration+mentioned")


def with_kept_lines(content: str, mentioned: frozenset[str], variant: str, share: float) -> str:
    """The cut with the best-scoring middle lines kept, within the same characters."""
    cut_from, cut_to = HEAD, len(content) - TAIL
    starts = line_starts(content)
    bounds = [*starts, len(content)]
    scored = []
    for i in range(len(starts)):
        a, b = bounds[i], bounds[i + 1]
        if a < cut_from + 200 or b > cut_to - 200:
            continue
        line = content[a:b].rstrip("\n")
        score = 2 * ("error" in variant and bool(ERROR.search(line)))
        score += "declaration" in variant and bool(DECLARATION.search(line))
        score += "mentioned" in variant and bool(terms(line) & mentioned)
        if score:
            scored.append((-score, i, line[:160]))
    scored.sort()
    kept, used = [], 0
    for _, i, line in scored:
        piece = len(line) + len(str(i + 1)) + 2
        if used + piece <= share * MAX:
            kept.append((i, line))
            used += piece
    if not kept:
        return truncate_result(content, MAX, HEAD, TAIL, HANDLE)
    head = HEAD - used * HEAD // MAX
    base = truncate_result(content, MAX - used, head, TAIL - (used - (HEAD - head)), HANDLE)
    note_end = base.index("…]\n\n", base.index("\n\n[…")) + 4
    lines = "\n".join(f"{i + 1}: {line}" for i, line in sorted(kept))
    return base[:note_end] + lines + "\n\n" + base[note_end:]


def session_results(path: Path) -> tuple[Any, dict[str, str], dict[str, frozenset[str]]]:
    """The session, its text results by tool_use id, and the terms its thread had mentioned
    (user and assistant words, tool inputs) before each result."""
    imported = load_transcript(str(path))[0]
    results: dict[str, str] = {}
    mentioned: dict[str, frozenset[str]] = {}
    seen: dict[str | None, set[str]] = defaultdict(set)
    for step in steps(imported):
        for op in step.ops:
            if not isinstance(op, Messages):
                continue
            for message in as_sent(op.messages, imported.sent):
                content = message.get("content")
                blocks = (
                    content if isinstance(content, list) else [{"type": "text", "text": content}]
                )
                for block in blocks:
                    if block.get("type") == "tool_result":
                        if isinstance(block.get("content"), str):
                            results[block["tool_use_id"]] = block["content"]
                            mentioned[block["tool_use_id"]] = frozenset(seen[op.thread])
                    elif block.get("type") in ("text", "tool_use"):
                        seen[op.thread] |= terms(block_text(block))
    return imported, results, mentioned


def main() -> int:
    data = [session_results(path) for path in SESSIONS]
    print("| variant | share | uses gained | uses lost | net | characters |")
    print("|---|---|---|---|---|---|")
    for variant in VARIANTS:
        for share in (0.2, 0.3):
            gained = lost = chars_plain = chars_kept = 0
            for imported, results, mentioned in data:
                cuts = {}
                for use_id, text in results.items():
                    if len(text) > MAX:
                        plain = truncate_result(text, MAX, HEAD, TAIL, HANDLE)
                        kept = with_kept_lines(text, mentioned[use_id], variant, share)
                        cuts[use_id] = (plain, kept)
                        chars_plain += len(plain)
                        chars_kept += len(kept)
                for uses in uses_by_call(imported).values():
                    for use in uses:
                        if not any(r in cuts for r in use.results) or any(
                            r in results and r not in cuts for r in use.results
                        ):
                            continue  # no cut result, or a whole copy elsewhere
                        before = any(use.term in cuts[r][0] for r in use.results if r in cuts)
                        after = any(use.term in cuts[r][1] for r in use.results if r in cuts)
                        gained += after and not before
                        lost += before and not after
            print(
                f"| {variant} | {share:.0%} | {gained} | {lost} | {gained - lost:+d} | "
                f"{chars_kept / chars_plain - 1:+.2%} |"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
