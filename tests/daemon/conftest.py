"""Fixtures of the daemon end-to-end tests: real `compactd serve` processes on temp data dirs.

A spawn costs about a second and a half here, so most modules share one daemon (module scope,
with the module's event loop: `pytestmark = pytest.mark.asyncio(loop_scope="module")`) and give
each test its own session ids. Every daemon a fixture starts must end with exit code 0.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Iterator, Sequence
from contextlib import asynccontextmanager
from pathlib import Path

import pytest
from compactd.clients.client import CompactdClient

from tests.support import postgres

from .wire import serve_command

CALL_TIMEOUT = 60.0  # a hang detector: a busy machine answers well inside it
ON_POSTGRES = os.environ.get("COMPACTD_TEST_STORE") == "postgres"
"""`COMPACTD_TEST_STORE=postgres` (`make test` does a second run so): every daemon these tests
start gets `--store` on a database of its data dir's own; tests of the files themselves skip."""


@pytest.fixture(scope="session", autouse=True)
def _daemons_on_postgres(request: pytest.FixtureRequest) -> Iterator[None]:
    if not ON_POSTGRES:
        yield
        return
    postgres.DAEMON_CLUSTER = request.getfixturevalue("pg_cluster")
    try:
        yield
    finally:
        postgres.DAEMON_CLUSTER = None
        postgres.DAEMON_STORES.clear()


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    if ON_POSTGRES:
        skip = pytest.mark.skip(reason="reads or writes the JSONL files themselves")
        for item in items:
            if item.get_closest_marker("files_only"):
                item.add_marker(skip)


async def spawn(data_dir: Path, *serve_args: str, timeout: float = CALL_TIMEOUT) -> CompactdClient:
    """A `CompactdClient` on a fresh daemon (the product's own Python client)."""
    command = serve_command(data_dir, *serve_args)
    # CompactdClient.spawn appends `serve` itself: hand it everything before that
    at = command.index("serve")
    return await CompactdClient.spawn(command[:at], args=command[at + 1 :], timeout=timeout)


@asynccontextmanager
async def running(data_dir: Path, *serve_args: str) -> AsyncIterator[CompactdClient]:
    """A daemon for the length of a block; it must exit 0 after `shutdown` + `exit`."""
    client = await spawn(data_dir, *serve_args)
    try:
        yield client
    except BaseException:
        await client.close()
        raise
    code = await client.close()
    assert code == 0, f"the daemon exited with {code}"


def node_ids(nodes: Sequence[dict[str, object]]) -> list[str]:
    return [str(n["id"]) for n in nodes]
