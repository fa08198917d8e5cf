"""The wires the proxy speaks, one adapter each, in the order a path two of them share (a model
list) is offered to them. A new API is a new adapter here; nothing else in the shared path
names one."""

from __future__ import annotations

from collections.abc import Mapping

from .anthropic import AnthropicWire
from .chat import ChatWire
from .gemini import GeminiWire
from .responses import ResponsesWire
from .wire import Wire

WIRES: tuple[Wire, ...] = (AnthropicWire(), ResponsesWire(), ChatWire(), GeminiWire())
BY_NAME = {wire.name: wire for wire in WIRES}


def secrets(headers: Mapping[str, str], query: Mapping[str, str]) -> list[str]:
    """Every secret a request carries, on any wire (each is scrubbed from logs and bodies)."""
    return [s for wire in WIRES for s in wire.secrets(headers, query)]


def wire_for_path(path: str) -> Wire:
    """The wire whose error shape refusals on `path` take (the Messages API's by default)."""
    return next((w for w in WIRES if w.owns(path)), WIRES[0])
