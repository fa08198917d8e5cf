"""Scratch folders for work that keeps nothing (a replay's store of its own), under the data
dir's `scratch/` so they are found again: one a killed daemon left (a kill -9 mid-replay left
a `/tmp/compactd-replay-*` copy each time) is swept at the next start-up.

A folder is held while in use — a lock on a file inside it, which the system lets go when its
process dies however it dies — so the sweep of another daemon on the same data dir never takes
a folder from under a live replay.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

from ..context.stores.files import make_private_dirs

SCRATCH_DIR = "scratch"
HELD = ".held"


@contextlib.contextmanager
def scratch(data_dir: Path, kind: str) -> Iterator[Path]:
    """An empty private folder `<data dir>/scratch/<kind>-…`, held while the block runs and
    removed after it."""
    top = Path(data_dir) / SCRATCH_DIR
    make_private_dirs(top)
    path = Path(tempfile.mkdtemp(prefix=f"{kind}-", dir=top))
    held = os.open(path / HELD, os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(held, fcntl.LOCK_EX)
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)
        os.close(held)


def sweep(data_dir: Path) -> list[str]:
    """Remove the scratch folders no live process holds; says which."""
    top = Path(data_dir) / SCRATCH_DIR
    if not top.is_dir():
        return []
    removed = []
    for entry in sorted(os.scandir(top), key=lambda e: e.name):
        if not entry.is_dir(follow_symlinks=False) or _held(Path(entry.path)):
            continue
        shutil.rmtree(entry.path, ignore_errors=True)
        removed.append(entry.name)
    return removed


def _held(folder: Path) -> bool:
    try:
        fd = os.open(folder / HELD, os.O_RDONLY | os.O_CLOEXEC | getattr(os, "O_NOFOLLOW", 0))
    except OSError:
        return False  # no lock file: left before it was made, or by something else: not ours
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)
    return False
