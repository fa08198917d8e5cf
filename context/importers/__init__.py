"""Transcript importers: recorded agent sessions → `ImportedSession`s (see `plan.py`).

* `detect.py` — `load_transcript(path)` / `detect_format(path)`: the file's content picks the
  importer; unreadable or unknown input raises `InvalidContent`.
* `jsonio.py` — reading JSON/JSONL transcripts (loudly) and the conversions every format shares.
* `builder.py` — `ThreadBuilder`, through which every importer builds its threads, so pairing,
  ordering and sub-agent functions follow one set of conventions (documented there).
* one module per format: `claude_code.py`, `codex.py`, `openhands.py`, `swe_agent.py`,
  `mini_swe_agent.py`, `gemini_cli.py`, `cline.py`, `aider.py`, `messages.py` (your own agent's
  messages), each with `load(path) -> list[ImportedSession]`; `chat.py` feeds the chat-message
  lists several of them hold; `compaction.py` makes a recorded compaction a summary record.
* `apply.py` — writing an imported session's ops to a session (import) or stepping them (replay).
"""

from __future__ import annotations

from .builder import FunctionRun, ThreadBuilder
from .detect import FORMATS, detect_format, load_transcript
from .jsonio import (
    as_int,
    iso_to_unix,
    openai_usage_to_anthropic,
    read_json_document,
    read_jsonl,
    tool_input,
)

__all__ = [
    "FORMATS",
    "FunctionRun",
    "ThreadBuilder",
    "as_int",
    "detect_format",
    "iso_to_unix",
    "load_transcript",
    "openai_usage_to_anthropic",
    "read_json_document",
    "read_jsonl",
    "tool_input",
]
