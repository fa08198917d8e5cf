"""The cascade's rules where a real agent meets them, through the real daemon: Tier 5 changes the
request, media count by the provider's rule, Budget Reduction cuts a tool result as a whole, the
latest complete turn stays whole while it fits, the count trigger fires within a bound, bounded
markers, honest markers and a recall that reaches everything a render left out."""

from __future__ import annotations

import math
import re
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
from compactd.clients.client import CompactdClient, RpcError

from tests.support.invariants import check_anthropic_pairing, check_openai_pairing
from tests.support.media import gif, image_block, jpeg, pdf, pdf_block, png, webp

from .conftest import running
from .convo import all_text, assistant, filler, tool_results, tool_turns, tool_use, user

pytestmark = pytest.mark.asyncio(loop_scope="module")

MODEL = "test-model"  # no family prior: the sizes below are compactd's own estimates
HANDLE = re.compile(r"recall:[A-Za-z0-9_.-]+")


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("cascade-rules") / "data"


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def client(data_dir: Path) -> AsyncIterator[CompactdClient]:
    async with running(data_dir, "--summary-provider", "digest") as c:
        yield c


def results_of(request: dict[str, Any]) -> list[Any]:
    return [
        b["content"]
        for m in request["messages"]
        if isinstance(m["content"], list)
        for b in m["content"]
        if b.get("type") == "tool_result"
    ]


def result_text(content: Any) -> str:
    if isinstance(content, str):
        return content
    return "".join(b["text"] for b in content if b.get("type") == "text")


def asks(*blocks: dict[str, Any], text: str = "read it") -> dict[str, Any]:
    """A user message carrying `blocks` (images, documents) and a question."""
    return {"role": "user", "content": [*blocks, {"type": "text", "text": text}]}


def too_long(reported: int, maximum: int) -> dict[str, Any]:
    return {"status": 400, "message": f"prompt is too long: {reported} tokens > {maximum} maximum"}


# ---- Tier 5 ---------------------------------------------------------------------------------


async def test_tier_5_sends_a_smaller_request_when_the_provider_counted_far_more(
    client: CompactdClient,
) -> None:
    """The provider counted 3.5× our estimate (a document we under-counted): the next request
    is verifiably smaller and fits the provider's limit in the provider's own count."""
    sid = "t5-fit"
    await client.open_session(sid)
    await client.append(sid, tool_turns("t5", 6, 3000))
    await client.append(sid, [asks(pdf_block(pdf(1)))])
    window, maximum = 32_000, 32_000
    first = await client.render(sid, window=window, model=MODEL)
    estimate = first.tokens.estimate
    reported = maximum + 1_000
    assert reported / estimate > 2.5  # past the clamp a usage report is held to
    await client.report_usage(sid, MODEL, error=too_long(reported, maximum))
    again = await client.render(sid, window=window, model=MODEL, cascade=True)
    check_anthropic_pairing(again.request)
    reactive = next(e for e in again.events if e.tier == "reactive")
    target = reactive.details["target"]
    assert again.tokens.estimate < estimate  # not the same request again
    assert again.tokens.calibration == pytest.approx(reported / estimate, rel=1e-3)
    assert again.tokens.total <= target  # in the provider's count, under its limit
    assert reactive.tokens_after == again.tokens.total < reactive.tokens_before
    assert not [e for e in again.events if e.applied and e.tokens_after == e.tokens_before]


async def test_tier_5_says_cannot_fit_rather_than_send_the_same_request(
    client: CompactdClient,
) -> None:
    sid = "t5-stuck"
    await client.open_session(sid)
    await client.append(sid, [asks(pdf_block(pdf(2)))])
    first = await client.render(sid, window=32_000, model=MODEL)
    await client.report_usage(sid, MODEL, error=too_long(40_000, 32_000))
    with pytest.raises(RpcError) as caught:
        await client.render(sid, window=32_000, model=MODEL, cascade=True)
    assert caught.value.kind == "cannot_fit"
    assert first.tokens.estimate * 2.5 < 32_000 * 0.95  # the clamp would have let it through


# ---- media ----------------------------------------------------------------------------------


def image_tokens(width: int, height: int) -> int:
    """Anthropic's documented rule, computed here independently: an image over 1568 px on its
    long edge or over ~1,600 tokens is first scaled down (aspect kept) to fit both, then costs
    width × height / 750."""
    scale = min(1.0, 1568 / max(width, height), math.sqrt(1600 * 750 / (width * height)))
    return math.ceil(round(width * scale) * round(height * scale) / 750)


