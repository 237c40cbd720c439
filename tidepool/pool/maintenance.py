"""What a memory pool does besides handing out blocks: the maintenance an execution's end leaves
due (recycling cached blocks and giving back arenas beyond the working set where fragmentation
passed its threshold), trims, and answers to the node ledger's trim requests. Arenas go back
upstream after the pool's lock is let go. A mixin of MemoryPool, whose state it reads."""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING

from tidepool.pool.arena import Arena

if TYPE_CHECKING:
    from tidepool.pool.ledger import LedgerEntry
    from tidepool.pool.resources.base import MemoryResource
    from tidepool.pool.store import BlockStore

WORKING_SET_HEADROOM = 1.25


class Maintenance:
    # MemoryPool's, read and written here.
    _lock: threading.Lock
    _store: BlockStore
    _closed: bool
    _reserved: int
    _allocated: int
    _peak_reserved: int
    _peak_allocated: int
    _working_set: int  # the largest execution peak seen
    _upstream_frees: int
    _budget_trims: int
    _housekeeping_due: bool
    resource: MemoryResource
    budget: LedgerEntry | None
    initial_bytes: int
    fragmentation_threshold: float

    def _maintenance_wanted(self) -> bool:
        """With the lock: whether fragmentation passed the threshold with cached large blocks to
        merge (only those can change it)."""
        if not self._store.has_cached_large():
            return False
        free = self._reserved - self._allocated
        return free > 0 and 1 - self._store.largest_free_block() / free > self.fragmentation_threshold

    def _maintain(self) -> list[Arena]:
        """With the lock: recycle cached large blocks and take the empty arenas beyond the working
        set (the caller gives them back)."""
        if not self._maintenance_wanted():
            return []
        self._store.recycle(small_too=False)
        keep = max(self.initial_bytes, int(self._working_set * WORKING_SET_HEADROOM))
        return self._take_empty_arenas(keep, per_kind=True)

    @property
    def housekeeping_due(self) -> bool:
        """Whether `housekeep()` has work: an execution ended since, or another pool wants memory
        (a read without the lock, cheap enough after every execution)."""
        return self._housekeeping_due or (self.budget is not None and self.budget.trim_wanted() > 0)

    def housekeep(self) -> int:
        """What a deferred pool does between executions: the end-of-execution maintenance, and an
        answer to another pool's trim request; returns the bytes given back."""
        empty: list[Arena] = []
        with self._lock:
            if self._housekeeping_due and not self._closed:
                self._housekeeping_due = False
                empty = self._maintain()
        return self._give_back(empty) + self.answer_trim()

    def _take_empty_arenas(self, keep_bytes: int, per_kind: bool = False) -> list[Arena]:
        """Take empty arenas off the pool while `keep_bytes` stays reserved (store.take_empty_arenas);
        `_give_back` then returns them upstream, without the lock."""
        taken = self._store.take_empty_arenas(keep_bytes, per_kind)
        self._reserved -= sum(arena.size for arena in taken)
        self._upstream_frees += len(taken)
        return taken

    def _give_back(self, arenas: list[Arena]) -> int:
        """Return arenas upstream (a budgeted CUDA pool waits there for the driver to have them)."""
        for arena in arenas:
            self.resource.deallocate(arena.allocation)
        return sum(arena.size for arena in arenas)

    def reset_peak(self) -> None:
        with self._lock:
            self._peak_allocated = self._allocated
            self._peak_reserved = self._reserved
            self._working_set = 0

    def trim(self, keep_bytes: int = 0) -> int:
        """Recycle cached blocks and give empty arenas back upstream while more than
        `keep_bytes` stays reserved; returns the bytes given back."""
        with self._lock:
            self._store.recycle()
            empty = self._take_empty_arenas(keep_bytes)
        released = self._give_back(empty)
        self.resource.trim(keep_bytes)
        return released

    def answer_trim(self) -> int:
        """Where another pool of the node asked for memory: give back what this pool holds above
        its floor (cached blocks and empty arenas); returns the bytes given back. Cheap when
        nobody asked: one read of this pool's ledger row."""
        if self.budget is None or not self.budget.trim_wanted() or self._closed:
            return 0
        with self._lock:
            # Counted before the memory goes back: the pool that waits for it may read the
            # figures as soon as it is released.
            self._budget_trims += 1
        released = self.trim(keep_bytes=self.budget.floor)
        self.budget.answered()
        return released
