"""The node ledger: one shared file per server and tier that every pool of the server's stub
processes reserves from before it grows upstream, so that the models on a node share one memory
budget. Each pool keeps a floor; what it holds above it is lent, and a pool that needs memory the
budget no longer has asks the others to trim and waits a bounded time. The file is a slot table
(processes.SlotTable): entries of dead processes are reclaimed by whoever next takes the lock.

Layout (int64 unless said): a header [magic, version, budget, trims, denials, creator pid], then
SLOTS entries [pid, start ticks, floor, reserved, in use, trim wanted, model (64 bytes), instance
(64 bytes)]."""

from __future__ import annotations

import os
import time
from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from tidepool.pool.budget import TierBudget, budget_for
from tidepool.pool.errors import PoolError
from tidepool.processes import SHM_DIRECTORY, SlotTable, alive, fit_utf8, shared_directory
from tidepool.spec import mib

MAGIC = 0x7469646570_6F6F6C  # "tidepool"
VERSION = 1
SLOTS = 128
HEADER = np.dtype([("magic", "<i8"), ("version", "<i8"), ("budget", "<i8"), ("trims", "<i8"),
                   ("denials", "<i8"), ("creator", "<i8")])  # fmt: skip
NAME_BYTES = 64  # model and instance names, cut on a character boundary
ENTRY = np.dtype([("pid", "<i8"), ("start", "<i8"), ("floor", "<i8"), ("reserved", "<i8"), ("in_use", "<i8"),
                  ("trim_wanted", "<i8"), ("model", "S64"), ("instance", "S64")])  # fmt: skip
# How long a reservation waits for other pools to trim: they answer from their background
# housekeeping within housekeeping.POLL_S, or as their execution ends, so this is many rounds.
# TIDEPOOL_LEDGER_WAIT_S in the server's environment sets it (a machine whose stubs may be starved
# of CPU for longer, such as a test run beside a busy core).
WAIT_S = 1.0
WAIT_VARIABLE = "TIDEPOOL_LEDGER_WAIT_S"
RETRY_S = 0.002


def wait_s() -> float:
    text = os.environ.get(WAIT_VARIABLE, "").strip()
    try:
        value = float(text) if text else WAIT_S
    except ValueError:
        raise PoolError(f"{WAIT_VARIABLE} must be a number of seconds, got {text!r}") from None
    if value < 0:
        raise PoolError(f"{WAIT_VARIABLE} must not be negative, got {text!r}")
    return value


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

    def __init__(self, tier: str, table: SlotTable) -> None:
        self.path = table.path
        self.tier = tier
        self._table = table
        self.created = False  # whether this process made the file (and so chose the budget)
        self.budget_why = ""

    @property
    def _header(self) -> np.ndarray[Any, Any]:
        return self._table.header

    @property
    def _entries(self) -> np.ndarray[Any, Any]:
        return self._table.rows

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
        made: dict[str, str] = {}

        def prepare(table: SlotTable, fresh: bool) -> None:
            header = table.header
            if fresh or int(header["magic"][0]) != MAGIC:
                chosen = budget or budget_for(tier)
                header[0] = (MAGIC, VERSION, chosen.nbytes, 0, 0, os.getpid())
                made["why"] = chosen.why
            elif int(header["version"][0]) != VERSION:
                raise PoolError(f"{path} has ledger version {int(header['version'][0])}, expected {VERSION}")

        ledger = cls(tier, SlotTable.open(path, HEADER, ENTRY, SLOTS, prepare))
        ledger.created, ledger.budget_why = "why" in made, made.get("why", "")
        return ledger

    @classmethod
    def open_existing(cls, path: Path) -> NodeLedger:
        """A ledger file that exists (for `tidepool status`); PoolError where it is not one."""
        tier = path.name.partition("_ledger_")[2].replace("cuda", "cuda:")

        def check(table: SlotTable, fresh: bool) -> None:
            if int(table.header["magic"][0]) != MAGIC or int(table.header["version"][0]) != VERSION:
                raise PoolError(f"{path} is not a node ledger of this version")

        try:
            return cls(tier, SlotTable.open(path, HEADER, ENTRY, SLOTS, check, create=False))
        except ValueError as exc:
            raise PoolError(f"{path} is not a node ledger ({exc})") from None

    @property
    def server_pid(self) -> int:
        return int(self.path.name.split("_")[1])

    # -- the lock and what it guards -------------------------------------------------------

    def _locked(self) -> AbstractContextManager[None]:
        return self._table.locked()  # dead pools' rows are cleared first

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
                    model=e["model"].decode(errors="replace"),
                    instance=e["instance"].decode(errors="replace"),
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
                f"{e['instance'].decode(errors='replace')} (pid {int(e['pid'])}) "
                f"reserved {mib(int(e['reserved']))}, "
                f"floor {mib(int(e['floor']))}"
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
                    f"the node's {self.tier} memory budget ({mib(self.budget)}) is smaller than the "
                    f"pools' floors: {instance} needs {mib(floor)} (POOL_INITIAL_BYTES) beside "
                    f"{mib(floors)} of others ({self.holders()}); raise the budget "
                    "(TIDEPOOL_MEMORY_BUDGET or `tidepool serve --memory-budget`) or plan the models "
                    "together (`tidepool plan MODEL_REPOSITORY --memory-budget`)"
                )
            slot = self._table.take()
            if slot is None:
                raise PoolError(f"more than {SLOTS} pools share {self.path}")
            entries = self._entries
            entries["floor"][slot] = floor
            entries["model"][slot] = fit_utf8(model, NAME_BYTES)
            entries["instance"][slot] = fit_utf8(instance, NAME_BYTES)
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
                f"the node's {self.tier} memory budget is {mib(self.budget)}: this pool needs "
                f"{mib(nbytes)} more with {mib(total)} reserved and {mib(sum(lendable.values()))} "
                f"lendable by others ({self.holders()})"
            )
        for other in sorted(lendable, key=lendable.__getitem__, reverse=True):
            if lendable[other] and shortfall > 0:
                entries["trim_wanted"][other] = max(int(entries["trim_wanted"][other]), lendable[other])
                self._count("trims")
                shortfall -= lendable[other]
        return False, None

    def reserve(self, entry: LedgerEntry, nbytes: int, wait: float | None = None) -> None:
        """Count `nbytes` more against the budget for `entry`, asking other pools to trim what
        they lend and waiting up to `wait` seconds (default: wait_s()) for them; BudgetDenied if it
        still does not fit."""
        wait = wait_s() if wait is None else wait
        deadline = time.monotonic() + wait
        asked = False
        while True:
            with self._locked():
                done, why = self._reserve_once(entry.slot, nbytes, asked)
                if done:
                    return
                asked = True
                if why is None and time.monotonic() >= deadline:
                    why = (
                        f"the node's {self.tier} memory budget is {mib(self.budget)} and the other "
                        f"pools did not trim in {wait:.1f} s ({self.holders()})"
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
            self._table.give_up(entry.slot)

    def close(self) -> None:
        self._table.close()


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

    def reserve(self, nbytes: int, wait: float | None = None) -> None:
        self.ledger.reserve(self, nbytes, wait)

    def release(self, nbytes: int) -> None:
        self.ledger.release(self, nbytes)

    def answered(self) -> None:
        self.ledger.answered(self)

    def leave(self) -> None:
        self.ledger.leave(self)
