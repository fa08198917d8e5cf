"""Reading transcript files, and the value conversions every format's importer needs.

A file that cannot be read, or a line that is not a JSON object, raises `InvalidContent` naming
the file (and line): importing half a session silently would make every later step lie. So does
a record of a shape an importer cannot read (a `type` that is an object, a `choices` that is
not a list): `record_at` names its line, and turns what the importer's code would raise on it
into a typed error, never an internal one.

The conversions (`iso_to_unix`, `openai_usage_to_anthropic`, `tool_input`, `as_int`) are shared so
that every format maps timestamps, usage and tool arguments the same way.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import orjson

from ..errors import CompactdError, InvalidContent
from .files import read_regular

__all__ = [
    "Records",
    "as_int",
    "image_block",
    "iso_to_unix",
    "json_type",
    "openai_usage_to_anthropic",
    "read_json_document",
    "read_jsonl",
    "record_at",
    "text_or_none",
    "tool_input",
]

log = logging.getLogger("compactd.import")

SHAPE_ERRORS = (TypeError, KeyError, IndexError, AttributeError, ValueError)
"""What an importer's code raises on a value of a type it did not expect (an object where a
string was, a number where a list was): a record it cannot read."""


class Records(list[dict[str, Any]]):
    """The records of a JSONL file, each knowing the line it was on (`line`)."""

    def __init__(self) -> None:
        super().__init__()
        self._lines: dict[int, int] = {}

    def add(self, record: dict[str, Any], line: int) -> None:
        self.append(record)
        self._lines[id(record)] = line

    def line(self, record: dict[str, Any]) -> int | None:
        return self._lines.get(id(record))


@contextlib.contextmanager
def record_at(path: Path, line: int | None = None, what: str = "a record") -> Iterator[None]:
    """While one record (on `line` of `path`, when known) is imported: a typed error it raises
    names the line, and a shape the importer cannot read is `InvalidContent` naming it."""
    try:
        yield
    except CompactdError as exc:
        if line is not None and "line" not in exc.data:
            exc.message = f"{path}: line {line}: {exc.message}"
            exc.args = (exc.message,)
            exc.data.update(path=str(path), line=line)
        raise
    except SHAPE_ERRORS as exc:
        where = f"{path}: line {line}" if line is not None else str(path)
        log.info("%s: %s of a shape the importer cannot read", where, what, exc_info=True)
        data: dict[str, Any] = {"path": str(path)}
        if line is not None:
            data["line"] = line
        raise InvalidContent(
            f"{where}: {what} of a shape compactd cannot import "
            f"({type(exc).__name__}: {str(exc)[:120]})",
            **data,
        ) from None


def text_or_none(value: Any, field: str) -> str | None:
    """A field that names something (a record's `type`, a call's id): a string or absent;
    anything else is `InvalidContent` naming the field (with `record_at`, the line too)."""
    if value is None or isinstance(value, str):
        return value
    raise InvalidContent(f"`{field}` must be a string, got a JSON {json_type(value)}", field=field)


def json_type(value: Any) -> str:
    """What JSON calls a parsed value's type (for messages: "an object", not "dict")."""
    kinds = {dict: "object", list: "array", bool: "boolean", int: "number", float: "number"}
    return kinds.get(type(value), type(value).__name__)


def read_jsonl(
    path: Path, skip: Callable[[bytes], bool] | None = None, data: bytes | None = None
) -> Records:
    """Parse every line of a JSONL file once; `skip` drops raw lines before parsing them.
    `data`: the file's bytes when the caller read them itself (a file inside the transcript's
    folder, read with `files.read_inside`).

    A line that is not a JSON object (a truncated last line, a corrupt byte) is an error that
    names the line: importing half a session silently would make every later step lie.
    """
    records = Records()
    lines = (_read_bytes(path) if data is None else data).splitlines()
    for number, raw in enumerate(lines, start=1):
        if not raw.strip() or (skip is not None and skip(raw)):
            continue
        try:
            record = orjson.loads(raw)
        except orjson.JSONDecodeError as error:
            hint = " (the file looks truncated)" if number == len(lines) else ""
            raise InvalidContent(
                f"{path}: line {number} is not valid JSON{hint}: {error}",
                path=str(path),
                line=number,
            ) from error
        if not isinstance(record, dict):
            raise InvalidContent(
                f"{path}: line {number} is a JSON {type(record).__name__}, expected an object",
                path=str(path),
                line=number,
            )
        records.add(record, number)
    if not records:
        raise InvalidContent(f"{path}: the transcript has no records", path=str(path))
    return records


def read_json_document(path: Path) -> Any:
    """Parse a file holding one JSON document."""
    try:
        return orjson.loads(_read_bytes(path))
    except orjson.JSONDecodeError as error:
        raise InvalidContent(
            f"{path}: not valid JSON or JSONL (truncated or corrupt?): {error}", path=str(path)
        ) from error


def _read_bytes(path: Path) -> bytes:
    return read_regular(path)


def iso_to_unix(value: Any) -> float | None:
    """ISO-8601 text → unix seconds; a time without a zone is UTC (as the agents write it)."""
    if isinstance(value, int | float) and not isinstance(value, bool):
        return float(value)
    if not isinstance(value, str) or not value:
        return None
    try:
        moment = datetime.fromisoformat(value)
    except ValueError:
        return None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return moment.timestamp()


def openai_usage_to_anthropic(
    prompt_tokens: int, cached_tokens: int, output_tokens: int, cache_write_tokens: int = 0
) -> dict[str, int]:
    """Map OpenAI-style counts to Anthropic's keys.

    OpenAI's prompt count includes the cached part, while Anthropic's `input_tokens` is only the
    uncached part: so `input_tokens = prompt - cached - written`, `cache_read_input_tokens =
    cached`, `cache_creation_input_tokens = written` (0 where the provider does not bill cache
    writes), and the three add up to the whole prompt again, as the engine counts it. Output
    tokens (reasoning included, as OpenAI reports them) stay output tokens.
    """
    cached = max(cached_tokens, 0)
    written = max(cache_write_tokens, 0)
    return {
        "input_tokens": max(prompt_tokens - cached - written, 0),
        "cache_creation_input_tokens": written,
        "cache_read_input_tokens": cached,
        "output_tokens": max(output_tokens, 0),
    }


def tool_input(arguments: Any) -> dict[str, Any]:
    """A tool call's arguments as a `tool_use` input: the JSON object, else `{"raw": text}`.

    Anthropic requires an object; an argument string that is not one (a free-form patch,
    truncated JSON) is kept whole under `raw` rather than guessed at.
    """
    if isinstance(arguments, dict):
        return arguments
    if isinstance(arguments, str):
        try:
            parsed = orjson.loads(arguments)
        except orjson.JSONDecodeError:
            return {"raw": arguments}
        if isinstance(parsed, dict):
            return parsed
    return {"raw": arguments}


def as_int(value: Any) -> int:
    """A recorded count, or 0 when it is missing or not an integer."""
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


def image_block(url: str) -> dict[str, Any]:
    """An image given by URL (a `data:` URL inline, as base64) as an Anthropic image block."""
    if url.startswith("data:") and ";base64," in url:
        media_type, data = url[5:].split(";base64,", 1)
        source = {"type": "base64", "media_type": media_type, "data": data}
        return {"type": "image", "source": source}
    return {"type": "image", "source": {"type": "url", "url": url}}
