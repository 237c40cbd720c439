"""The node ledger: one shared file per server and tier that every pool of the server's stub
processes reserves from before it grows upstream, so that the models on a node share one memory
budget. Each pool keeps a floor; what it holds above it is lent, and a pool that needs memory the
budget no longer has asks the others to trim and waits a bounded time. Entries of dead processes
are reclaimed by whoever next takes the lock.

Layout (int64 unless said): a header [magic, version, budget, trims, denials, creator pid], then
SLOTS entries [pid, start ticks, floor, reserved, in use, trim wanted, model (64 bytes), instance
(64 bytes)]. The lock is flock on the file: the kernel drops it with a killed process."""

from __future__ import annotations

import fcntl
import mmap
import os
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from tidepool.pool.budget import TierBudget, budget_for
from tidepool.pool.errors import PoolError
from tidepool.processes import SHM_DIRECTORY, alive, shared_directory

MAGIC = 0x7469646570_6F6F6C  # "tidepool"
VERSION = 1
SLOTS = 128
HEADER = np.dtype([("magic", "<i8"), ("version", "<i8"), ("budget", "<i8"), ("trims", "<i8"),
                   ("denials", "<i8"), ("creator", "<i8")])  # fmt: skip
ENTRY = np.dtype([("pid", "<i8"), ("start", "<i8"), ("floor", "<i8"), ("reserved", "<i8"), ("in_use", "<i8"),
                  ("trim_wanted", "<i8"), ("model", "S64"), ("instance", "S64")])  # fmt: skip
FILE_BYTES = HEADER.itemsize + SLOTS * ENTRY.itemsize
# How long a reservation waits for other pools to trim: they answer from their background
# housekeeping within housekeeping.POLL_S, or as their execution ends, so this is many rounds.
WAIT_S = 1.0
RETRY_S = 0.002


class BudgetError(PoolError):
    """The node budget cannot hold this pool: its floor does not fit beside the others' floors."""


class BudgetDenied(PoolError, MemoryError):
    """A reservation the node budget cannot make even after the other pools trimmed what they lend.
    A MemoryError, so that the pool answers it as it answers a full upstream."""


def ledger_path(server_pid: int, tier: str, directory: Path | None = None) -> Path:
    """The file of one server's tier. Named `tidepool_<pid>_` like the launcher's other shared
    files, so `tidepool serve` removes it once that server is gone."""
    name = f"tidepool_{server_pid}_ledger_{tier.replace(':', '')}"
    return (directory or shared_directory(SHM_DIRECTORY)) / name


def ledger_paths(directory: Path | None = None, server_pid: int | None = None) -> list[Path]:
    """The ledgers in `directory` (default: the shared one), of every server or of `server_pid`'s."""
    owner = "*" if server_pid is None else str(server_pid)
    return sorted((directory or shared_directory(SHM_DIRECTORY)).glob(f"tidepool_{owner}_ledger_*"))


def remove_dead_ledgers(directory: Path | None = None) -> list[Path]:
    """Remove the ledgers of servers that no longer run (plain tritonserver leaves them when it is
    killed; `tidepool serve` removes its own): any process that creates a ledger does this first."""
    removed = []
    for path in ledger_paths(directory):
        pid = path.name.split("_")[1]
        if pid.isdigit() and not alive(int(pid)):
            path.unlink(missing_ok=True)
            removed.append(path)
    return removed


def process_start(pid: int) -> int | None:
    """When `pid` started (clock ticks after boot), or None where no such process runs (a zombie,
    such as a killed stub its server has not reaped, runs no more): a pid reused by a new process
    then reads as another process."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat.rpartition(")")[2].split()
    return None if fields[0] in ("Z", "X") else int(fields[19])


def _mib(nbytes: int) -> str:
    return f"{nbytes / 2**20:.1f} MiB"


@dataclass(frozen=True)
class EntryView:
    """One pool's line of the ledger, as `tidepool status` prints it."""

    model: str
    instance: str
    pid: int
    floor: int
    reserved: int
    in_use: int