async def test_images_and_pdfs_count_by_the_providers_rule(client: CompactdClient) -> None:
    sid = "media-count"
    await client.open_session(sid)
    await client.append(sid, [user("look"), assistant("ok")])
    base = (await client.measure(sid)).categories["user"]
    images = [
        (image_block(png(1000, 1000)), image_tokens(1000, 1000)),
        (image_block(jpeg(3000, 2000, exif_bytes=9000), "image/jpeg"), image_tokens(3000, 2000)),
        (image_block(gif(200, 200), "image/gif"), image_tokens(200, 200)),
        (image_block(webp(800, 600), "image/webp"), image_tokens(800, 600)),
        # no bytes to read: counted as the largest image the provider keeps
        ({"type": "image", "source": {"type": "url", "url": "https://x.test/a.png"}}, 1600),
    ]
    await client.append(sid, [asks(*(block for block, _ in images), text="?")])
    with_images = (await client.measure(sid)).categories["user"]
    question = with_images - base
    assert question - sum(t for _, t in images) < 30  # the rest is the "?" and its framing

    pages = {}
    for n in (1, 5):
        doc = f"media-pdf-{n}"
        await client.open_session(doc)
        await client.append(doc, [asks(pdf_block(pdf(n)), text="?")])
        measured = await client.measure(doc)
        rendered = await client.render(doc)
        assert measured.total == rendered.tokens.total  # the panel and the budget agree
        pages[n] = measured.categories["user"]
    # a page costs its image (a Letter page at the provider's largest size) and its text
    page_image = image_tokens(1211, 1568)
    assert page_image <= pages[1] < page_image + 100
    assert pages[5] - pages[1] == pytest.approx(4 * pages[1], rel=0.05)


# ---- Budget Reduction -----------------------------------------------------------------------


async def test_budget_reduction_cuts_a_result_of_many_text_blocks(client: CompactdClient) -> None:
    """An MCP tool's result: fifteen text blocks of 1,998 characters, 29,970 in all."""
    sid = "br-blocks"
    await client.open_session(sid)
    parts = [filler(f"part{i}", 1998) for i in range(15)]
    blocks = [{"type": "text", "text": p} for p in parts]
    await client.append(
        sid,
        [
            user("query the index"),
            assistant("querying", tool_use("mcp1", "mcp__index__query", q="all")),
            tool_results(("mcp1", blocks)),
            assistant("done"),
        ],
    )
    joined = "".join(parts)
    anthropic = (await client.render(sid)).request
    (content,) = results_of(anthropic)
    sent = result_text(content)
    assert len(sent) < 4_100
    assert sent.startswith(joined[:2400]) and sent.endswith(joined[-1600:])
    # block boundaries outside the cut are kept: the first block whole, the cut in the second,
    # the tail in the last
    assert len(content) == 3 and content[0]["text"] == parts[0]
    assert content[1]["text"].startswith(parts[1][:402]) and "25,970 characters" in sent
    assert content[2]["text"] == parts[-1][-1600:]
    openai = (await client.render(sid, format="openai")).request
    check_openai_pairing(openai)
    (tool_message,) = [m for m in openai["messages"] if m["role"] == "tool"]
    assert len(tool_message["content"]) < 4_200
    assert joined[2400:2500] not in tool_message["content"]


@pytest.mark.parametrize("size", [4_001, 4_040, 4_201])
async def test_a_result_just_over_the_limit_does_not_grow(
    client: CompactdClient, size: int
) -> None:
    sid = f"br-edge-{size}"
    await client.open_session(sid)
    original = filler("edge", size)
    await client.append(
        sid,
        [
            user("read"),
            assistant("reading", tool_use("e1", "Read", file_path="e.py")),
            tool_results(("e1", original)),
            assistant("read"),
        ],
    )
    for fmt, recall in (("anthropic", False), ("openai", False), ("anthropic", True)):
        request = (await client.render(sid, format=fmt, recall=recall)).request
        text = all_text({"messages": request["messages"]})
        sent = next(
            result_text(c)
            for c in (
                results_of(request)
                if fmt == "anthropic"
                else [m["content"] for m in request["messages"] if m["role"] == "tool"]
            )
        )
        assert len(sent) <= size, fmt
        assert "edge" in text
