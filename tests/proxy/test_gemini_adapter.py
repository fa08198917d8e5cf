"""The Gemini adapter's pure functions: a request's contents read into the session's blocks and
written back unchanged (thought signatures, ids, images and parts the engine has no block for
byte for byte), the API's pairing rules, its usage and its error shape."""

from __future__ import annotations

from typing import Any

import orjson
import pytest
from compactd.context.decompose import from_anthropic
from compactd.proxy import gemini
from compactd.proxy.wire import ApiError

from tests.support.fake_gemini import request_error, signature_of

SIGNATURE = signature_of("0a1b2c3d", 0)


def conversation() -> list[dict[str, Any]]:
    """What Gemini CLI sends: a prompt, a signed call with its id, its response, a picture,
    a thought, a second call without an id, and a part of a kind the engine does not know."""
    return [
        {
            "role": "user",
            "parts": [{"text": "<session_context>…</session_context>"}, {"text": "go"}],
        },
        {
            "role": "model",
            "parts": [
                {"text": "thinking it over", "thought": True},
                {
                    "functionCall": {
                        "id": "run_shell_command_1_0",
                        "name": "run_shell_command",
                        "args": {"command": "ls"},
                    },
                    "thoughtSignature": SIGNATURE,
                },
            ],
        },
        {
            "role": "user",
            "parts": [
                {
                    "functionResponse": {
                        "id": "run_shell_command_1_0",
                        "name": "run_shell_command",
                        "response": {"output": "a\nb\n"},
                    }
                }
            ],
        },
        {
            "role": "user",
            "parts": [
                {"text": "and this picture"},
                {"inlineData": {"mimeType": "image/png", "data": "iVBORw0KGgo="}},
            ],
        },
        {
            "role": "model",
            "parts": [
                {"functionCall": {"name": "read_file", "args": {"path": "x"}}},
                {"executableCode": {"language": "PYTHON", "code": "print(1)"}},
            ],
        },
        {
            "role": "user",
            "parts": [{"functionResponse": {"name": "read_file", "response": {"content": [1]}}}],
        },
    ]


def test_a_conversation_comes_back_byte_for_byte() -> None:
    contents = conversation()
    messages = gemini.contents_to_messages(contents)
    assert orjson.dumps(gemini.messages_to_contents(messages)) == orjson.dumps(contents)


def test_the_messages_are_what_the_engine_takes() -> None:
    messages = gemini.contents_to_messages(conversation())
    specs = from_anthropic(messages)
    assert specs  # the engine decomposes them: calls paired with their results
    uses = [b for m in messages for b in m["content"] if b["type"] == "tool_use"]
    results = [b for m in messages for b in m["content"] if b["type"] == "tool_result"]
    assert [u["id"] for u in uses] == [r["tool_use_id"] for r in results]
    assert uses[0]["gemini"]["part"]["thoughtSignature"] == SIGNATURE
    assert any(b["type"] == "image" for m in messages for b in m["content"])


def test_a_cleared_result_goes_back_as_the_output_and_keeps_the_signature() -> None:
    messages = gemini.contents_to_messages(conversation())
    result = messages[2]["content"][0]
    result["content"] = "[cleared by compactd]"
    contents = gemini.messages_to_contents(messages)
    assert contents[2]["parts"][0]["functionResponse"] == {
        "name": "run_shell_command",
        "response": {"output": "[cleared by compactd]"},
        "id": "run_shell_command_1_0",
    }
    assert contents[1]["parts"][1]["thoughtSignature"] == SIGNATURE
    assert request_error({"contents": contents}, {SIGNATURE}) is None


def test_what_goes_back_holds_the_apis_pairing_rules() -> None:
    contents = gemini.messages_to_contents(gemini.contents_to_messages(conversation()))
    assert request_error({"contents": contents}, {SIGNATURE}) is None


@pytest.mark.parametrize(
    ("contents", "words"),
    [
        (
            [{"role": "user", "parts": [{"functionResponse": {"name": "f", "response": {}}}]}],
            "comes immediately after a function call turn",
        ),
        (
            [
                {"role": "user", "parts": [{"text": "go"}]},
                {"role": "model", "parts": [{"functionCall": {"name": "f", "args": {}}}] * 2},
                {"role": "user", "parts": [{"functionResponse": {"name": "f", "response": {}}}]},
            ],
            "number of function response parts",
        ),
        ([{"role": "system", "parts": [{"text": "x"}]}], "valid role"),
        ([{"role": "user", "parts": []}], "must not be empty"),
    ],
)
def test_a_broken_history_is_refused_in_the_apis_words(
    contents: list[dict[str, Any]], words: str
) -> None:
    with pytest.raises(ApiError) as caught:
        gemini.contents_to_messages(contents)
    body = gemini.error_body(caught.value)
    assert body["error"]["code"] == 400
    assert body["error"]["status"] == "INVALID_ARGUMENT"
    assert words in body["error"]["message"]


def test_usage_separates_the_implicit_cache() -> None:
    metadata = {"promptTokenCount": 5000, "cachedContentTokenCount": 4096, "totalTokenCount": 1}
    assert gemini.usage(metadata) == {"input_tokens": 904, "cache_read_input_tokens": 4096}
    assert gemini.usage({"promptTokenCount": 12}) == {
        "input_tokens": 12,
        "cache_read_input_tokens": 0,
    }
    assert gemini.usage({}) is None


def test_the_overflow_refusal_names_both_numbers() -> None:
    message = "The input token count (70123) exceeds the maximum number of tokens allowed (64000)."
    assert gemini.overflow_numbers(message) == (70123, 64000)


def test_the_session_key_is_the_conversations_start() -> None:
    body = {"systemInstruction": {"parts": [{"text": "s"}]}, "contents": conversation()}
    longer = {**body, "contents": [*conversation(), {"role": "user", "parts": [{"text": "more"}]}]}
    assert gemini.session_key(body) == gemini.session_key(longer)
    other = {**body, "contents": [{"role": "user", "parts": [{"text": "another"}]}]}
    assert gemini.session_key(other) != gemini.session_key(body)


def test_a_shortened_call_keeps_its_signature_and_id() -> None:
    messages = gemini.contents_to_messages(conversation())
    messages[1]["content"][1]["input"] = {"command": "[shortened]"}
    part = gemini.messages_to_contents(messages)[1]["parts"][1]
    assert part["functionCall"]["args"] == {"command": "[shortened]"}
    assert part["functionCall"]["id"] == "run_shell_command_1_0"
    assert part["thoughtSignature"] == SIGNATURE


def test_a_response_sent_twice_on_resume_is_kept_once() -> None:
    """Gemini CLI's `--resume` sends each function response twice, with the call's id (the
    copies may differ): the API pairs by count and would refuse it; compactd sends the first."""
    contents = conversation()[:3]
    again = {"functionResponse": {**contents[2]["parts"][0]["functionResponse"], "response": {}}}
    contents[2] = {"role": "user", "parts": [*contents[2]["parts"], again]}
    assert request_error({"contents": contents}, {SIGNATURE}) is not None
    sent = gemini.messages_to_contents(gemini.contents_to_messages(contents))
    assert sent == conversation()[:3]
    assert request_error({"contents": sent}, {SIGNATURE}) is None
