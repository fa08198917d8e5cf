"""The durable store: one append-only JSONL event log per session.

An append is acknowledged only after the bytes are written and fsync'ed. Writers hold a file
lock, so several daemons may share a data dir; each reads what the others appended before
writing (`read_from`). A torn last line (a crash mid-write) is reported and ignored on load,
never fatal; before the next append it is sealed (`TORN_SEAL`) so it can never merge with a
new event nor come back as one. Files are created 0600 and folders 0700. History is never
rewritten.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import logging
import os
import stat
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import orjson
import platformdirs

from ..errors import StoreFailure, UnknownSession
from ..policy import MAX_MESSAGE_BYTES
from .interface import (
    LOCK_TIMEOUT_SECONDS,
    SESSION_ID_RE,
    Listed,
    LoadReport,
    SessionCounts,
    SessionStat,
    check_session_id,
    log_lines,
)

if TYPE_CHECKING:
    import asyncio

    from filelock import FileLock

log = logging.getLogger("compactd.store")

LOG_SUFFIX = ".jsonl"
CREATING_SUFFIX = ".creating"
"""A log being created: written whole under `.<id>.<random>.creating`, then linked into place."""
COUNTS_SUFFIX = ".counts"
"""`.<id>.counts` beside a log: what a listing shows of it (`keep_counts`)."""
COUNTS_TEMP_SUFFIX = ".tmp"
MAX_COUNTS_BYTES = 64 * 1024
REQUESTS_DIR = "requests"
"""Beside `sessions/`: the request log, one `YYYY-MM-DD.jsonl` a day (UTC)."""
TORN_DIR = "torn"
"""Beside `sessions/`: where the start-up sweep moves what failed creates left."""
_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)  # logs and locks are never opened through a symlink
TORN_SEAL = b" [torn]\n"
"""Ends a torn tail before the next append. A bare newline is not enough: a crash between an
event's last byte and its newline leaves a whole JSON object, which a newline would turn back
into an event — one never acknowledged, with the seq of the event appended after it. Trailing
non-JSON bytes keep the line bad whatever was cut (a string left open stays open)."""


def default_data_dir() -> Path:
    """`COMPACTD_DATA_DIR`, else the platform's user data dir."""
    env = os.environ.get("COMPACTD_DATA_DIR")
    if env:
        return Path(env)
    return Path(platformdirs.user_data_dir("compactd", appauthor=False))


def _day(at: float) -> str:
    return time.strftime("%Y-%m-%d", time.gmtime(at))


def make_private_dirs(folder: Path) -> None:
    """`mkdir -p` where each folder created is 0700; existing folders are left as they are."""
    missing: list[Path] = []
    for candidate in (folder, *folder.parents):
        if candidate.is_dir():
            break
        missing.append(candidate)
    for path in reversed(missing):
        try:
            os.mkdir(path, 0o700)
        except FileExistsError:
            if not path.is_dir():
                raise
            continue  # another process made it first: theirs, leave its mode alone
        os.chmod(path, 0o700)  # ours: the umask may have taken bits away, never adds any