class NodeLedger:
    """One tier's ledger of one server, as this process sees it."""

    def __init__(self, path: Path, tier: str, fd: int, shared: mmap.mmap) -> None:
        self.path = path
        self.tier = tier
        self._fd = fd
        self._file = shared
        self._header: np.ndarray[Any, Any] = np.frombuffer(shared, HEADER, 1, 0)
        self._entries: np.ndarray[Any, Any] = np.frombuffer(shared, ENTRY, SLOTS, HEADER.itemsize)
        self._thread_lock = threading.Lock()
        self.created = False  # whether this process made the file (and so chose the budget)
        self.budget_why = ""

    @classmethod
    def attach(
        cls,
        tier: str,
        server_pid: int | None = None,
        directory: Path | None = None,
        budget: TierBudget | None = None,
    ) -> NodeLedger:
        """Open (or create, with `budget` or the tier's budget_for) the ledger of a server's tier.
        `server_pid` defaults to the parent process: a Triton Python stub is a child of tritonserver."""
        path = ledger_path(server_pid if server_pid is not None else os.getppid(), tier, directory)
        if not path.exists():
            remove_dead_ledgers(path.parent)
        while True:
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
            fcntl.flock(fd, fcntl.LOCK_EX)
            if not _same_file(fd, path):  # the last one out removed it while we waited
                os.close(fd)
                continue
            ledger: NodeLedger | None = None
            try:
                fresh = os.fstat(fd).st_size < FILE_BYTES
                if fresh:
                    os.ftruncate(fd, FILE_BYTES)
                ledger = cls(path, tier, fd, mmap.mmap(fd, FILE_BYTES))
                if fresh or ledger._field("magic") != MAGIC:
                    chosen = budget or budget_for(tier)
                    ledger._header[0] = (MAGIC, VERSION, chosen.nbytes, 0, 0, os.getpid())
                    ledger.created, ledger.budget_why = True, chosen.why
                elif ledger._field("version") != VERSION:
                    found = ledger._field("version")
                    raise PoolError(f"{path} has ledger version {found}, expected {VERSION}")
                fcntl.flock(fd, fcntl.LOCK_UN)
                return ledger
            except BaseException:
                if ledger is not None:
                    ledger.close()  # closes fd, and with it the lock
                else:
                    os.close(fd)
                raise

    @classmethod
    def open_existing(cls, path: Path) -> NodeLedger:
        """A ledger file that exists (for `tidepool status`); PoolError where it is not one."""
        tier = path.name.partition("_ledger_")[2].replace("cuda", "cuda:")
        fd = os.open(path, os.O_RDWR)
        if os.fstat(fd).st_size < FILE_BYTES:
            os.close(fd)
            raise PoolError(f"{path} is not a node ledger (too short)")
        ledger = cls(path, tier, fd, mmap.mmap(fd, FILE_BYTES))
        if ledger._field("magic") != MAGIC or ledger._field("version") != VERSION:
            ledger.close()
            raise PoolError(f"{path} is not a node ledger of this version")
        return ledger

    @property
    def server_pid(self) -> int:
        return int(self.path.name.split("_")[1])

    # -- the lock and what it guards -------------------------------------------------------

    @contextmanager
    def _locked(self) -> Iterator[None]:
        with self._thread_lock:
            fcntl.flock(self._fd, fcntl.LOCK_EX)
            try:
                self._reclaim_dead()
                yield
            finally:
                fcntl.flock(self._fd, fcntl.LOCK_UN)

    def _reclaim_dead(self) -> None:
        for slot in np.flatnonzero(self._entries["pid"]):
            entry = self._entries[slot]
            if process_start(int(entry["pid"])) != int(entry["start"]):
                self._entries[slot] = np.zeros((), ENTRY)

    def _field(self, name: str) -> int:
        return int(self._header[name][0])

    def _count(self, name: str) -> None:
        self._header[name][0] += 1

    @property
    def budget(self) -> int:
        return self._field("budget")

    @property
    def trims(self) -> int:
        """Trim requests made to pools so far."""
        return self._field("trims")

    @property
    def denials(self) -> int:
        """Reservations refused so far."""
        return self._field("denials")

    def reserved_total(self) -> int:
        """Every live pool's reserved bytes (a read without the lock: a figure for metrics)."""
        return int(self._entries["reserved"].sum())

    def snapshot(self) -> list[EntryView]:
        """The live entries, dead ones reclaimed first."""
        with self._locked():
            return [
                EntryView(
                    model=e["model"].decode(),
                    instance=e["instance"].decode(),
                    pid=int(e["pid"]),
                    floor=int(e["floor"]),
                    reserved=int(e["reserved"]),
                    in_use=int(e["in_use"]),
                )  # fmt: skip
                for e in self._entries[self._entries["pid"] != 0]
            ]

    def holders(self) -> str:
        """Who holds what, for an error message (call with the lock held)."""
        live = self._entries[self._entries["pid"] != 0]
        return (
            "; ".join(
                f"{e['instance'].decode()} (pid {int(e['pid'])}) reserved {_mib(int(e['reserved']))}, "
                f"floor {_mib(int(e['floor']))}"
                for e in live
            )
            or "no pool"
        )

    # -- entries ---------------------------------------------------------------------------

    def join(self, model: str, instance: str, floor: int) -> LedgerEntry:
        """A slot for one pool of this process. BudgetError where its floor does not fit beside
        the floors of the pools already there."""
        with self._locked():
            floors = int(self._entries["floor"].sum())
            if floors + floor > self.budget:
                raise BudgetError(
                    f"the node's {self.tier} memory budget ({_mib(self.budget)}) is smaller than the "
                    f"pools' floors: {instance} needs {_mib(floor)} (POOL_INITIAL_BYTES) beside "
                    f"{_mib(floors)} of others ({self.holders()}); raise the budget "
                    "(TIDEPOOL_MEMORY_BUDGET or `tidepool serve --memory-budget`) or plan the models "
                    "together (`tidepool plan MODEL_REPOSITORY --memory-budget`)"
                )
            free = np.flatnonzero(self._entries["pid"] == 0)
            if not len(free):
                raise PoolError(f"more than {SLOTS} pools share {self.path}")
            slot = int(free[0])
            pid = os.getpid()
            self._entries[slot] = (pid, process_start(pid) or 0, floor, 0, 0, 0, model.encode()[:64],
                                   instance.encode()[:64])  # fmt: skip
            return LedgerEntry(self, slot, floor)

    def _reserve_once(self, slot: int, nbytes: int, asked: bool) -> tuple[bool, str | None]:
        """Under the lock: (reserved, None), or (False, None) having asked the others to trim
        (keep waiting), or (False, why not) where waiting cannot help."""
        entries = self._entries
        total = int(entries["reserved"].sum())
        if total + nbytes <= self.budget:
            entries["reserved"][slot] += nbytes
            return True, None
        if asked:
            return False, None
        shortfall = total + nbytes - self.budget
        others = [s for s in np.flatnonzero(entries["pid"]) if s != slot]
        held = entries["reserved"] - np.maximum(entries["floor"], entries["in_use"])
        lendable = {int(s): max(0, int(held[s])) for s in others}
        if sum(lendable.values()) < shortfall:
            return False, (
                f"the node's {self.tier} memory budget is {_mib(self.budget)}: this pool needs "
                f"{_mib(nbytes)} more with {_mib(total)} reserved and {_mib(sum(lendable.values()))} "
                f"lendable by others ({self.holders()})"
            )
        for other in sorted(lendable, key=lendable.__getitem__, reverse=True):
            if lendable[other] and shortfall > 0:
                entries["trim_wanted"][other] = max(int(entries["trim_wanted"][other]), lendable[other])
                self._count("trims")
                shortfall -= lendable[other]
        return False, None

    def reserve(self, entry: LedgerEntry, nbytes: int, wait_s: float = WAIT_S) -> None:
        """Count `nbytes` more against the budget for `entry`, asking other pools to trim what
        they lend and waiting up to `wait_s` for them; BudgetDenied if it still does not fit."""
        deadline = time.monotonic() + wait_s
        asked = False
        while True:
            with self._locked():
                done, why = self._reserve_once(entry.slot, nbytes, asked)
                if done:
                    return
                asked = True
                if why is None and time.monotonic() >= deadline:
                    why = (
                        f"the node's {self.tier} memory budget is {_mib(self.budget)} and the other "
                        f"pools did not trim in {wait_s:.1f} s ({self.holders()})"
                    )
                if why is not None:
                    self._count("denials")
                    raise BudgetDenied(why)
            time.sleep(RETRY_S)

    def release(self, entry: LedgerEntry, nbytes: int) -> None:
        with self._locked():
            reserved = self._entries["reserved"]
            reserved[entry.slot] = max(0, int(reserved[entry.slot]) - nbytes)

    def answered(self, entry: LedgerEntry) -> None:
        with self._locked():
            self._entries["trim_wanted"][entry.slot] = 0

    def leave(self, entry: LedgerEntry) -> None:
        """Free the slot; the last pool to leave removes the file."""
        with self._locked():
            self._entries[entry.slot] = np.zeros((), ENTRY)
            if not self._entries["pid"].any() and _same_file(self._fd, self.path):
                self.path.unlink()

    def close(self) -> None:
        del self._header, self._entries  # numpy views pin the mapping until they go
        self._file.close()
        os.close(self._fd)


