"""Whatever the API takes (32 MB a request) the proxy takes and keeps: six 5 MB images in one
message reach the upstream and stay in the session, whose later turns are managed as ever — on
every wire, streamed and not; a 20 MB text is answered as the API answers it (a prompt far over
the window), not refused for its size. A message the store will not hold (its limit
set lower) is sent on as the client wrote it, for that request only, and the session stays as
it was, and usable."""

from __future__ import annotations

import base64
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx2
import orjson
import pytest

from tests.support.media import png
from tests.support.proxy import ProxyProcess
from tests.support.wires import Wire, reset, upstream_bodies

from .conftest import events_of, proxied, snapshot

IMAGES = 6  # of ~4.9 MB each, base64: 29 MB in one message
TEXT = "".join(
    f"{n:08x} GET /api/items/{n * 7919 % 100_003} 200 {n % 997}ms\n" for n in range(480_000)
)


@pytest.fixture(scope="module")
def image() -> str:
    return base64.b64encode(png(2000, 1840, noise=True)).decode()


@pytest.fixture(scope="module")
def big_proxy(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    with proxied(tmp_path_factory.mktemp("big") / "data") as running:
        yield running


def _images_message(wire: Wire, data: str) -> dict[str, Any]:
    """One user message of six images and a question, as this wire writes it."""
    url = f"data:image/png;base64,{data}"
    if wire.name == "messages":
        source = {"type": "base64", "media_type": "image/png", "data": data}
        parts: list[Any] = [{"type": "image", "source": source} for _ in range(IMAGES)]
        return {"role": "user", "content": [*parts, {"type": "text", "text": "Compare them."}]}
    if wire.name == "chat":
        parts = [{"type": "image_url", "image_url": {"url": url}} for _ in range(IMAGES)]
        return {"role": "user", "content": [*parts, {"type": "text", "text": "Compare them."}]}
    parts = [{"type": "input_image", "image_url": url} for _ in range(IMAGES)]
    return {
        "type": "message",
        "role": "user",
        "content": [*parts, {"type": "input_text", "text": "Compare them."}],
    }


def _answer_and_ask(wire: Wire, text: str) -> list[dict[str, Any]]:
    if wire.name == "messages":
        return [
            {"role": "assistant", "content": [{"type": "text", "text": "They differ."}]},
            {"role": "user", "content": text},
        ]
    if wire.name == "chat":
        return [
            {"role": "assistant", "content": "They differ."},
            {"role": "user", "content": text},
        ]
    return [
        {
            "type": "message",
            "role": "assistant",
            "content": [{"type": "output_text", "text": "They differ."}],
        },
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]},
    ]


def _send(proxy: ProxyProcess, wire: Wire, history: list[dict[str, Any]], session: str) -> Any:
    key = "messages" if wire.name != "responses" else "input"
    body = {**wire.body([]), key: history}
    return httpx2.post(
        proxy.base_url + wire.path,
        content=orjson.dumps(body),
        headers=wire.headers(session),
        timeout=300,
    )


@pytest.mark.parametrize(
    "wire",
    [Wire("messages"), Wire("messages", True), Wire("chat", True), Wire("responses")],
    ids=str,
)
def test_six_big_images_in_one_message_are_taken_and_kept(
    big_proxy: Any, image: str, wire: Wire
) -> None:
    proxy, fakes = big_proxy
    reset(fakes)
    session = f"images-{wire.name}-{int(wire.stream)}"
    history = [_images_message(wire, image)]
    first = _send(proxy, wire, history, session)
    assert first.status_code == 200, first.text[:300]
    history += _answer_and_ask(wire, "And the third one?")
    second = _send(proxy, wire, history, session)
    assert second.status_code == 200, second.text[:300]
    sent = upstream_bodies(fakes, wire)
    assert len(sent) == 2
    assert all(orjson.dumps(body).count(image[:64].encode()) == IMAGES for body in sent)
    if wire.name != "chat":  # a streamed Chat Completions request is not offered recall
        assert b"compactd_recall" in orjson.dumps(sent[-1].get("tools"))  # managed
    kept = [e for e in events_of(proxy.data_dir, session) if e.get("t") == "node"]
    assert orjson.dumps(kept).count(image[:64].encode()) == IMAGES  # stored once
    assert "cannot be kept" not in proxy.log


def test_a_twenty_megabyte_text_is_answered_as_the_api_answers_it(big_proxy: Any) -> None:
    """No store limit stands in the way; the text itself is far over the model's window
    (millions of tokens), so the answer is the API's own, and the refused request wrote
    nothing."""
    proxy, fakes = big_proxy
    reset(fakes)
    wire = Wire("messages", True)
    response = _send(proxy, wire, [{"role": "user", "content": TEXT}], "text-20mb")
    assert response.status_code == 400, response.text[:300]
    error = response.json()["error"]
    assert error["type"] == "invalid_request_error"
    assert error["message"].startswith("prompt is too long: ")
    assert not (proxy.data_dir / "sessions" / "text-20mb.jsonl").exists()
    assert "maxMessageBytes" not in proxy.log


@pytest.mark.parametrize("wire", [Wire("messages"), Wire("chat"), Wire("responses", True)], ids=str)
def test_a_message_the_store_will_not_hold_is_sent_on_and_the_session_stays(
    tmp_path: Path, wire: Wire
) -> None:
    session = f"limited-{wire.name}"
    limit = {"COMPACTD_MAX_MESSAGE_BYTES": str(256 * 1024)}
    with proxied(tmp_path / "data", env=limit) as (proxy, fakes):
        small = _answer_and_ask(wire, "hello")[1:]
        assert _send(proxy, wire, small, session).status_code == 200
        before = snapshot(tmp_path / "data")
        history = [*small, *_answer_and_ask(wire, "x" * 400_000)]
        for _ in range(2):  # that request, and the same history again
            response = _send(proxy, wire, history, session)
            assert response.status_code == 200, response.text[:300]
            sent = upstream_bodies(fakes, wire)[-1]
            assert sent == {**wire.body([]), **_history_key(wire, history)}
        after = snapshot(tmp_path / "data")
        # nothing of the big message was written; the pass-throughs were counted
        log = after.pop(f"sessions/{session}.jsonl")
        assert b"x" * 1000 not in log
        assert log.startswith(before[f"sessions/{session}.jsonl"])
        records = [
            e["r"]
            for e in events_of(tmp_path / "data", session)
            if e.get("t") == "record" and e["r"]["kind"] == "passthrough"
        ]
        assert len(records) == 2 and "maxMessageBytes" in records[0]["data"]["reason"]
        # the session is as usable as before: a request without it is managed
        again = [*small, *_answer_and_ask(wire, "a short question instead")]
        assert _send(proxy, wire, again, session).status_code == 200
        assert b"compactd_recall" in orjson.dumps(upstream_bodies(fakes, wire)[-1])
    assert "maxMessageBytes" in proxy.log


def _history_key(wire: Wire, history: list[dict[str, Any]]) -> dict[str, Any]:
    return {"input" if wire.name == "responses" else "messages": history}
