"""Token estimates: tiktoken `cl100k_base` from the vocabulary shipped in the package.

Counts are estimates with a known error (providers tokenize differently); `budget.Calibration`
corrects them per model from the usage providers report. The vocabulary is never downloaded:
it is loaded from `data/cl100k_base.tiktoken` and hash-checked.

Callers memoize per node (`Node.cache`), so each node's text is tokenized once; `Counter`
counts encoder calls so a test can hold us to that.
"""

from __future__ import annotations

import binascii
import hashlib
import threading
from importlib import resources
from typing import Any

import orjson
import tiktoken

from . import media

VOCAB_FILE = "cl100k_base.tiktoken"
VOCAB_SHA256 = "223921b76ee99bde995b7ff738513eef100fb51d18c93597a113bcffe865b2a7"
# The cl100k_base split pattern and special tokens, as published with tiktoken (MIT).
_CL100K_PATTERN = (
    r"""'(?i:[sdmt]|ll|ve|re)|[^\r\n\p{L}\p{N}]?+\p{L}++|\p{N}{1,3}+| ?[^\s\p{L}\p{N}]++[\r\n]*+"""
    r"""|\s++$|\s*[\r\n]|\s+(?!\S)|\s"""
)
_CL100K_SPECIAL = {
    "<|endoftext|>": 100257,
    "<|fim_prefix|>": 100258,
    "<|fim_middle|>": 100259,
    "<|fim_suffix|>": 100260,
    "<|endofprompt|>": 100276,
}

# Images and documents are priced by the provider's rule from their bytes (`media`); these are
# what one costs when there are no bytes to read (a URL or file reference): the largest image
# the provider keeps, and a document of `UNKNOWN_DOCUMENT_PAGES` dense pages
IMAGE_TOKENS = media.UNKNOWN_IMAGE_TOKENS
UNKNOWN_DOCUMENT_PAGES = 5
DOCUMENT_TOKENS = UNKNOWN_DOCUMENT_PAGES * (media.page_image_tokens(612, 792) + 3000)
# Framing the provider adds around each message and block (roles, block headers).
MESSAGE_OVERHEAD = 4
BLOCK_OVERHEAD = 3
TOOL_DEF_OVERHEAD = 8

# short strings memoized at most (tool names and markers repeat; unique ids must not pile up
# for the daemon's lifetime)
SMALL_MEMO = 512

_lock = threading.Lock()
_encoding: tiktoken.Encoding | None = None


def vocabulary_path() -> str:
    return str(resources.files("compactd.context").joinpath("data", VOCAB_FILE))


def _load_ranks(path: str) -> dict[bytes, int]:
    """The BPE ranks of the shipped file, hash-checked. Read directly rather than through
    `tiktoken.load.load_tiktoken_bpe`, which also copies the file into tiktoken's cache dir
    (`TIKTOKEN_CACHE_DIR` or the system temp dir): a stray write on every new install."""
    with open(path, "rb") as fh:
        data = fh.read()
    if hashlib.sha256(data).hexdigest() != VOCAB_SHA256:
        raise ValueError(f"hash mismatch for the shipped vocabulary {path}")
    # "token rank" lines: decoded in bulk (`b64decode` per token, with its checks, took 3x
    # as long — the larger part of a read-only command's start)
    fields = data.split()
    return dict(zip(map(binascii.a2b_base64, fields[0::2]), map(int, fields[1::2]), strict=True))


def encoding() -> tiktoken.Encoding:
    """The cl100k_base encoding, loaded once from the shipped file (hash-checked)."""
    global _encoding
    if _encoding is None:
        with _lock:
            if _encoding is None:
                ranks = _load_ranks(vocabulary_path())
                _encoding = tiktoken.Encoding(
                    name="cl100k_base",
                    pat_str=_CL100K_PATTERN,
                    mergeable_ranks=ranks,
                    special_tokens=_CL100K_SPECIAL,
                )
    return _encoding


