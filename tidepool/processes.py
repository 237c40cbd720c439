"""Per-process files and their owners, shared by the launcher (which removes what dead processes
left) and the runtime (whose instances share files per server): where such files live, whether
the process that owns one still runs, and the one kind of shared file the processes of a server
write together: a slot table (the node ledger's and the elastic cores' both)."""

from __future__ import annotations

import fcntl
import mmap
import os
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np

SHM_DIRECTORY = Path("/dev/shm")


def shared_directory(preferred: Path = SHM_DIRECTORY) -> Path:
    """Where a server's shared files go: /dev/shm (memory), or /tmp on a system without it."""
    return preferred if preferred.is_dir() else Path("/tmp")


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # it runs, as another user
        return True
    return True


def process_start(pid: int) -> int | None:
    """When `pid` started (clock ticks after boot), or None where no such process runs. A zombie
    (a killed stub its server has not reaped) runs no more, and a pid reused by a new process reads
    as another start time: both count as dead owners."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat.rpartition(")")[2].split()
    return None if fields[0] in ("Z", "X") else int(fields[19])


def fit_utf8(text: str, nbytes: int) -> bytes:
    """`text` encoded, cut to at most `nbytes` on a character boundary (a fixed-width field)."""
    return text.encode()[:nbytes].decode("utf-8", "ignore").encode()


def _same_file(fd: int, path: Path) -> bool:
    try:
        return os.fstat(fd).st_ino == os.stat(path).st_ino
    except FileNotFoundError:
        return False


class SlotTable:
    """A shared file of a header and fixed-size rows, one per owning process, mapped by every
    process of one server. Rows carry their owner's pid and start time; whoever takes the lock
    first clears the rows of owners that no longer run (killed, zombie, or a reused pid). The lock
    is flock on the file, so the kernel drops it with a killed process (and a thread lock beside
    it, since flock is per open file, not per thread). Rows may be read and written without the
    lock where a field belongs to one row's owner; taking, freeing and reclaiming rows hold it."""

    def __init__(self, path: Path, fd: int, shared: mmap.mmap, header: np.dtype[Any], row: np.dtype[Any],
                 slots: int) -> None:  # fmt: skip
        self.path = path
        self._fd = fd
        self._file = shared
        self.header: np.ndarray[Any, Any] = np.frombuffer(shared, header, 1, 0)
        self.rows: np.ndarray[Any, Any] = np.frombuffer(shared, row, slots, header.itemsize)
        self._thread_lock = threading.Lock()

    @classmethod
    def open(
        cls,
        path: Path,
        header: np.dtype[Any],
        row: np.dtype[Any],
        slots: int,
        prepare: Callable[[SlotTable, bool], None] = lambda table, fresh: None,
        create: bool = True,
    ) -> SlotTable:
        """Open (or create) the table at `path`; `prepare(table, fresh)` runs under the lock, to
        write or check the header. A file the last owner removed meanwhile is created anew. With
        `create` false, ValueError where the file is too short to be such a table."""
        size = header.itemsize + slots * row.itemsize
        while True:
            fd = os.open(path, os.O_RDWR | (os.O_CREAT if create else 0), 0o600)
            fcntl.flock(fd, fcntl.LOCK_EX)
            if not _same_file(fd, path):
                os.close(fd)
                continue
            table: SlotTable | None = None
            try:
                fresh = os.fstat(fd).st_size < size
                if fresh and not create:
                    raise ValueError(f"{path} is too short ({os.fstat(fd).st_size} bytes, not {size})")
                if fresh:
                    os.ftruncate(fd, size)
                table = cls(path, fd, mmap.mmap(fd, size), header, row, slots)
                prepare(table, fresh)
                fcntl.flock(fd, fcntl.LOCK_UN)
                return table
            except BaseException:
                if table is not None:
                    table.close()  # closes fd, and with it the lock
                else:
                    os.close(fd)
                raise

    @contextmanager
    def locked(self) -> Iterator[None]:
        """Hold the table, dead owners' rows cleared first."""
        with self._thread_lock:
            fcntl.flock(self._fd, fcntl.LOCK_EX)
            try:
                self.reclaim_dead()
                yield
            finally:
                fcntl.flock(self._fd, fcntl.LOCK_UN)

    def reclaim_dead(self) -> int:
        """With the lock: clear the rows whose owner no longer runs; how many there were."""
        cleared = 0
        for slot in np.flatnonzero(self.rows["pid"]):
            if process_start(int(self.rows["pid"][slot])) != int(self.rows["start"][slot]):
                self.rows[slot] = np.zeros((), self.rows.dtype)
                cleared += 1
        return cleared

    def take(self) -> int | None:
        """With the lock: a free row, now this process's (its other fields zero); None if full."""
        free = np.flatnonzero(self.rows["pid"] == 0)
        if not len(free):
            return None
        slot, pid = int(free[0]), os.getpid()
        self.rows[slot] = np.zeros((), self.rows.dtype)
        self.rows["pid"][slot] = pid
        self.rows["start"][slot] = process_start(pid) or 0
        return slot

    def give_up(self, slot: int) -> None:
        """With the lock: free a row; the last owner to leave removes the file."""
        self.rows[slot] = np.zeros((), self.rows.dtype)
        if not self.rows["pid"].any() and _same_file(self._fd, self.path):
            self.path.unlink()

    @property
    def closed(self) -> bool:
        return self._file.closed

    def close(self) -> None:
        del self.header, self.rows  # numpy views pin the mapping until they go
        self._file.close()
        os.close(self._fd)
