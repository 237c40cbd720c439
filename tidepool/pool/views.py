"""The views of a pool's blocks (block.py): how many exports each block and each arena has, and the
exports that ended. An export can end in any thread, inside garbage collection that runs while
that thread holds the pool's lock, so an ending is only queued (an atomic append) and settled by
whoever holds or next takes the lock."""

from __future__ import annotations

import collections
import threading
from collections.abc import Callable

from tidepool.pool.block import Block


class Views:
    def __init__(self, lock: threading.Lock, settle: Callable[[Block], None]) -> None:
        self._lock = lock  # the pool's
        self._settle = settle  # with the lock: the block's last view went
        self._ended: collections.deque[Block] = collections.deque()

    @property
    def waiting(self) -> bool:
        """Whether ended exports wait to be settled (a read without the lock)."""
        return bool(self._ended)

    def started(self, block: Block) -> None:
        """With the lock: a view of `block` now exists (its first since the last one went)."""
        block.exports += 1
        if block.exports == 1:
            block.location.arena.exports += 1

    def ended(self, block: Block) -> None:
        self._ended.append(block)  # atomic: never blocks, whatever this thread holds
        self.drain_soon()

    def drain_soon(self) -> None:
        """Settle ended exports if the lock is free now; if it is not, its holder does on release."""
        while self._ended and self._lock.acquire(blocking=False):
            try:
                self._drain()
            finally:
                self._lock.release()

    def _drain(self) -> None:
        while self._ended:
            block = self._ended.popleft()
            block.exports -= 1
            if block.exports:
                continue
            block.location.arena.exports -= 1
            self._settle(block)
