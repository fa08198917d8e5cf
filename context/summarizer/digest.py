"""The `digest` summary provider: an offline, deterministic, extractive checkpoint.

No model, no network: every user request verbatim, each tool call with its key arguments and
error flag, the files touched, and the last assistant text — so the daemon can compact with no
network at all, and replays are reproducible to the byte.
"""

from __future__ import annotations

import re
from typing import Any

from ..budget_reduction import middle_truncate
from ..tokens import COUNTER
from .types import SummaryFailure, SummaryRequest, SummaryResult

KEY_ARGS = (
    "file_path",
    "path",
    "notebook_path",
    "pattern",
    "command",
    "cmd",
    "query",
    "url",
    "description",
    "old_string",
    "glob",
    "filename",
)
ARG_CHARS = 160
PATCH_FILE = re.compile(r"\*\*\* (?:Add|Update|Delete) File: (\S+)")
FILE_KEYS = ("file_path", "path", "notebook_path", "filename")


def _short(value: Any) -> str:
    text = value if isinstance(value, str) else repr(value)
    text = " ".join(text.split())
    return text if len(text) <= ARG_CHARS else text[: ARG_CHARS - 1] + "…"


def key_arguments(tool_input: Any) -> str:
    if not isinstance(tool_input, dict):
        return _short(tool_input)
    picked = [f"{k}={_short(tool_input[k])}" for k in KEY_ARGS if k in tool_input]
    if not picked and tool_input:
        k = sorted(tool_input)[0]
        picked = [f"{k}={_short(tool_input[k])}"]
    return ", ".join(picked)


def files_of(tool_input: Any) -> list[str]:
    if not isinstance(tool_input, dict):
        return []
    out = [tool_input[k] for k in FILE_KEYS if isinstance(tool_input.get(k), str)]
    for value in tool_input.values():
        if isinstance(value, str) and "*** " in value:
            out.extend(PATCH_FILE.findall(value))
    return out


def digest_text(
    items: list[dict[str, Any]] | tuple[dict[str, Any], ...], max_chars: int | None = None
) -> str:
    """The checkpoint. The last assistant message is quoted up to a quarter of `max_chars`;
    over `max_chars`, the earlier checkpoint is shortened first, then the oldest tool calls
    and the first files touched are counted instead of listed; user requests are never
    cut."""
    prior: list[str] = []
    requests: list[str] = []
    calls: list[str] = []
    files: list[str] = []
    last_assistant: str | None = None
    for item in items:
        kind = item.get("type")
        if kind == "summary":
            prior.append(item.get("text", ""))
        elif kind == "user":
            text = item.get("text", "")
            # an earlier request the earlier checkpoint already quotes is not quoted twice
            if not (item.get("earlier") and any(text in p for p in prior)):
                requests.append(text)
        elif kind == "assistant":
            last_assistant = item.get("text")
        elif kind == "tool":
            flag = " [error]" if item.get("isError") else ""
            calls.append(f"- {item.get('name')}({key_arguments(item.get('input'))}){flag}")
            for name in files_of(item.get("input")):
                if name not in files:
                    files.append(name)
    earlier = "\n\n".join(prior)
    if last_assistant and max_chars is not None:
        # an extract, not a copy: a long explanation would defeat the checkpoint
        keep = max(400, max_chars // 4)
        last_assistant = middle_truncate(last_assistant, keep, keep * 6 // 10, keep * 4 // 10)

    def assemble(earlier: str, shown_calls: list[str], shown_files: list[str] = files) -> str:
        out = ["Checkpoint (extractive digest)."]
        if earlier:
            out.append("Earlier checkpoint:\n" + earlier)
        if requests:
            out.append("User requests, verbatim:\n" + "\n".join(f"- {r}" for r in requests))
        if calls:
            omitted = len(calls) - len(shown_calls)
            head = (
                f"Tool calls ({len(calls)}"
                + (f", the {omitted} oldest not listed" if omitted else "")
                + "):\n"
            )
            out.append(head + "\n".join(shown_calls))
        if files:
            omitted = len(files) - len(shown_files)
            head = f"Files touched ({len(files)}" + (
                f", the {omitted} first not listed):\n" if omitted else "):\n"
            )
            out.append(head + "\n".join(f"- {f}" for f in shown_files))
        if last_assistant:
            out.append("Last assistant message:\n" + last_assistant)
        return "\n\n".join(out)

    text = assemble(earlier, calls)
    if max_chars is None or len(text) <= max_chars:
        return text
    excess = len(text) - max_chars
    if earlier:
        keep = max(200, len(earlier) - excess)
        earlier = middle_truncate(earlier, keep, keep * 6 // 10, keep * 4 // 10)
        text = assemble(earlier, calls)
    shown = list(calls)
    while len(text) > max_chars and len(shown) > 10:
        shown = shown[len(shown) // 4 :]
        text = assemble(earlier, shown)
    touched = list(files)
    while len(text) > max_chars and len(touched) > 10:
        touched = touched[len(touched) // 4 :]
        text = assemble(earlier, shown, touched)
    return text


def evidence_lines(items: list[dict[str, Any]] | tuple[dict[str, Any], ...]) -> str:
    """Tool evidence, extractively: per result its size, its first non-empty line and every
    line that looks like an error."""
    out = []
    for item in items:
        lines = [ln.strip() for ln in str(item.get("text", "")).splitlines() if ln.strip()]
        first = _short(lines[0]) if lines else "(empty)"
        errors = [_short(ln) for ln in lines[1:] if ERROR_LINE.search(ln)][:3]
        said = f"{len(lines)} lines; first: {first}"
        if errors:
            said += "; " + "; ".join(errors)
        out.append(f"{item.get('id')}: {said}")
    return "\n".join(out)


ERROR_LINE = re.compile(r"error|fail|exception|traceback", re.IGNORECASE)


def summarize(request: SummaryRequest) -> SummaryResult:
    if not request.items:
        raise SummaryFailure("other", "the digest provider needs the structured input items")
    if request.purpose == "evidence":
        text = evidence_lines(request.items)
        return SummaryResult(
            text=text,
            model="digest",
            input_tokens=request.input_tokens_estimate,
            output_tokens=COUNTER.text(text),
        )
    # the checkpoint stays within the budget the tier priced it at: paths and identifiers
    # tokenize densely, so the character cap tightens until the count fits (user requests,
    # which are never cut, may still exceed it)
    budget = int(request.max_output_tokens / max(request.ratio, 1e-9))
    cap = budget * 4
    text = digest_text(request.items, cap)
    for _ in range(8):
        if COUNTER.text(text) <= budget:
            break
        cap = cap * 4 // 5
        text = digest_text(request.items, cap)
    # offered a fork, the digest answers it as a model reading the cached request would: the
    # checkpoint of the whole range (its items), in one call
    fork = request.fork
    return SummaryResult(
        text=text,
        model="digest",
        input_tokens=fork.input_tokens_estimate if fork else request.input_tokens_estimate,
        output_tokens=COUNTER.text(text),
        forked=fork is not None,
    )
