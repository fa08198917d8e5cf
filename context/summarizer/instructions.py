"""What the summarizer is told: the prompts, kept as Markdown files under `prompts/`, and the
pure builders that fill them in. Tested beside them (tests/summarizer/test_instructions.py)."""

from __future__ import annotations

from functools import cache
from importlib.resources import files


@cache
def prompt(name: str) -> str:
    """The text of `prompts/<name>.md` (without its final newline)."""
    return (files(__package__) / "prompts" / f"{name}.md").read_text(encoding="utf-8").rstrip("\n")


def checkpoint_system(
    instructions: str | None, size: tuple[int, int] | None = None, media: bool = False
) -> str:
    """The rolling summary's instructions: the size asked for (`size` = (floor, cap) in tokens,
    the spec's 2,000–5,000), a note when images or documents stay after it (`media`), and
    `/compact <instructions>`, the user's own."""
    text = prompt("checkpoint")
    if size is not None:
        text += "\n\n" + prompt("checkpoint_size").format(low=size[0], high=size[1])
    if media:
        text += "\n\n" + prompt("media_kept")
    if instructions:
        return (
            text + "\n\nThe user asked for this compaction with these "
            f"instructions — follow them:\n{instructions}"
        )
    return text


def collapse_system(tokens: int) -> str:
    """A Tier 3 segment summary's instructions, at most `tokens` long."""
    return prompt("collapse").format(tokens=tokens)


def evidence_system(words: int) -> str:
    """Tool evidence's instructions: one line per result, at most `words` words each."""
    return prompt("evidence").format(words=words)


def chunk_note(part: int, parts: int) -> str:
    """What a chunk of a long range says about its place (1-based `part` of `parts`)."""
    return prompt("chunk_note").format(part=part, parts=parts)


def fork_instruction(
    checkpoint: str,
    kept: int,
    first: str,
    *,
    request: str | None = None,
    hidden_requests: list[str] | tuple[str, ...] = (),
) -> str:
    """The last user turn of a summary asked as a fork of the cached request: which part to
    replace — everything before the last `kept` messages, the first of which begins with
    `first` (a description: `quoted`, or what the block is); inside a turn, its `request`
    stays too — the user requests of that part the request no longer shows, and the
    checkpoint's own instructions (`checkpoint_system`)."""
    if request is None:
        part = prompt("fork_part").format(kept=kept, first=first)
    else:
        part = prompt("fork_part_in_turn").format(kept=kept, first=first, request=quoted(request))
    text = prompt("fork").format(part=part, checkpoint=checkpoint)
    if hidden_requests:
        listed = "\n".join(f"- {r}" for r in hidden_requests)
        text += "\n\n" + prompt("fork_hidden").format(requests=listed)
    return text


def quoted(text: str, limit: int = 160) -> str:
    """`text` on one line in «guillemets», its first `limit` characters (an ellipsis past
    them): enough for the model to find the message it begins."""
    line = " ".join(text.split())
    return "«" + (line if len(line) <= limit else line[: limit - 1] + "…") + "»"
