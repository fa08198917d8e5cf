"""Fixtures shared by every test suite.

Every test gets its own data dir, and `COMPACTD_DATA_DIR` points at a throwaway folder, so no
test can read or write a real user's sessions even when it forgets to pass a store.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from compactd.context.engine import Engine
from compactd.context.session import Library
from compactd.context.stores.files import FileStore
from compactd.context.tokens import Counter


@pytest.fixture(autouse=True)
def _isolated_default_data_dir(
    tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch
) -> Iterator[None]:
    """A code path that falls back to the default data dir lands in a temp folder."""
    monkeypatch.setenv("COMPACTD_DATA_DIR", str(tmp_path_factory.mktemp("default-data")))
    yield


@pytest.fixture
def data_dir(tmp_path: Path) -> Path:
    """The data dir of this test's store (created by the store on first write)."""
    return tmp_path / "data"


@pytest.fixture
def store(data_dir: Path) -> FileStore:
    return FileStore(data_dir)


@pytest.fixture
def library(store: FileStore) -> Library:
    return Library(store)


@pytest.fixture
def counter() -> Counter:
    """A fresh token counter, so a test can watch how often the encoder runs."""
    return Counter()


@pytest.fixture
def engine(store: FileStore, counter: Counter) -> Engine:
    return Engine(store, counter=counter)


@pytest.fixture(scope="session")
def pg_cluster() -> Iterator[Any]:
    """A throwaway PostgreSQL cluster for the whole run (`tests/support/postgres.py`): a unix
    socket in a temp dir, stopped at the end. Skipped, saying why, only without the server
    binaries."""
    from tests.support import postgres

    if postgres.find_bindir() is None:
        pytest.skip("no PostgreSQL server binaries (initdb, pg_ctl) on this machine")
    with postgres.running() as cluster:
        yield cluster


@pytest.fixture
def pg_url(pg_cluster: Any) -> str:
    """A fresh, empty database of the test cluster."""
    return str(pg_cluster.database())