class FileStore:
    """Session logs under `root/sessions/`: the default store."""

    def __init__(
        self, root: Path | str | None = None, max_event_bytes: int = MAX_MESSAGE_BYTES
    ) -> None:
        self.root = Path(root) if root is not None else default_data_dir()
        self.max_event_bytes = max_event_bytes  # the policy's maxMessageBytes
        self.sessions_dir = self.root / "sessions"
        self._locks: dict[str, FileLock] = {}
        self._claims: dict[str, FileLock] = {}

    @property
    def location(self) -> str:
        return str(self.root)

    def close(self) -> None:
        """Nothing to release: every write is closed when it returns."""

    # ---- paths ---------------------------------------------------------------------------

    def ensure_dirs(self) -> None:
        """Create what is missing of the data dir, every new folder 0700 (parents too, whatever
        the umask). A folder that exists keeps its mode: it may be shared on purpose."""
        try:
            make_private_dirs(self.sessions_dir)
        except OSError as exc:
            # the path is the user's own but stays out of errors a client may show anywhere
            raise StoreFailure(f"cannot create the data dir: {exc.strerror}") from exc

    def log_path(self, session_id: str) -> Path:
        return self.sessions_dir / f"{check_session_id(session_id)}{LOG_SUFFIX}"

    def lock_path(self, session_id: str) -> Path:
        return self.sessions_dir / f".{check_session_id(session_id)}.lock"

    def exists(self, session_id: str) -> bool:
        return self.log_path(session_id).is_file()

    def list_sessions(self) -> list[str]:
        if not self.sessions_dir.is_dir():
            return []
        out = []
        for entry in os.scandir(self.sessions_dir):
            name = entry.name
            if name.endswith(LOG_SUFFIX) and not name.startswith("."):
                sid = name[: -len(LOG_SUFFIX)]
                if SESSION_ID_RE.fullmatch(sid) and not _empty(entry):
                    out.append(sid)
        return sorted(out)

    # ---- locking -------------------------------------------------------------------------

    def _make_lock_file(self, session_id: str) -> Path:
        """The session's lock file, created if missing (0600), never through a symlink: one
        there could make or touch a file anywhere."""
        lock_file = self.lock_path(session_id)
        try:
            fd = os.open(lock_file, os.O_CREAT | os.O_WRONLY | _NOFOLLOW | os.O_NONBLOCK, 0o600)
            os.close(fd)
        except OSError as exc:
            raise StoreFailure(
                f"session {session_id}: its lock file cannot be opened ({exc.strerror})",
                sessionId=session_id,
            ) from None
        return lock_file

    @contextlib.contextmanager
    def locked(self, session_id: str) -> Iterator[None]:
        """Hold the session's writer lock (shared by every process on this data dir)."""
        from filelock import FileLock, Timeout  # here: a reader that never writes never loads it

        lock = self._locks.get(session_id)
        if lock is None:
            self.ensure_dirs()
            lock_file = self._make_lock_file(session_id)
            lock = FileLock(str(lock_file), timeout=LOCK_TIMEOUT_SECONDS, mode=0o600)
            self._locks[session_id] = lock  # one lock object per session: building one is slow
        try:
            lock.acquire()
        except Timeout as exc:
            raise StoreFailure(
                f"session {session_id} is locked by another writer", sessionId=session_id
            ) from exc
        except OSError as exc:  # filelock refuses a lock file that became a symlink (ELOOP)
            raise StoreFailure(
                f"session {session_id}: its lock file cannot be used ({exc.strerror})",
                sessionId=session_id,
            ) from None
        try:
            yield
        finally:
            lock.release()

    def forget(self, session_id: str) -> None:
        """Drop the session's lock objects (an evicted session holds nothing)."""
        self._locks.pop(session_id, None)
        self._claims.pop(session_id, None)

    @contextlib.contextmanager
    def claim(self, session_id: str) -> Iterator[bool]:
        """The session's background-work claim, a lock file taken without waiting, so two
        daemons on one data dir never run its idle work at once."""
        from filelock import FileLock, Timeout

        lock = self._claims.get(session_id)
        if lock is None:
            self.ensure_dirs()
            path = self.sessions_dir / f".{check_session_id(session_id)}.work"
            lock = self._claims[session_id] = FileLock(str(path), timeout=0, mode=0o600)
        try:
            lock.acquire()
        except Timeout:
            yield False
            return
        try:
            yield True
        finally:
            lock.release()

    async def watch(self) -> AsyncIterator[str]:
        """Ids of sessions whose logs changed on disk (ours included; readers skip what they
        already applied). The watch is set up again whenever the sessions folder is removed
        or replaced (a recreated data dir is a new folder the old watch would never see
        change; the next write recreates it), and then `""` says anything may have changed."""
        import asyncio

        from watchfiles import awatch

        self.ensure_dirs()
        folder = self.sessions_dir
        first = True
        while True:
            identity = _identity(folder)
            if identity is None:
                await asyncio.sleep(WATCH_CHECK_SECONDS)
                continue
            if not first:
                yield ""
            first = False
            stop = asyncio.Event()
            guard = asyncio.ensure_future(_until_replaced(folder, identity, stop))
            try:
                async for changes in awatch(
                    folder, debounce=20, step=10, recursive=False, stop_event=stop
                ):
                    for _change, path in changes:
                        name = Path(path).name
                        if name.endswith(LOG_SUFFIX) and not name.startswith("."):
                            yield name[: -len(LOG_SUFFIX)]
            except Exception as exc:  # the folder vanished under the watch, …
                log.info("the watch on the sessions folder ended (%s); watching it again", exc)
            finally:
                guard.cancel()
            if not stop.is_set():
                await asyncio.sleep(WATCH_CHECK_SECONDS)  # ended on its own: do not spin

    # ---- reading -------------------------------------------------------------------------

    def read_from(
        self, session_id: str, offset: int = 0, first_line: int = 1
    ) -> tuple[list[dict[str, Any]], LoadReport]:
        """Events from byte `offset` on. A last line without its newline is a torn tail:
        reported, not returned, and `end_offset` stops before it."""
        path = self.log_path(session_id)
        try:
            fd = os.open(path, os.O_RDONLY | _NOFOLLOW | os.O_NONBLOCK)
        except FileNotFoundError:
            raise UnknownSession(f"no session {session_id!r}", sessionId=session_id) from None
        except OSError as exc:
            raise StoreFailure(f"cannot read session {session_id}: {exc.strerror}") from exc
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                raise StoreFailure(f"the log of session {session_id} is not a regular file")
            with open(fd, "rb", closefd=False) as fh:
                fh.seek(offset)
                data = fh.read()
        except OSError as exc:
            raise StoreFailure(f"cannot read session {session_id}: {exc.strerror}") from exc
        finally:
            os.close(fd)
        report = LoadReport(end_offset=offset)
        events: list[dict[str, Any]] = []
        complete_end = data.rfind(b"\n") + 1
        if complete_end < len(data):
            report.torn_tail = True
        line_no = first_line
        pos = 0
        loads = orjson.loads
        while pos < complete_end:
            nl = data.index(b"\n", pos)
            raw = data[pos:nl]
            pos = nl + 1
            if raw.strip():
                try:
                    event = loads(raw)
                    if not isinstance(event, dict) or "t" not in event or "seq" not in event:
                        raise ValueError("not an event")
                    events.append(event)
                except (orjson.JSONDecodeError, ValueError):
                    report.bad_lines.append(line_no)
            line_no += 1
        report.events = len(events)
        report.end_offset = offset + complete_end
        return events, report

    # ---- writing -------------------------------------------------------------------------

    def create(self, session_id: str, events: list[dict[str, Any]]) -> int:
        """Create a new log holding `events`; fails if the session exists. Returns the size.

        The log is written whole under a temporary name and linked into place only once it is
        durable, so a create that fails (a full disk, a crash) leaves no log behind: never an
        empty one that answers "no valid header" for ever, nor half an import. The link
        fails if the name is taken, which makes the create exclusive, as `O_EXCL` would."""
        payload = self._encode(events)  # refused content leaves no file behind
        self.ensure_dirs()
        path = self.log_path(session_id)
        if os.path.lexists(path):
            raise StoreFailure(f"session {session_id} already exists", sessionId=session_id)
        temp = self.sessions_dir / f".{session_id}.{uuid.uuid4().hex[:12]}{CREATING_SUFFIX}"
        try:
            fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | _NOFOLLOW, 0o600)
        except OSError as exc:
            raise StoreFailure(f"cannot create session {session_id}: {exc.strerror}") from exc
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)  # a sweep leaves a create in progress alone
            size = self._write(fd, payload)
            _link_new(temp, path, session_id)
        finally:
            with contextlib.suppress(OSError):
                os.unlink(temp)
            os.close(fd)
        self._sync_dir()
        # the lock is born with the log, so a later refused write creates no file either;
        # when even that empty file cannot be made, the first write makes it
        with contextlib.suppress(StoreFailure):
            self._make_lock_file(session_id)
        return size

    def sweep(self) -> list[str]:
        """Move aside what failed creates left (a daemon killed mid-create, or an older
        compactd that created logs in place): temporary files no live create holds, and
        empty logs. They go to `torn/` beside `sessions/`, never listed; returns what was
        moved, for the operator."""
        if not self.sessions_dir.is_dir():
            return []
        moved: list[str] = []
        for entry in sorted(os.scandir(self.sessions_dir), key=lambda e: e.name):
            name = entry.name
            try:
                if name.startswith(".") and name.endswith(CREATING_SUFFIX):
                    what = self._sweep_temp(entry)
                elif name.startswith(".") and name.endswith(COUNTS_TEMP_SUFFIX):
                    os.unlink(entry.path)  # counts a killed process was writing: a cache
                    what = None
                elif name.endswith(LOG_SUFFIX) and entry.is_file(follow_symlinks=False):
                    what = _torn_header(Path(entry.path))
                else:
                    what = None
                if what is not None:
                    moved.append(f"{name} ({what}): {self._move_aside(Path(entry.path))}")
            except OSError as exc:
                log.warning("cannot sweep %s: %s", name, exc.strerror)
        return moved

    def _sweep_temp(self, entry: os.DirEntry[str]) -> str | None:
        """What a temporary file of a create is, or None while a live create holds it (or
        when it was already linked into place: then it is only a second name, removed)."""
        fd = os.open(entry.path, os.O_RDONLY | _NOFOLLOW | os.O_NONBLOCK)
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                return None  # its creator is alive and writing
            if os.fstat(fd).st_nlink > 1:  # killed between linking the log and unlinking this
                os.unlink(entry.path)
                return None
            return "a create that never finished"
        finally:
            os.close(fd)

    def _move_aside(self, path: Path) -> str:
        torn = self.root / TORN_DIR
        make_private_dirs(torn)
        stamp = time.strftime("%Y%m%dT%H%M%S")
        target = torn / f"{path.name.lstrip('.')}.{stamp}"
        os.rename(path, target)
        return f"moved to {TORN_DIR}/{target.name}"

    def append(self, session_id: str, events: list[dict[str, Any]], *, durable: bool = True) -> int:
        """Append `events` (caller holds `locked`); returns the log size after the append.
        Returns only once the bytes are on disk (`durable=False`: once they are written, the
        fsync left to the system)."""
        payload = self._encode(events)
        path = self.log_path(session_id)
        try:
            fd = os.open(path, os.O_RDWR | os.O_APPEND | _NOFOLLOW | os.O_NONBLOCK)
        except FileNotFoundError:
            raise UnknownSession(f"no session {session_id!r}", sessionId=session_id) from None
        except OSError as exc:
            raise StoreFailure(f"cannot open session {session_id}: {exc.strerror}") from exc
        try:
            info = os.fstat(fd)
            if not stat.S_ISREG(info.st_mode):
                raise StoreFailure(f"the log of session {session_id} is not a regular file")
            size = info.st_size
            prefix = b""
            if size:
                last = os.pread(fd, 1, size - 1)
                if last != b"\n":  # seal a torn tail so it stays one bad line
                    prefix = TORN_SEAL
            try:
                return self._write(fd, prefix + payload, durable)
            except StoreFailure:
                # never leave part of an unacknowledged append behind
                with contextlib.suppress(OSError):
                    os.ftruncate(fd, size)
                raise
        finally:
            os.close(fd)

    def _encode(self, events: list[dict[str, Any]]) -> bytes:
        """The events as log lines, or a typed error before anything is opened."""
        return b"".join(line + b"\n" for line in log_lines(events, self.max_event_bytes))

    @staticmethod
    def _write(fd: int, payload: bytes, durable: bool = True) -> int:
        try:
            view = memoryview(payload)
            while view:
                written = os.write(fd, view)
                view = view[written:]
            if durable:
                os.fsync(fd)
            return os.fstat(fd).st_size
        except OSError as exc:
            raise StoreFailure(f"write failed: {exc.strerror}") from exc

    def _sync_dir(self) -> None:
        try:
            dfd = os.open(self.sessions_dir, os.O_RDONLY)
        except OSError:
            return
        try:
            os.fsync(dfd)
        except OSError:
            pass
        finally:
            os.close(dfd)

    def stat(self, session_id: str) -> SessionStat:
        try:
            st = self.log_path(session_id).stat()
        except FileNotFoundError:
            raise UnknownSession(f"no session {session_id!r}", sessionId=session_id) from None
        return SessionStat(st.st_size, st.st_mtime, st.st_size)

    # ---- counts for listings -------------------------------------------------------------

    def counts_path(self, session_id: str) -> Path:
        return self.sessions_dir / f".{check_session_id(session_id)}{COUNTS_SUFFIX}"

    def listing(self) -> list[Listed]:
        """Every session's stat and kept counts: a stat and one small read per session."""
        out: list[Listed] = []
        for sid in self.list_sessions():
            try:
                stat_ = self.stat(sid)
            except UnknownSession:
                continue  # gone since the folder was read
            out.append((sid, stat_, self._read_counts(sid)))
        return out

    def _read_counts(self, session_id: str) -> SessionCounts | None:
        try:
            fd = os.open(self.counts_path(session_id), os.O_RDONLY | _NOFOLLOW | os.O_NONBLOCK)
        except OSError:
            return None
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                return None
            data = os.read(fd, MAX_COUNTS_BYTES)
        except OSError:
            return None
        finally:
            os.close(fd)
        try:
            return SessionCounts.from_json(orjson.loads(data))
        except orjson.JSONDecodeError:
            return None

    def keep_counts(self, session_id: str, counts: SessionCounts) -> None:
        """Written whole under a temporary name and renamed over the last ones; not fsync'ed
        (lost counts are counted again)."""
        target = self.counts_path(session_id)
        temp = target.with_name(f"{target.name}.{os.getpid()}{COUNTS_TEMP_SUFFIX}")
        try:
            fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | _NOFOLLOW, 0o600)
            try:
                os.write(fd, orjson.dumps(counts.to_json()))
            finally:
                os.close(fd)
            os.replace(temp, target)
        except OSError as exc:
            log.info("cannot keep the counts of session %s: %s", session_id, exc.strerror)
            with contextlib.suppress(OSError):
                os.unlink(temp)

    def size(self, session_id: str) -> int:
        try:
            return self.log_path(session_id).stat().st_size
        except FileNotFoundError:
            return 0

    def unchanged(self, session_id: str, offset: int) -> bool:
        """Nothing past byte `offset`: one `stat`, where a read opened the file."""
        return bool(offset) and self.size(session_id) == offset

    # ---- the request log -----------------------------------------------------------------

    @property
    def requests_dir(self) -> Path:
        return self.root / REQUESTS_DIR

    def log_requests(self, rows: list[dict[str, Any]]) -> None:
        """One file a day (UTC, by each row's `at`), 0600; each day's rows go out in one
        `O_APPEND` write, so processes sharing the data dir never interleave within a row."""
        by_day: dict[str, list[bytes]] = {}
        for row in rows:
            by_day.setdefault(_day(float(row["at"])), []).append(orjson.dumps(row) + b"\n")
        try:
            make_private_dirs(self.requests_dir)
            for day, lines in by_day.items():
                path = self.requests_dir / f"{day}{LOG_SUFFIX}"
                flags = os.O_RDWR | os.O_APPEND | os.O_CREAT | _NOFOLLOW
                fd = os.open(path, flags, 0o600)
                try:
                    size = os.fstat(fd).st_size
                    # a row a failed write left torn is sealed, so it never swallows this one
                    seal = b"\n" if size and os.pread(fd, 1, size - 1) != b"\n" else b""
                    self._write(fd, seal + b"".join(lines), durable=False)
                finally:
                    os.close(fd)
        except OSError as exc:
            raise StoreFailure(f"cannot write the request log: {exc.strerror}") from exc

    def read_requests(
        self, since: float | None = None, session_id: str | None = None
    ) -> list[dict[str, Any]]:
        folder = self.requests_dir
        if not folder.is_dir():
            return []
        first = _day(since) if since is not None else ""
        days = sorted(
            name[: -len(LOG_SUFFIX)]
            for name in os.listdir(folder)
            if name.endswith(LOG_SUFFIX) and name[: -len(LOG_SUFFIX)] >= first
        )
        out: list[dict[str, Any]] = []
        for day in days:
            try:
                data = (folder / f"{day}{LOG_SUFFIX}").read_bytes()
            except OSError as exc:
                log.info("cannot read the request log of %s: %s", day, exc.strerror)
                continue
            for line in data.splitlines():
                try:
                    row = orjson.loads(line)
                except orjson.JSONDecodeError:
                    continue  # a torn line: a row the writer never finished
                if not isinstance(row, dict) or not isinstance(row.get("at"), int | float):
                    continue
                if since is not None and row["at"] < since:
                    continue
                if session_id is not None and row.get("sessionId") != session_id:
                    continue
                out.append(row)
        return out


