"""The OpenAI APIs, read and written: Chat Completions and the Responses API (what Codex
speaks)."""

from __future__ import annotations

from typing import Any

from .anthropic import ApiError

OPENAI_PATHS = ("/v1/chat/completions", "/v1/responses")


def is_openai_path(path: str) -> bool:
    return path.startswith(OPENAI_PATHS)


_OPENAI_TYPES = {
    "invalid_request_error": "invalid_request_error",
    "not_found_error": "invalid_request_error",
    "request_too_large": "invalid_request_error",
    "api_error": "server_error",
}


def error_body(exc: ApiError) -> dict[str, Any]:
    """OpenAI's error shape: `{"error": {message, type, param, code}}`."""
    return {
        "error": {
            "message": exc.message,
            "type": _OPENAI_TYPES.get(exc.kind, exc.kind),
            "param": None,
            "code": "not_found" if exc.status == 404 else None,
        }
    }
