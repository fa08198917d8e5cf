"""A disk the tests can fill and free under a real daemon.

On the files: a small tmpfs mounted on the data dir when this machine lets the tests mount one
(root), filled with a file until it has no space left; else the daemon is started with an
injected ENOSPC (`full_disk/sitecustomize.py`) that holds while a flag file exists. On
PostgreSQL: a trigger that fails every insert of an event with the server's own `disk_full`
error (SQLSTATE 53100). `fill()` makes the next write fail as a full disk does; `free()` gives
the space back.
"""

from __future__ import annotations

import contextlib
import errno
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import attrs

from .postgres import daemon_store_url

SHIM = Path(__file__).resolve().parent / "full_disk"
TMPFS_BYTES = 8 * 2**20

FAIL_EVENTS = """
CREATE OR REPLACE FUNCTION compactd.test_disk_full() RETURNS trigger AS $$
BEGIN RAISE EXCEPTION 'could not extend file: No space left on device'
    USING ERRCODE = 'disk_full'; END $$ LANGUAGE plpgsql;
CREATE TRIGGER test_disk_full BEFORE INSERT ON compactd.events
    FOR EACH STATEMENT EXECUTE FUNCTION compactd.test_disk_full();
"""


@attrs.define
class Disk:
    """How the data dir's disk is full: `how` is `tmpfs`, `injected` or `postgres`."""

    how: str
    data_dir: Path
    env: dict[str, str]
    _flag: Path | None = None
    _filler: Path | None = None

    def fill(self) -> None:
        if self.how == "postgres":
            self._sql(FAIL_EVENTS)
        elif self.how == "injected":
            assert self._flag is not None
            self._flag.write_bytes(b"")
        else:
            assert self._filler is not None
            fd = os.open(self._filler, os.O_WRONLY | os.O_CREAT, 0o600)
            try:
                for size in (65536, 4096, 1):  # down to the last byte
                    try:
                        while True:
                            os.write(fd, b"\0" * size)
                    except OSError as exc:
                        assert exc.errno == errno.ENOSPC, exc
            finally:
                os.close(fd)

    def free(self) -> None:
        if self.how == "postgres":
            self._sql("DROP TRIGGER test_disk_full ON compactd.events")
        elif self.how == "injected":
            assert self._flag is not None
            self._flag.unlink()
        else:
            assert self._filler is not None
            self._filler.unlink()

    def _sql(self, statement: str) -> None:
        import psycopg

        url = daemon_store_url(self.data_dir)
        assert url is not None
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute(statement)  # type: ignore[arg-type]


@contextlib.contextmanager
def fillable(root: Path) -> Iterator[Disk]:
    """A data dir (`root/data`) on a disk the test can fill: see the module docstring."""
    data_dir = root / "data"
    if daemon_store_url(data_dir) is not None:
        yield Disk("postgres", data_dir, {})
        return
    mount = root / "disk"
    mount.mkdir()
    mounted = _mount_tmpfs(mount)
    try:
        if mounted:
            yield Disk("tmpfs", mount / "data", {}, filler=mount / "filler")
        else:
            flag = root / "disk-is-full"
            env = {
                "PYTHONPATH": os.pathsep.join(
                    filter(None, [str(SHIM), os.environ.get("PYTHONPATH")])
                ),
                "COMPACTD_TEST_FULL_DISK": str(flag),
                "COMPACTD_TEST_FULL_DISK_UNDER": str(mount / "data"),
            }
            yield Disk("injected", mount / "data", env, flag=flag)
    finally:
        if mounted:
            subprocess.run(["umount", "-l", str(mount)], check=False, capture_output=True)


def _mount_tmpfs(where: Path) -> bool:
    if os.environ.get("COMPACTD_TEST_DISK") == "injected" or os.geteuid() != 0:
        return False
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={TMPFS_BYTES},mode=0700", "tmpfs", str(where)],
        check=False,
        capture_output=True,
    )
    return done.returncode == 0
