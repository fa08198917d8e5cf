"""aider's chat history (`.aider.chat.history.md`, in the repository aider ran in).

A Markdown log that aider appends to on every launch:

* `# aider chat started at <time>` opens a chat (each launch is a conversation of its own,
  and imports as its own session);
* lines starting with `#### ` are the person's message (one line each; consecutive ones are one
  message);
* lines starting with `>` are aider's own output (commands, warnings, "Applied edit to …") —
  never sent to the model, so not conversation; `> Tokens: 1.8k sent, 653 received.` is the
  usage of the response above it (as aider rounds it), `> Model: …` the model;
* everything else is the model's response, verbatim (edit blocks included).

aider has no tool calls (edits are text the model writes), so a session is plain turns.
"""

from __future__ import annotations

import re
from pathlib import Path

from ..errors import InvalidContent
from .builder import ThreadBuilder
from .files import read_regular
from .jsonio import iso_to_unix
from .plan import MAIN, ImportedSession

_START = re.compile(r"^# aider chat started at (.+?)\s*$")
_MODEL = re.compile(r"^>\s*Model:\s*(\S+)")
_TOKENS = re.compile(r"^>\s*Tokens:\s*([\d.]+)(k?) sent,\s*([\d.]+)(k?) received")


def load(path: Path) -> list[ImportedSession]:
    """Import every chat of an aider history file, one session each."""
    path = Path(path)
    text = read_regular(path).decode("utf-8", errors="replace")
    chats: list[tuple[str, list[str]]] = []
    for line in text.splitlines():
        started = _START.match(line)
        if started:
            chats.append((started.group(1), []))
        elif chats:
            chats[-1][1].append(line)
    if not chats:
        raise InvalidContent(f"{path}: no `# aider chat started at` line", path=str(path))
    sessions = [_chat(path, index, started, lines) for index, (started, lines) in enumerate(chats)]
    kept = [s for s in sessions if s.ops]
    if not kept:
        return sessions[-1:]  # every launch ended before a message: one empty session says so
    return kept


def _chat(path: Path, index: int, started: str, lines: list[str]) -> ImportedSession:
    warnings: list[str] = []
    builder = ThreadBuilder(MAIN, warn=warnings.append)
    at = iso_to_unix(started.replace(" ", "T"))
    user: list[str] = []
    reply: list[str] = []
    title = None
    model = None

    def flush_reply() -> None:
        text = "\n".join(reply).strip()
        reply.clear()
        if text:
            builder.assistant([{"type": "text", "text": text}], timestamp=at)

    def flush_user() -> None:
        nonlocal title
        text = "\n".join(user).strip()
        user.clear()
        if text:
            title = title or text.splitlines()[0][:80]
            builder.user(text, timestamp=at)

    for line in lines:
        if line.startswith("#### "):
            flush_reply()
            user.append(line[5:].rstrip())
            continue
        flush_user()
        if line.startswith(">"):
            named = _MODEL.match(line)
            model = model or (named.group(1) if named else None)
            tokens = _TOKENS.match(line)
            if tokens:
                flush_reply()
                builder.attach_usage(_usage(*tokens.groups()))
            continue
        reply.append(line)
    flush_user()
    flush_reply()
    return ImportedSession(
        source_format="aider",
        source_id=f"{path.name}#{index + 1} {started}",
        ops=builder.finish(),
        model=model,
        title=title,
        warnings=warnings,
    )


def _usage(sent: str, sent_k: str, received: str, received_k: str) -> dict[str, int]:
    def count(value: str, k: str) -> int:
        return round(float(value) * (1000 if k else 1))

    return {"input_tokens": count(sent, sent_k), "output_tokens": count(received, received_k)}