class Counter:
    """Counts tokens of text; `calls` is how many times the encoder actually ran."""

    def __init__(self) -> None:
        self.calls = 0
        self._small: dict[str, int] = {}
        self._request: dict[str, int] = {}

    def text(self, text: str) -> int:
        if not text:
            return 0
        if len(text) <= 64:  # short strings repeat (names, markers): memoize them globally
            hit = self._small.get(text)
            if hit is not None:
                return hit
        self.calls += 1
        n = len(encoding().encode_ordinary(text))
        if len(text) <= 64:
            if len(self._small) >= SMALL_MEMO:  # bounded: sessions come and go, names stay
                self._small.clear()
            self._small[text] = n
        return n

    def json(self, value: Any) -> int:
        return self.text(orjson.dumps(value).decode())

    def request_text(self, text: str) -> int:
        """Text that comes with every request (system prompt, tool definitions): memoized by
        value, since clients send the same strings again and again."""
        hit = self._request.get(text)
        if hit is None:
            if len(self._request) >= 512:
                self._request.clear()
            hit = self._request[text] = self.text(text)
        return hit

    def system_block(self, block: dict[str, Any]) -> int:
        if block.get("type") == "text":
            return self.request_text(block["text"]) + BLOCK_OVERHEAD
        return self.block(block)

    def tool_definition(self, tool: dict[str, Any]) -> int:
        return self.request_text(orjson.dumps(tool).decode()) + TOOL_DEF_OVERHEAD

    def schema(self, schema: dict[str, Any]) -> int:
        return self.request_text(orjson.dumps(schema).decode())

    def block(self, block: dict[str, Any]) -> int:
        """Tokens of one Anthropic content block as the provider would count it."""
        kind = block.get("type")
        if kind == "text":
            return self.text(block["text"]) + BLOCK_OVERHEAD
        if kind == "thinking":
            return self.text(block["thinking"]) + BLOCK_OVERHEAD
        if kind == "redacted_thinking":
            return len(block["data"]) // 4 + BLOCK_OVERHEAD
        if kind == "image":
            return self.image(block)
        if kind == "document":
            return self.document(block)
        if kind == "tool_use":
            return self.text(block["name"]) + self.json(block["input"]) + BLOCK_OVERHEAD
        if kind == "tool_result":
            return self.result(block.get("content", "")) + BLOCK_OVERHEAD
        return self.json(block) + BLOCK_OVERHEAD

    def image(self, block: dict[str, Any]) -> int:
        """An image by the provider's rule, from its bytes' header (`media`)."""
        source = block.get("source") or {}
        if source.get("type") == "base64" and isinstance(source.get("data"), str):
            return media.base64_image_tokens(source["data"])
        return IMAGE_TOKENS

    def document(self, block: dict[str, Any]) -> int:
        """A document by what it holds: a PDF by its pages (each page's image and its text), a
        plain-text or content document by its text."""
        source = block.get("source") or {}
        kind = source.get("type")
        data = source.get("data")
        extra = sum(
            self.text(v)
            for k, v in block.items()
            if k in ("title", "context") and isinstance(v, str)
        )
        if kind == "base64" and isinstance(data, str):
            return media.base64_pdf_tokens(data) + extra + BLOCK_OVERHEAD
        if kind == "text" and isinstance(data, str):
            return self.text(data) + extra + BLOCK_OVERHEAD
        if kind == "content" and isinstance(source.get("content"), str | list):
            return self.result(source["content"]) + extra + BLOCK_OVERHEAD
        return DOCUMENT_TOKENS

    def result(self, content: Any) -> int:
        if isinstance(content, str):
            return self.text(content)
        return sum(self.block(b) for b in content)


COUNTER = Counter()
"""The process-wide counter (the encoder is thread-safe; the memo tolerates races)."""


def first_tokens(text: str, limit: int) -> str:
    """`text` cut after its first `limit` tokens (whole when it is no longer)."""
    tokens = encoding().encode_ordinary(text)
    return text if len(tokens) <= limit else encoding().decode(tokens[:limit])
