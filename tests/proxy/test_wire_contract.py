"""Every wire's adapter keeps the same contract with the shared path: its "prompt too long" is
read back by its own overflow reader, with both numbers where its words carry them (so the
agent's reaction and compactd's Tier 5 see the same refusal); a failure is said in its API's
error shape with the message in it; its routes are its own (no two wires answer one path and
method unless the client's headers tell them apart); a refusal on its paths takes its shape."""

from __future__ import annotations

import orjson
import pytest
from compactd.context.errors import CannotFit
from compactd.proxy.wire import ApiError, Wire
from compactd.proxy.wires import WIRES, wire_for_path

IDS = [wire.name for wire in WIRES]


@pytest.mark.parametrize("wire", WIRES, ids=IDS)
def test_its_prompt_too_long_is_read_back_as_an_overflow(wire: Wire) -> None:
    refusal = wire.too_long(CannotFit("over", limit=64_000, tokens=70_123))
    assert refusal.status == 400
    overflow = wire.overflow(400, orjson.dumps(wire.error_body(refusal)))
    assert overflow is not None
    if wire.name != "responses":  # the Responses API's words carry no numbers
        assert (overflow.prompt_tokens, overflow.limit_tokens) == (70_123, 64_000)
    assert wire.overflow(400, orjson.dumps(wire.error_body(ApiError(400, "x", "bad")))) is None


@pytest.mark.parametrize("wire", WIRES, ids=IDS)
@pytest.mark.parametrize("status", [400, 404, 408, 429, 500, 502])
def test_a_failure_is_in_its_apis_error_shape(wire: Wire, status: int) -> None:
    kinds = {
        400: "invalid_request_error",
        404: "not_found_error",
        408: "timeout_error",
        429: "rate_limit_error",
    }
    body = wire.error_body(ApiError(status, kinds.get(status, "api_error"), "it broke"))
    error = body["error"]
    assert isinstance(error, dict) and error["message"] == "it broke"
    assert orjson.loads(orjson.dumps(body)) == body


def test_no_two_wires_answer_one_route_unless_the_headers_tell_them_apart() -> None:
    owners: dict[tuple[str, str], list[Wire]] = {}
    for wire in WIRES:
        for route in wire.routes():
            owners.setdefault((route.method, route.path), []).append(wire)
    for (method, path), wires in owners.items():
        if len(wires) > 1:  # a model list: each but the last claims by the client's headers
            assert method == "GET", path
            assert any(not w.claims({}) for w in wires[:-1]), path


@pytest.mark.parametrize(
    ("path", "name"),
    [
        ("/v1/messages", "anthropic"),
        ("/v1/responses", "responses"),
        ("/v1/chat/completions", "chat"),
        ("/v1beta/models/gemini-2.5-pro:streamGenerateContent", "gemini"),
        ("/v1/models/gemini-2.5-pro:generateContent", "gemini"),
    ],
)
def test_a_refusal_on_a_path_takes_its_wires_shape(path: str, name: str) -> None:
    assert wire_for_path(path).name == name