@dataclass
class LedgerEntry:
    """One pool's slot: the hot path only reads and writes its own row, with no lock."""

    ledger: NodeLedger
    slot: int
    floor: int

    @property
    def reserved(self) -> int:
        return int(self.ledger._entries["reserved"][self.slot])

    def trim_wanted(self) -> int:
        """Bytes another pool asked this one to give back (0: none)."""
        return int(self.ledger._entries["trim_wanted"][self.slot])

    def set_in_use(self, nbytes: int) -> None:
        self.ledger._entries["in_use"][self.slot] = nbytes

    def available(self) -> int:
        """What the budget has left now, without waiting or asking anyone (an estimate)."""
        return self.ledger.budget - self.ledger.reserved_total()

    def fair_share(self) -> int:
        """The budget split evenly among the pools there now (an estimate, read without the lock)."""
        return self.ledger.budget // max(1, int(np.count_nonzero(self.ledger._entries["pid"])))

    def reserve(self, nbytes: int, wait_s: float = WAIT_S) -> None:
        self.ledger.reserve(self, nbytes, wait_s)

    def release(self, nbytes: int) -> None:
        self.ledger.release(self, nbytes)

    def answered(self) -> None:
        self.ledger.answered(self)

    def leave(self) -> None:
        self.ledger.leave(self)


def _same_file(fd: int, path: Path) -> bool:
    try:
        return os.fstat(fd).st_ino == os.stat(path).st_ino
    except FileNotFoundError:
        return False
