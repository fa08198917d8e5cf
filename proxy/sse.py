"""Server-sent events, split as they arrive: the proxy forwards each event the moment its last
line is in (never a partial event, never a buffered answer), and reads what it needs on the way —
the usage, the context edits the provider applied, the calls compactd answers itself."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import attrs
import orjson


@attrs.frozen
class Event:
    raw: bytes  # the event's bytes as they came, its blank line included
    name: str | None  # the `event:` line (Anthropic), None without one (OpenAI)
    data: Any  # the `data:` JSON, or None (`[DONE]`, a comment, a line that is not JSON)
    done: bool = False  # OpenAI's `data: [DONE]`, the end of a Chat Completions stream
    malformed: bool = False  # it has data, and the data is neither JSON nor `[DONE]`


class EventSplitter:
    """Bytes in, whole events out."""

    def __init__(self) -> None:
        self._buffer = b""

    def feed(self, chunk: bytes) -> Iterator[Event]:
        self._buffer += chunk
        while True:
            cut, width = _boundary(self._buffer)
            if cut < 0:
                return
            raw, self._buffer = self._buffer[: cut + width], self._buffer[cut + width :]
            yield parse(raw)

    def rest(self) -> bytes:
        """What came after the last whole event (forwarded as is when the stream ends)."""
        rest, self._buffer = self._buffer, b""
        return rest


def _boundary(buffer: bytes) -> tuple[int, int]:
    """Where the first event ends: the earliest blank line, in any of SSE's line endings."""
    found = [(buffer.find(sep), len(sep)) for sep in (b"\n\n", b"\r\n\r\n", b"\r\r")]
    found = [f for f in found if f[0] >= 0]
    return min(found) if found else (-1, 0)


def parse(raw: bytes) -> Event:
    name: str | None = None
    data_lines: list[bytes] = []
    for line in raw.splitlines():
        if line.startswith(b"event:"):
            name = line[6:].strip().decode("utf-8", "replace")
        elif line.startswith(b"data:"):
            data_lines.append(line[5:].lstrip(b" "))
    if not data_lines:
        return Event(raw, name, None)
    text = b"\n".join(data_lines)
    if text.strip() == b"[DONE]":
        return Event(raw, name, None, done=True)
    try:
        return Event(raw, name, orjson.loads(text))
    except orjson.JSONDecodeError:
        return Event(raw, name, None, malformed=True)


def encode(name: str | None, data: Any) -> bytes:
    """One event as the provider writes it (`event:` line only where it has a name)."""
    head = f"event: {name}\n".encode() if name else b""
    return head + b"data: " + orjson.dumps(data) + b"\n\n"
