"""Which importer reads a transcript: decided by the file's content, not only its name.

`load_transcript(path)` sniffs the first records and hands the file to the importer of its
format; `detect_format(path)` says which one that is. Unreadable or unknown input raises
`InvalidContent` with a message a person can act on. The format modules are imported only when
their format is met (and never import this module), so detection stays cheap and cycle-free.
"""

from __future__ import annotations

import importlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson

from ..errors import InvalidContent
from ..policy import MAX_IMPORT_BYTES
from .chat import is_chat_message, text_of
from .files import read_limit, read_regular
from .jsonio import read_json_document, record_at
from .plan import ImportedSession

__all__ = ["FORMATS", "detect_format", "load_transcript"]

_PACKAGE = __name__.rpartition(".")[0]

FORMATS: dict[str, str] = {
    "claude-code": f"{_PACKAGE}.claude_code",
    "codex": f"{_PACKAGE}.codex",
    "openhands": f"{_PACKAGE}.openhands",
    "swe-agent": f"{_PACKAGE}.swe_agent",
    "mini-swe-agent": f"{_PACKAGE}.mini_swe_agent",
    "gemini-cli": f"{_PACKAGE}.gemini_cli",
    "cline": f"{_PACKAGE}.cline",
    "aider": f"{_PACKAGE}.aider",
    "messages": f"{_PACKAGE}.messages",
}
"""Format name → module with a `load(path) -> list[ImportedSession]` function."""

FORMAT_NAMES = (
    "Claude Code and Codex sessions, OpenHands, SWE-agent and mini-swe-agent trajectories, "
    "Gemini CLI sessions, Cline/Roo task histories (api_conversation_history.json), aider chat "
    "histories (.aider.chat.history.md), and your own agent's messages (a JSON array of "
    'Anthropic or OpenAI messages, {"messages": [...]}, or chat JSONL, one message a line)'
)
_AIDER_START = b"# aider chat started at"

_CLAUDE_CODE_LINE_TYPES = frozenset(
    {"user", "assistant", "system", "summary", "progress", "file-history-snapshot"}
)
_CODEX_LINE_TYPES = frozenset(
    {"session_meta", "response_item", "event_msg", "turn_context", "compacted"}
)


def load_transcript(path: str | Path, max_bytes: int = MAX_IMPORT_BYTES) -> list[ImportedSession]:
    """Read a transcript of any supported format into its sessions; no file it reads may be
    over `max_bytes` (the policy's `maxImportBytes`)."""
    transcript = Path(path)
    # a shape no importer expected (crafted, or corrupt) is a typed error, never an internal one
    with read_limit(max_bytes), record_at(transcript, what="a transcript"):
        module = importlib.import_module(FORMATS[detect_format(transcript)])
        return module.load(transcript)  # type: ignore[no-any-return]


def detect_format(path: str | Path) -> str:
    """Name the format of a transcript from its first records (its content decides)."""
    transcript = Path(path)
    if read_regular(transcript).lstrip().startswith(_AIDER_START):
        return "aider"
    for record in _leading_records(transcript):
        found = _classify(record)
        if found is not None:
            return found
    raise InvalidContent(
        f"{transcript}: not a transcript format compactd can import; its first records match "
        f"none of them. compactd imports {FORMAT_NAMES}",
        path=str(transcript),
    )


def _task_history(messages: list[dict[str, Any]]) -> bool:
    """Cline's or Roo's: every message stamped with `ts` (newer versions), or a first request
    that is the extension's own `<task>` with its `<environment_details>`."""
    if all("ts" in message for message in messages):
        return True
    first = text_of(messages[0].get("content")) if messages[0].get("role") == "user" else ""
    return first.lstrip().startswith("<task>") and "<environment_details>" in first


def _classify(record: Any) -> str | None:
    if isinstance(record, list):
        events = [event for event in record[:50] if isinstance(event, dict)]
        if events and any("action" in event or "observation" in event for event in events):
            return "openhands"
        if events and all(is_chat_message(event) for event in events):
            return "cline" if _task_history(events) else "messages"
        return None
    if not isinstance(record, dict):
        return None
    if str(record.get("trajectory_format", "")).startswith("mini-swe-agent") or (
        isinstance(record.get("messages"), list) and "info" in record and "trajectory" not in record
    ):
        return "mini-swe-agent"
    if "trajectory" in record or ("history" in record and "info" in record):
        return "swe-agent"
    messages = record.get("messages")
    if isinstance(messages, list):
        heads = [m for m in messages[:20] if isinstance(m, dict)]
        if "sessionId" in record and any(m.get("type") in ("user", "gemini") for m in heads):
            return "gemini-cli"
        if heads and all(is_chat_message(m) for m in heads):
            return "messages"
    if isinstance(record.get("history"), list) and (
        "instance_id" in record or "instruction" in record
    ):
        return "openhands"
    kind = record.get("type")
    if kind in _CODEX_LINE_TYPES and "payload" in record:
        return "codex"
    if kind in _CLAUDE_CODE_LINE_TYPES and any(
        key in record for key in ("sessionId", "uuid", "leafUuid", "messageId")
    ):
        return "claude-code"
    if is_chat_message(record):
        return "messages"  # chat JSONL: this line is one message
    return None


_SNIFF_LINES = 8


def _leading_records(path: Path) -> Iterator[Any]:
    """The first few JSON values of a JSONL file, or the document of a JSON file."""
    data = read_regular(path)  # a regular file under the limit, or a typed error
    seen = 0
    for raw in data.split(b"\n", _SNIFF_LINES * 4)[: _SNIFF_LINES * 4]:
        if not raw.strip():
            continue
        try:
            record = orjson.loads(raw)
        except orjson.JSONDecodeError:
            break
        seen += 1
        yield record
        if seen == _SNIFF_LINES:
            return
    else:
        if not seen:
            raise InvalidContent(f"{path}: the file is empty", path=str(path))
    if not seen:
        # A pretty-printed JSON document (e.g. a SWE-agent .traj) only parses as a whole.
        if data.lstrip()[:1] not in (b"{", b"["):
            raise InvalidContent(
                f"{path}: neither JSON, JSONL nor an aider chat history, so not a transcript "
                f"compactd can import. compactd imports {FORMAT_NAMES}",
                path=str(path),
            )
        yield read_json_document(path)
