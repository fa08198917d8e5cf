"""Loaded by a daemon the tests start with this folder on `PYTHONPATH` (`tests/support/disk.py`,
where no tmpfs can be mounted): while the file `COMPACTD_TEST_FULL_DISK` names exists, every
`os.write` to a file under `COMPACTD_TEST_FULL_DISK_UNDER` fails as on a full disk (ENOSPC).
The daemon is otherwise the real one; only the disk is made to be full."""

from __future__ import annotations

import errno
import os

_FLAG = os.environ.get("COMPACTD_TEST_FULL_DISK")
_UNDER = os.environ.get("COMPACTD_TEST_FULL_DISK_UNDER")

if _FLAG and _UNDER:
    _write = os.write

    def _full_disk_write(fd: int, data: bytes) -> int:  # type: ignore[no-untyped-def]
        if os.path.exists(_FLAG):
            try:
                target = os.readlink(f"/proc/self/fd/{fd}")
            except OSError:
                target = ""
            if target.startswith(_UNDER):
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return _write(fd, data)

    os.write = _full_disk_write
