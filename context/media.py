"""What images and documents cost, by the provider's rule, read from the bytes they carry.

Anthropic prices an image by its area after resizing: "If your image's long edge is more than
1568 pixels, or your image is more than ~1,600 tokens, it will first be scaled down, preserving
aspect ratio, until it's within the size limits", then "tokens = (width px * height px)/750"
(https://docs.anthropic.com/en/docs/build-with-claude/vision, "Evaluate image size" and
"Calculate image costs"). A PDF is priced per page, text and image: "Each page typically uses
1,500-3,000 tokens per page depending on content density" for its text, and "since each page
is converted into an image, the same image-based cost calculations are applied"
(https://docs.anthropic.com/en/docs/build-with-claude/pdf-support, "Estimate your costs").

Sizes come from the headers of the bytes themselves (PNG, JPEG, GIF, WebP; a PDF's page
objects, its `MediaBox`es and the strings its pages show), with no imaging library: a header is
all a price needs. What cannot be read — a URL or file reference, bytes that are not what they
claim — is counted conservatively: an image as the largest one the provider keeps, a document
by its size in bytes.
"""

from __future__ import annotations

import base64
import binascii
import math
import re
import struct
import zlib

MAX_LONG_EDGE = 1568
MAX_IMAGE_TOKENS = 1600  # "~1,600 tokens": past it an image is scaled down
PIXELS_PER_TOKEN = 750
UNKNOWN_IMAGE_TOKENS = MAX_IMAGE_TOKENS  # no size to read: the most an image can cost
POINTS_PER_INCH = 72
# a page's text when none can be read from it (a scan, an encoding this reader does not
# follow): the low end of the documented 1,500–3,000, since the page's image is counted too
UNREAD_PAGE_TEXT_TOKENS = 1500
BYTES_PER_UNCOUNTED_PAGE = 3000  # a PDF whose pages cannot be counted: one per 3 KB
CHARS_PER_TEXT_TOKEN = 4  # a page's text is read as bytes, not tokenized: this many a token
HEADER_BYTES = 1 << 16  # what is decoded first to find an image's size


def image_tokens(width: int, height: int) -> int:
    """Tokens of a `width` × `height` image after the provider's resizing."""
    if width <= 0 or height <= 0:
        return UNKNOWN_IMAGE_TOKENS
    scale = min(
        1.0,
        MAX_LONG_EDGE / max(width, height),
        math.sqrt(MAX_IMAGE_TOKENS * PIXELS_PER_TOKEN / (width * height)),
    )
    w, h = round(width * scale), round(height * scale)
    return max(1, math.ceil(w * h / PIXELS_PER_TOKEN))


# ---- images -----------------------------------------------------------------------------------


def image_size(data: bytes) -> tuple[int, int] | None:
    """(width, height) from a PNG, JPEG, GIF or WebP header; None when it is none of them or
    the header is cut short."""
    try:
        if data.startswith(b"\x89PNG\r\n\x1a\n") and data[12:16] == b"IHDR":
            return struct.unpack(">II", data[16:24])  # type: ignore[return-value]
        if data[:6] in (b"GIF87a", b"GIF89a"):
            return struct.unpack("<HH", data[6:10])  # type: ignore[return-value]
        if data.startswith(b"\xff\xd8"):
            return _jpeg_size(data)
        if data[:4] == b"RIFF" and data[8:12] == b"WEBP":
            return _webp_size(data)
    except struct.error:
        return None
    return None


# JPEG start-of-frame markers (every SOFn but DHT, JPG and DAC)
_SOF = frozenset(range(0xC0, 0xD0)) - {0xC4, 0xC8, 0xCC}


def _jpeg_size(data: bytes) -> tuple[int, int] | None:
    at = 2
    while at + 4 <= len(data):
        if data[at] != 0xFF:
            return None
        marker = data[at + 1]
        if marker == 0xFF:  # fill byte
            at += 1
            continue
        if marker in (0xD8, 0x01) or 0xD0 <= marker <= 0xD7:  # no length
            at += 2
            continue
        (length,) = struct.unpack(">H", data[at + 2 : at + 4])
        if marker in _SOF:
            height, width = struct.unpack(">HH", data[at + 5 : at + 9])
            return width, height
        at += 2 + length
    return None


def _webp_size(data: bytes) -> tuple[int, int] | None:
    kind = data[12:16]
    if kind == b"VP8X":
        width = int.from_bytes(data[24:27], "little") + 1
        height = int.from_bytes(data[27:30], "little") + 1
        return width, height
    if kind == b"VP8L" and data[20] == 0x2F:
        bits = int.from_bytes(data[21:25], "little")
        return (bits & 0x3FFF) + 1, ((bits >> 14) & 0x3FFF) + 1
    if kind == b"VP8 " and data[23:26] == b"\x9d\x01\x2a":
        width, height = struct.unpack("<HH", data[26:30])
        return width & 0x3FFF, height & 0x3FFF
    return None