def _torn_header(path: Path) -> str | None:
    """What an older compactd left of a create that failed in place: an empty log, or one
    without a single whole line (its header cut off). None for anything else: a log with a
    whole first line is a session (loaded, or refused as unreadable), never moved."""
    fd = os.open(path, os.O_RDONLY | _NOFOLLOW | os.O_NONBLOCK)
    try:
        seen = 0
        while seen < MAX_HEADER_SCAN:
            chunk = os.read(fd, 65536)
            if not chunk:
                return "an empty log" if seen == 0 else "a log whose header was cut off"
            if b"\n" in chunk:
                return None
            seen += len(chunk)
        return None
    finally:
        os.close(fd)


MAX_HEADER_SCAN = 4 * 2**20
"""How far the sweep looks for the end of a log's first line before calling it a session."""


def _empty(entry: os.DirEntry[str]) -> bool:
    """An empty log is what an older compactd left of a create that failed: not a session."""
    try:
        return entry.stat(follow_symlinks=False).st_size == 0
    except OSError:
        return False


def _link_new(temp: Path, path: Path, session_id: str) -> None:
    """Give the durable temporary log its name, failing if the name is taken. On a file
    system without hard links, a rename after a check (exclusive but for two daemons
    creating the same id in the same instant)."""
    try:
        os.link(temp, path)
        return
    except FileExistsError:
        raise StoreFailure(f"session {session_id} already exists", sessionId=session_id) from None
    except OSError as exc:
        if exc.errno not in (errno.EPERM, errno.EOPNOTSUPP, errno.ENOTSUP):
            raise StoreFailure(f"cannot create session {session_id}: {exc.strerror}") from exc
    if os.path.lexists(path):
        raise StoreFailure(f"session {session_id} already exists", sessionId=session_id)
    try:
        os.rename(temp, path)
    except OSError as exc:
        raise StoreFailure(f"cannot create session {session_id}: {exc.strerror}") from exc


WATCH_CHECK_SECONDS = 1.0
"""How often the watch checks that the folder it watches is still the data dir's."""


def _identity(folder: Path) -> tuple[int, int] | None:
    try:
        info = os.stat(folder)
    except OSError:
        return None
    return (info.st_dev, info.st_ino)


async def _until_replaced(folder: Path, identity: tuple[int, int], stop: asyncio.Event) -> None:
    import asyncio

    while _identity(folder) == identity:
        await asyncio.sleep(WATCH_CHECK_SECONDS)
    log.info("the sessions folder was removed or replaced; watching it again")
    stop.set()
