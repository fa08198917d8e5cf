"""What the loopback upstreams do to break as networks do: reset a connection, fall silent
until the client leaves, send an event that is not JSON, close a stream where it stands.

A stream breaks after `at` of its events, a whole answer after `at` bytes of its body; the
fakes (`fake_anthropic`, `fake_openai`) script which answer breaks how.
"""

from __future__ import annotations

import contextlib
import select
import socket
import struct
import threading
from collections.abc import Callable

FAULTS = ("reset", "silence", "malformed", "end")


def check(fault: str) -> str:
    if fault not in FAULTS:
        raise ValueError(f"unknown fault {fault!r} (one of {', '.join(FAULTS)})")
    return fault


def reset(connection: socket.socket) -> None:
    """Reset the connection (an RST, not a FIN): what a dropped network path looks like."""
    with contextlib.suppress(OSError):
        connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        connection.close()


def wait_for_hang_up(connection: socket.socket, stopping: threading.Event) -> None:
    """Send nothing until the client closes its end or `stopping` is set."""
    while not stopping.is_set():
        ready, _, _ = select.select([connection], [], [], 0.05)
        if not ready:
            continue
        try:
            if not connection.recv(1, socket.MSG_PEEK):
                return  # the client closed its end
        except OSError:
            return
        stopping.wait(0.05)


class Silences:
    """How many answers are being held silent right now (their clients still connected)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._count = 0

    @property
    def count(self) -> int:
        with self._lock:
            return self._count

    def hold(self, connection: socket.socket, stopping: threading.Event) -> None:
        with self._lock:
            self._count += 1
        try:
            wait_for_hang_up(connection, stopping)
        finally:
            with self._lock:
                self._count -= 1


MALFORMED = b'data: {"type": "content_block_delta", "index": 0, "delta": {"ty\n\n'
"""An event cut inside its JSON, as a broken proxy or a corrupted path delivers it."""


def send_whole_broken(
    write: Callable[[bytes], None],
    connection: socket.socket,
    data: bytes,
    fault: str,
    at: int,
    silences: Silences,
    stopping: threading.Event,
) -> None:
    """The rest of a whole answer whose headers (with `len(data)` as its length) are sent: a
    `malformed` body is cut in half and its length says so; the others stop after `at` bytes
    and reset, fall silent, or close cleanly short of the length."""
    if fault == "malformed":
        write(data)
        return
    write(data[: min(at, len(data) - 1)])
    if fault == "silence":
        silences.hold(connection, stopping)
    elif fault == "end":
        with contextlib.suppress(OSError):
            connection.shutdown(socket.SHUT_RDWR)
        return
    reset(connection)
