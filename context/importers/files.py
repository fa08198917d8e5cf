"""Opening the files an import reads — the transcript and the files it refers to — safely.

A transcript is the user's choice, but what is in it is not: a crafted one can name any file
(`tool_use_id: "../../../secret"`), and a path handed over may be a FIFO, a device or a huge
sparse file. So every read here is of a regular file only, never more than the read limit
(`maxImportBytes`), opened without blocking; and a file a transcript refers to is opened one
folder at a time below the transcript's own folder, by plain names, never through `..`, an
absolute path or a symlink.
"""

from __future__ import annotations

import contextlib
import contextvars
import errno
import os
import stat
from collections.abc import Iterator
from pathlib import Path

import attrs

from ..errors import InvalidContent, InvalidPath, TooLarge
from ..policy import MAX_IMPORT_BYTES

__all__ = ["Reads", "list_inside", "read_inside", "read_limit", "read_regular"]


@attrs.define
class Reads:
    """What the reads of one import (or replay) read: the files named by path, read once, and
    how many bytes it read in all — what the import's bound on what it writes is a multiple
    of."""

    cache: dict[str, bytes] = attrs.field(factory=dict)
    total: int = 0


_LIMIT: contextvars.ContextVar[int] = contextvars.ContextVar("read_limit", default=MAX_IMPORT_BYTES)
_READS: contextvars.ContextVar[Reads | None] = contextvars.ContextVar("files_read", default=None)
_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_DIRECTORY = getattr(os, "O_DIRECTORY", 0)
_CHUNK = 4 * 2**20


@contextlib.contextmanager
def read_limit(max_bytes: int) -> Iterator[Reads]:
    """Reads inside the block stop at `max_bytes` a file (the policy's `maxImportBytes`), and
    a file named twice (sniffed, then imported) is read once. A block inside another one
    counts into the outer one's `Reads`."""
    token = _LIMIT.set(max_bytes)
    reads = _READS.get() or Reads()
    outer = _READS.set(reads)
    try:
        yield reads
    finally:
        _READS.reset(outer)
        _LIMIT.reset(token)


def read_regular(path: Path) -> bytes:
    """The bytes of a regular file (symlinks to one are fine: the user named it)."""
    text = str(path)
    if "\x00" in text:
        raise InvalidPath("the path holds a NUL byte", path=text.replace("\x00", "\\0"))
    reads = _READS.get()
    if reads is not None and text in reads.cache:
        return reads.cache[text]
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as error:
        raise InvalidContent(
            f"{path}: cannot read the transcript ({error.strerror or error})", path=text
        ) from None
    data = _read_fd(fd, text)
    if reads is not None:
        reads.cache[text] = data
    return data


def read_inside(folder: Path, *names: str) -> bytes:
    """The bytes of `folder/names[0]/…/names[-1]`, each name a plain entry of the one before
    (no separator, not `.` or `..`), none of them a symlink, the file itself of one link only
    (a hard link could make any file of the user's seem to sit in the folder). `InvalidPath`
    otherwise."""
    shown = "/".join(names)
    fd = _open_inside(folder, names[:-1], shown)
    try:
        file_fd = os.open(
            _plain(names[-1], shown),
            os.O_RDONLY | _NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC,
            dir_fd=fd,
        )
    except OSError as error:
        raise InvalidPath(
            f"{shown} cannot be read inside the transcript's folder ({error.strerror})",
            path=shown,
        ) from None
    finally:
        os.close(fd)
    return _read_fd(file_fd, shown, single_link=True)


def list_inside(folder: Path, *names: str) -> list[str] | None:
    """The entries of `folder/names[0]/…`, opened as `read_inside` opens a file's folders
    (plain names, never a symlink, so nothing outside the transcript's folder is even
    listed); None when a folder on the way does not exist, `InvalidPath` when one is not a
    folder of its own (a symlink, a file)."""
    shown = "/".join(names)
    try:
        fd = _open_inside(folder, names, shown)
    except InvalidPath as error:
        if error.data.get("missing"):
            return None
        raise
    try:
        return sorted(os.listdir(fd))
    except OSError as error:
        raise InvalidPath(f"{shown} cannot be listed ({error.strerror})", path=shown) from None
    finally:
        os.close(fd)


def _plain(name: str, shown: str) -> str:
    if not name or name in (".", "..") or any(c in name for c in "/\\\x00"):
        raise InvalidPath(
            f"{shown!r} is not a file inside the transcript's folder",
            path=shown.replace("\x00", "\\0"),
        )
    return name


def _open_inside(folder: Path, names: tuple[str, ...], shown: str) -> int:
    """An fd of `folder/names…`, each a plain name and a real folder (never a symlink)."""
    for name in names:
        _plain(name, shown)
    try:
        fd = os.open(folder, os.O_RDONLY | _DIRECTORY | os.O_CLOEXEC)
    except OSError as error:
        raise InvalidPath(f"cannot open the transcript's folder ({error.strerror})") from None
    for name in names:
        try:
            next_fd = os.open(name, os.O_RDONLY | _DIRECTORY | _NOFOLLOW | os.O_CLOEXEC, dir_fd=fd)
        except OSError as error:
            os.close(fd)
            missing = error.errno == errno.ENOENT
            raise InvalidPath(
                f"{shown} cannot be opened inside the transcript's folder ({error.strerror})",
                path=shown,
                **({"missing": True} if missing else {}),
            ) from None
        os.close(fd)
        fd = next_fd
    return fd


def _read_fd(fd: int, shown: str, *, single_link: bool = False) -> bytes:
    """Read a regular file's fd to its end, refusing anything else and anything too big (and
    with `single_link`, a file with more than one name)."""
    limit = _LIMIT.get()
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise InvalidPath(
                f"{shown} is not a regular file (a FIFO, device or folder is never read)",
                path=shown,
            )
        if single_link and info.st_nlink > 1:
            raise InvalidPath(
                f"{shown} has {info.st_nlink} links (a hard link may be any file of the "
                "user's): not read",
                path=shown,
            )
        if info.st_size > limit:
            raise TooLarge(shown, "maxImportBytes", limit, info.st_size)
        os.set_blocking(fd, True)
        chunks: list[bytes] = []
        total = 0
        while True:
            chunk = os.read(fd, min(_CHUNK, limit + 1 - total))
            if not chunk:
                break
            chunks.append(chunk)
            total += len(chunk)
            if total > limit:  # it grew while we read
                raise TooLarge(shown, "maxImportBytes", limit)
        reads = _READS.get()
        if reads is not None:
            reads.total += total
        return b"".join(chunks)
    except OSError as error:
        raise InvalidContent(
            f"{shown}: cannot read the transcript ({error.strerror or error})", path=shown
        ) from None
    finally:
        os.close(fd)
