"""One daemon and one fake Anthropic server for the whole summary suite.

The daemon is the real `compactd serve` process with `--summary-provider anthropic`, pointed at
a `FakeAnthropic` on 127.0.0.1 through `ANTHROPIC_BASE_URL` (the real SDK inside the daemon does
the HTTP). Starting a daemon and importing the SDK in it costs seconds, so they are shared:
every test opens its own session and scripts the fake afresh (`fake` resets it).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
import pytest_asyncio
from compactd.clients.client import CompactdClient
from pytest_asyncio import is_async_test

from tests.support.fake_anthropic import FakeAnthropic, Reply

API_KEY = "test"
HERE = Path(__file__).parent


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The async tests here share the daemon, so they share its event loop."""
    marker = pytest.mark.asyncio(loop_scope="session")
    for item in items:
        if is_async_test(item) and HERE in Path(str(item.path)).parents:
            item.add_marker(marker, append=False)


@pytest.fixture(scope="session")
def fake_server() -> Iterator[FakeAnthropic]:
    with FakeAnthropic(api_key=API_KEY) as server:
        yield server


@pytest.fixture
def fake(fake_server: FakeAnthropic) -> FakeAnthropic:
    """The shared fake, with no recorded requests and nothing scripted."""
    fake_server.reset()
    fake_server.default = Reply.answer()
    fake_server.applied_edits = None
    fake_server.context_window = None
    return fake_server


@pytest.fixture(scope="session")
def daemon_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("summary-daemon")


@pytest_asyncio.fixture(scope="session", loop_scope="session")
async def daemon(fake_server: FakeAnthropic, daemon_dir: Path) -> AsyncIterator[CompactdClient]:
    # hang detectors only: a test of the summary's time bound sets its own
    # (`summaryTimeBoundSeconds` in its session's config)
    client = await spawn_daemon(fake_server, daemon_dir, summarize_timeout=60, timeout=60)
    yield client
    await client.close()


async def spawn_daemon(
    fake_server: FakeAnthropic, data_dir: Path, *, summarize_timeout: float, timeout: float
) -> CompactdClient:
    """A daemon whose `anthropic` summary provider is the fake Messages server."""
    return await CompactdClient.spawn(
        data_dir=str(data_dir),
        args=[
            "--summary-provider",
            "anthropic",
            "--idle-check-seconds",
            "0.2",
            "--summarize-timeout",
            str(summarize_timeout),
            "--no-watch",
        ],
        env={"ANTHROPIC_BASE_URL": fake_server.base_url, "ANTHROPIC_API_KEY": API_KEY},
        timeout=timeout,
    )
