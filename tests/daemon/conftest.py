"""Fixtures of the daemon end-to-end tests: real `compactd serve` processes on temp data dirs.

A spawn costs about a second and a half here, so most modules share one daemon (module scope,
with the module's event loop: `pytestmark = pytest.mark.asyncio(loop_scope="module")`) and give
each test its own session ids. Every daemon a fixture starts must end with exit code 0.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from pathlib import Path

from compactd.clients.client import CompactdClient

from .wire import serve_command

CALL_TIMEOUT = 20.0


async def spawn(data_dir: Path, *serve_args: str, timeout: float = CALL_TIMEOUT) -> CompactdClient:
    """A `CompactdClient` on a fresh daemon (the product's own Python client)."""
    command = serve_command(data_dir, *serve_args)
    # CompactdClient.spawn appends `serve` itself: hand it everything before that
    head = command[: command.index("serve")]
    return await CompactdClient.spawn(head, args=list(serve_args), timeout=timeout)


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
