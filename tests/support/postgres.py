"""A real, throwaway PostgreSQL cluster for the tests and the benchmark.

Started from the server binaries the machine has (`initdb`, `pg_ctl`); as the `postgres` user
when we run as root (the server refuses root), in a temp dir it owns, listening on a unix
socket in that dir only (no TCP). `Cluster.database()` makes a fresh database and returns its
URL. Where no server binary exists, `find_bindir()` says so and the callers skip.
"""

from __future__ import annotations

import contextlib
import glob
import itertools
import os
import pwd
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import attrs

SERVER_USER = "postgres"


def find_bindir() -> Path | None:
    """`$COMPACTD_PG_BINDIR`, else the newest /usr/lib/postgresql/*/bin, else `pg_ctl` on PATH."""
    env = os.environ.get("COMPACTD_PG_BINDIR")
    candidates = [env] if env else []
    candidates += sorted(
        glob.glob("/usr/lib/postgresql/*/bin"), key=lambda p: int(p.split("/")[-2]), reverse=True
    )
    on_path = shutil.which("pg_ctl")
    if on_path:
        candidates.append(str(Path(on_path).parent))
    for folder in candidates:
        if (Path(folder) / "initdb").is_file() and (Path(folder) / "pg_ctl").is_file():
            return Path(folder)
    return None


@attrs.define
class Cluster:
    base: Path
    bindir: Path
    as_user: str | None
    _names: Iterator[int] = attrs.field(factory=lambda: itertools.count(1))

    @property
    def socket_dir(self) -> Path:
        return self.base

    def url(self, database: str = "postgres") -> str:
        return f"postgresql:///{database}?host={self.socket_dir}&user={SERVER_USER}"

    def database(self, prefix: str = "t") -> str:
        """A fresh, empty database; its URL."""
        import psycopg

        name = f"{prefix}_{os.getpid()}_{next(self._names)}"
        with psycopg.connect(self.url(), autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{name}"')
        return self.url(name)

    def run(self, *args: str) -> subprocess.CompletedProcess[str]:
        cmd = [str(self.bindir / args[0]), *args[1:]]
        if self.as_user:
            cmd = ["runuser", "-u", self.as_user, "--", *cmd]
        return subprocess.run(cmd, capture_output=True, text=True, check=False, timeout=120)

    def stop(self) -> None:
        self.run("pg_ctl", "-D", str(self.base / "data"), "-m", "immediate", "-w", "stop")
        shutil.rmtree(self.base, ignore_errors=True)


def start(*, durable: bool = False) -> Cluster:
    """A new cluster. `durable`: fsync on (the benchmark); off for the tests, which never crash
    the server, only daemons."""
    bindir = find_bindir()
    if bindir is None:
        raise FileNotFoundError("no PostgreSQL server binaries (initdb, pg_ctl) on this machine")
    as_user = SERVER_USER if os.geteuid() == 0 else None
    base = Path(tempfile.mkdtemp(prefix="compactd-pg-"))
    if as_user:
        entry = pwd.getpwnam(as_user)
        os.chown(base, entry.pw_uid, entry.pw_gid)
    os.chmod(base, 0o755)  # the socket in it is reachable for the test process
    cluster = Cluster(base, bindir, as_user)
    data = str(base / "data")
    init = ["initdb", "-D", data, "-U", SERVER_USER, "--auth=trust", "-E", "UTF8"]
    out = cluster.run(*init, *([] if durable else ["--no-sync"]))
    if out.returncode:
        shutil.rmtree(base, ignore_errors=True)
        raise RuntimeError(f"initdb failed: {out.stderr or out.stdout}")
    options = f"-k {base} -c listen_addresses='' -c max_connections=200"
    if not durable:
        options += " -c fsync=off -c synchronous_commit=off -c full_page_writes=off"
    out = cluster.run("pg_ctl", "-D", data, "-o", options, "-l", str(base / "log"), "-w", "start")
    if out.returncode:
        log = (base / "log").read_text() if (base / "log").exists() else ""
        shutil.rmtree(base, ignore_errors=True)
        raise RuntimeError(f"pg_ctl start failed: {out.stderr or out.stdout}\n{log}")
    return cluster


@contextlib.contextmanager
def running(*, durable: bool = False) -> Iterator[Cluster]:
    cluster = start(durable=durable)
    try:
        yield cluster
    finally:
        cluster.stop()


# ---- the daemon end-to-end tests on PostgreSQL (COMPACTD_TEST_STORE=postgres) ------------------

DAEMON_CLUSTER: Cluster | None = None
"""Set by `tests/daemon/conftest.py` when the daemons of this run use PostgreSQL."""
DAEMON_STORES: dict[Path, str] = {}
"""Each data dir's database: daemons started on one data dir share it, as they share files."""


def daemon_store_args(data_dir: Path) -> list[str]:
    """`--store URL` for a daemon on `data_dir` when this run tests PostgreSQL, else nothing."""
    url = daemon_store_url(data_dir)
    return ["--store", url] if url else []


def daemon_store_url(data_dir: Path) -> str | None:
    if DAEMON_CLUSTER is None:
        return None
    key = Path(data_dir).resolve()
    if key not in DAEMON_STORES:
        DAEMON_STORES[key] = DAEMON_CLUSTER.database("d")
    return DAEMON_STORES[key]
