"""Tool evidence (the spec's stage 2): long text-only tool results condensed, before a
checkpoint, into one line each of what they showed — keeping the call's id and error flag.

Pure: which results qualify is the tier's business (`tiers/rolling_summary.py`); here are the
request for a batch of results, the parser of the answer and the marker that stands in a
result's place. One provider call per batch of `summary_input_max_tokens`, not one per result,
so a range of fifty reads costs a call or two.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

import attrs

from ..budget_reduction import middle_truncate
from ..tokens import Counter
from .instructions import evidence_system
from .types import SummaryRequest

SOURCE_CHARS = 40_000  # of one result's original text, middle-truncated, that the model reads
WORDS_PER_TOKEN = 0.7


@attrs.frozen
class EvidenceSource:
    """One tool result to condense: its call (node id and `tool_use_id`), tool, error flag,
    original text and that text's size in tokens."""

    node: str
    tool_use_id: str
    tool: str
    is_error: bool
    text: str
    tokens: int


def batches(sources: Sequence[EvidenceSource], budget: int) -> list[list[EvidenceSource]]:
    """Consecutive groups of at most `budget` tokens of (capped) source text each."""
    out: list[list[EvidenceSource]] = []
    used = 0
    for src in sources:
        size = source_tokens(src)
        if not out or used + size > budget:
            out.append([])
            used = 0
        out[-1].append(src)
        used += size
    return out


def source_text(src: EvidenceSource) -> str:
    """The part of a result's original the model reads (middle-truncated past the cap)."""
    head, tail = SOURCE_CHARS * 6 // 10, SOURCE_CHARS * 4 // 10
    return middle_truncate(src.text, SOURCE_CHARS, head, tail)


def source_tokens(src: EvidenceSource) -> int:
    """An upper bound of `source_text`'s tokens."""
    return min(src.tokens, SOURCE_CHARS // 3)


def evidence_prompt(batch: Sequence[EvidenceSource]) -> str:
    """The results of one batch, each in a `<result>` element naming id, tool and error."""
    parts = []
    for src in batch:
        text = source_text(src)
        error = "true" if src.is_error else "false"
        parts.append(
            f'<result id="{src.tool_use_id}" tool="{src.tool}" error="{error}">\n{text}\n</result>'
        )
    return "\n\n".join(parts)


def evidence_request(
    batch: Sequence[EvidenceSource],
    *,
    tokens_each: int,
    model: str | None,
    deadline: float | None,
    counter: Counter,
) -> SummaryRequest:
    """The provider call condensing one batch (items carry the same results for `digest`)."""
    prompt = evidence_prompt(batch)
    return SummaryRequest(
        purpose="evidence",
        system=evidence_system(max(10, int(tokens_each * WORDS_PER_TOKEN))),
        prompt=prompt,
        max_output_tokens=tokens_each * len(batch) + 50,
        model=model,
        input_tokens_estimate=counter.text(prompt),
        items=tuple(
            {
                "type": "result",
                "id": s.tool_use_id,
                "name": s.tool,
                "isError": s.is_error,
                "text": s.text,
            }
            for s in batch
        ),
        deadline=deadline,
    )


_LINE = re.compile(r"^\s*(?:[-*]\s*)?[`\"']?(?P<id>[A-Za-z0-9_.\-]+)[`\"']?\s*:\s*(?P<text>\S.*)$")


def parse_evidence(answer: str, ids: Sequence[str]) -> dict[str, str]:
    """`tool_use_id -> line` for every expected id the answer has a line for (first one wins;
    lines for ids not asked about are ignored — a result the model skipped keeps its raw
    output)."""
    wanted = set(ids)
    out: dict[str, str] = {}
    for line in answer.splitlines():
        m = _LINE.match(line)
        if m and m["id"] in wanted and m["id"] not in out:
            out[m["id"]] = m["text"].strip()
    return out


def evidence_marker(src: EvidenceSource, digest: str) -> str:
    """What stands in the result's place: the tool, its id, the error flag and the digest."""
    flag = ", an error" if src.is_error else ""
    return (
        f"[compactd tool evidence: {src.tool} ({src.tool_use_id}){flag}; the original "
        f"{src.tokens:,}-token result is kept in the session graph]\n{digest}"
    )
