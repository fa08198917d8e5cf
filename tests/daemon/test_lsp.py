"""The daemon as an editor sees it: pytest-lsp's `LanguageClient` over stdio, with the LSP
lifecycle (`initialize` … `shutdown`/`exit`), custom methods, errors, notifications and
work-done progress. One daemon for the module (notes/pygls.md §9: module scope *and* the
module's loop, or the fixture hangs)."""

from __future__ import annotations

import asyncio
import shutil
import tempfile
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import pytest_lsp
from lsprotocol import types as lsp
from lsprotocol.converters import get_converter
from pygls.exceptions import JsonRpcException
from pytest_lsp import ClientServerConfig, LanguageClient

from .convo import tool_turns, user
from .wire import serve_command

pytestmark = pytest.mark.asyncio(loop_scope="module")

TIMEOUT = 60.0
# pytest-lsp builds the server command when this module is imported, before any fixture runs;
# the daemon creates the folder when it starts, and the fixture removes it
DATA_DIR = Path(tempfile.gettempdir()) / f"compactd-lsp-{uuid.uuid4().hex}" / "data"


def make_client() -> LanguageClient:
    """pytest-lsp's client with lsprotocol's converter: custom results stay plain dicts
    (its default converter would turn them into namedtuples)."""
    client = LanguageClient(converter_factory=get_converter)
    pytest_lsp.client.register_lsp_features(client)
    client.compacted: list[dict[str, Any]] = []  # type: ignore[misc]

    @client.feature("context/compacted")
    def compacted(params: Any) -> None:
        client.compacted.append(params)  # type: ignore[attr-defined]

    return client


@pytest_lsp.fixture(
    scope="module",
    config=ClientServerConfig(
        server_command=serve_command(DATA_DIR, "--summary-provider", "digest"),
        client_factory=make_client,
    ),
)
async def client(lsp_client: LanguageClient) -> AsyncIterator[None]:
    result = await asyncio.wait_for(
        lsp_client.initialize_session(lsp.InitializeParams(capabilities=lsp.ClientCapabilities())),
        TIMEOUT,
    )
    lsp_client.init_result = result  # type: ignore[attr-defined]
    yield
    await asyncio.wait_for(lsp_client.shutdown_session(), TIMEOUT)
    server = lsp_client._server
    assert server is not None and server.returncode == 0, "shutdown + exit must exit 0"
    shutil.rmtree(DATA_DIR.parent, ignore_errors=True)


async def rpc(client: LanguageClient, method: str, params: dict[str, Any]) -> Any:
    """A custom method through pygls' own client, with the timeout it lacks."""
    return await asyncio.wait_for(client.protocol.send_request_async(method, params), TIMEOUT)


def plain(value: Any) -> Any:
    """Results as JSON values, whatever the converter hands back."""
    return get_converter().unstructure(value) if not isinstance(value, dict | list) else value


async def test_initialize_names_the_server(client: LanguageClient) -> None:
    result = client.init_result  # type: ignore[attr-defined]
    assert result.server_info is not None
    assert result.server_info.name == "compactd"
    assert result.server_info.version


async def test_custom_methods_speak_camel_case(client: LanguageClient) -> None:
    opened = plain(await rpc(client, "session/open", {"sessionId": "lsp-1"}))
    assert opened == {"sessionId": "lsp-1", "branch": "main", "head": None, "created": True}
    appended = plain(
        await rpc(client, "session/append", {"sessionId": "lsp-1", "messages": [user("hello")]})
    )
    assert appended["head"] == appended["nodeIds"][-1]
    rendered = plain(
        await rpc(client, "context/render", {"sessionId": "lsp-1", "maxOutputTokens": 1000})
    )
    assert rendered["request"]["messages"][0]["content"][0]["text"] == "hello"
    assert rendered["request"]["max_tokens"] == 1000  # the request body keeps the provider's names
    assert rendered["tokens"]["outputReserve"] == 1000
    assert rendered["events"] == []


async def test_compactd_error_codes_reach_the_client(client: LanguageClient) -> None:
    with pytest.raises(JsonRpcException) as caught:
        await rpc(client, "context/render", {"sessionId": "no-such-session"})
    assert caught.value.code == 4004
    assert caught.value.data == {"kind": "unknown_session", "sessionId": "no-such-session"}


async def test_invalid_params_name_the_field(client: LanguageClient) -> None:
    with pytest.raises(JsonRpcException) as caught:
        await rpc(client, "context/render", {"sessionId": "lsp-1", "maxOutputTokens": "many"})
    assert caught.value.code == -32602
    assert "maxOutputTokens" in str(caught.value)


async def test_compact_reports_progress_and_notifies(client: LanguageClient) -> None:
    await rpc(client, "session/open", {"sessionId": "lsp-2"})
    await rpc(
        client,
        "session/append",
        {"sessionId": "lsp-2", "messages": tool_turns("l", 6, 1500, "Deploy")},
    )
    token = "lsp-compact-1"
    client.progress_reports[token] = []  # a client-chosen token (notes/pygls.md §9 gotcha 5)
    notified = client.protocol.wait_for_notification_async("context/compacted")
    result = plain(
        await rpc(client, "context/compact", {"sessionId": "lsp-2", "workDoneToken": token})
    )
    assert result["applied"] is True
    assert result["tokensAfter"] < result["tokensBefore"]
    note = plain(await asyncio.wait_for(notified, TIMEOUT))
    assert note["sessionId"] == "lsp-2"
    assert note["tier"] == "summary" and note["applied"] is True
    assert note in [plain(n) for n in client.compacted]  # type: ignore[attr-defined]
    kinds = [type(r).__name__ for r in client.progress_reports[token]]
    assert kinds[0] == "WorkDoneProgressBegin"
    assert kinds[-1] == "WorkDoneProgressEnd"


async def test_no_show_message_is_ever_sent(client: LanguageClient) -> None:
    # provoke every kind of error answer first, then look at what the editor would have shown
    for method, params in [
        ("no/such/method", {}),
        ("session/get", {"sessionId": "../escape"}),
        ("session/append", {"sessionId": "lsp-1", "messages": "not a list"}),
    ]:
        with pytest.raises(JsonRpcException):
            await rpc(client, method, params)
    status = plain(await rpc(client, "daemon/status", {}))
    assert "lsp-1" in status["loadedSessions"]
    assert client.messages == []