def _decoded(data: str, chars: int | None = None) -> bytes | None:
    """The bytes of base64 `data` (its first `chars` characters only, when given)."""
    piece = data if chars is None else data[: chars - chars % 4]
    try:
        return base64.b64decode(piece, validate=False)
    except (binascii.Error, ValueError):
        return None


def base64_image_tokens(data: str) -> int:
    """Tokens of a base64 image: its header is decoded (more of it only for a JPEG whose frame
    header sits behind large metadata)."""
    chars = HEADER_BYTES
    while True:
        raw = _decoded(data, chars)
        size = image_size(raw) if raw else None
        if size is not None:
            return image_tokens(*size)
        if chars >= len(data) or raw is None or not raw.startswith(b"\xff\xd8"):
            return UNKNOWN_IMAGE_TOKENS
        chars *= 4


# ---- PDFs -------------------------------------------------------------------------------------

_PAGE = re.compile(rb"/Type\s*/Page(?![a-zA-Z])")
_MEDIA_BOX = re.compile(rb"/MediaBox\s*\[\s*(-?[\d.]+)\s+(-?[\d.]+)\s+(-?[\d.]+)\s+(-?[\d.]+)\s*\]")
_STREAM = re.compile(rb"stream\r?\n(.*?)\r?\nendstream", re.DOTALL)
_SHOWN = re.compile(rb"\((?:\\.|[^\\)])*\)|<[0-9A-Fa-f\s]*>")
_SHOW_OPS = re.compile(rb"\bT[Jj]\b|'|\"")


def pdf_pages(data: bytes) -> tuple[list[tuple[float, float]], int]:
    """Each page's size in points (from its own `MediaBox`, or the document's first) and how
    many characters of text the pages show. Page objects inside compressed object streams
    are found by inflating those streams."""
    bodies = [data]
    for match in _STREAM.finditer(data):
        try:
            bodies.append(zlib.decompress(match.group(1)))
        except zlib.error:
            continue
    sizes: list[tuple[float, float]] = []
    default: tuple[float, float] | None = None
    shown = 0
    for body in bodies:
        for match in _MEDIA_BOX.finditer(body):
            x0, y0, x1, y1 = (float(v) for v in match.groups())
            default = default or (abs(x1 - x0), abs(y1 - y0))
        for match in _PAGE.finditer(body):
            sizes.append(_nearest_box(body, match.start()))
        if b"BT" in body:
            shown += _shown_chars(body)
    letter = (612.0, 792.0)
    return [s if s != (0.0, 0.0) else default or letter for s in sizes], shown


def _nearest_box(body: bytes, at: int) -> tuple[float, float]:
    """The `MediaBox` closest to a page's `/Type /Page` (in its dictionary, before or after
    it); (0, 0) when the page inherits one."""
    best: tuple[int, tuple[float, float]] | None = None
    for match in _MEDIA_BOX.finditer(body, max(0, at - 400), at + 400):
        x0, y0, x1, y1 = (float(v) for v in match.groups())
        distance = abs(match.start() - at)
        if best is None or distance < best[0]:
            best = (distance, (abs(x1 - x0), abs(y1 - y0)))
    return best[1] if best is not None else (0.0, 0.0)


def _shown_chars(content: bytes) -> int:
    """Characters a content stream shows with its text operators: literal strings by their
    bytes, hex strings at two bytes a glyph (the common CID encoding)."""
    total = 0
    for block in content.split(b"BT")[1:]:
        block = block.split(b"ET", 1)[0]
        if not _SHOW_OPS.search(block):
            continue
        for piece in _SHOWN.findall(block):
            if piece.startswith(b"("):
                total += len(piece) - 2
            else:
                total += len(re.sub(rb"\s", b"", piece[1:-1])) // 4
    return total


def page_image_tokens(width_pt: float, height_pt: float) -> int:
    """A page rendered as an image at the largest size the provider keeps."""
    if width_pt <= 0 or height_pt <= 0:
        width_pt, height_pt = 612.0, 792.0
    scale = 4 * MAX_LONG_EDGE / max(width_pt, height_pt)  # render large; the rule scales down
    return image_tokens(round(width_pt * scale), round(height_pt * scale))


def pdf_tokens(data: bytes) -> int:
    """Every page's image plus the text the pages show; a document of no readable text counts
    `UNREAD_PAGE_TEXT_TOKENS` a page for it. Pages that cannot be counted: by size."""
    sizes, shown = pdf_pages(data)
    if not sizes:
        pages = max(1, len(data) // BYTES_PER_UNCOUNTED_PAGE)
        return pages * (page_image_tokens(612.0, 792.0) + UNREAD_PAGE_TEXT_TOKENS)
    images = sum(page_image_tokens(w, h) for w, h in sizes)
    if shown:
        text = math.ceil(shown / CHARS_PER_TEXT_TOKEN)
    else:
        text = UNREAD_PAGE_TEXT_TOKENS * len(sizes)
    return images + text


def base64_pdf_tokens(data: str) -> int:
    return pdf_tokens(_decoded(data) or b"")
