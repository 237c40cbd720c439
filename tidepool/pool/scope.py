"""Execution scopes: the blocks one execution allocated on its thread, given back together at its
end, and its peak; the pool's per-thread state that says which scope collects now."""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING

from tidepool.pool.block import Block

if TYPE_CHECKING:
    from tidepool.pool.memory_pool import MemoryPool


class ExecutionScope:
    """The blocks of one execution, and its peak. Blocks allocated on the scope's thread while it
    collects join it; `release()` gives back every one still live. A scope can stop collecting
    before it releases, so what an execution returns outlives the work that made it."""

    def __init__(self, pool: MemoryPool, outer: ExecutionScope | None) -> None:
        self.pool = pool
        self.outer = outer  # the scope collecting before this one began, restored when it stops
        self.blocks: list[Block] = []
        self.live_bytes = 0
        self.peak_bytes = 0
        self.collecting = True
        self.done = False

    def add(self, block: Block) -> None:
        block.scope = self
        self.blocks.append(block)
        self.live_bytes += block.capacity
        if self.live_bytes > self.peak_bytes:
            self.peak_bytes = self.live_bytes

    def released(self, block: Block) -> None:
        self.live_bytes -= block.capacity

    def mark(self) -> int:
        """A point to go back to with `release_from` (e.g. before an attempt that may fail)."""
        return len(self.blocks)

    def release_from(self, mark: int) -> None:
        """Give back the blocks allocated since `mark`; the earlier ones stay."""
        for block in self.blocks[mark:]:
            if not block.freed:
                block.free()
        del self.blocks[mark:]

    def stop_collecting(self) -> None:
        if self.collecting:
            self.collecting = False
            self.pool._end_collecting(self)

    def release(self) -> None:
        """Give back every block still live (once; later calls do nothing)."""
        if self.done:
            return
        self.stop_collecting()
        self.release_from(0)
        self.done = True
        self.pool._end_execution(self)


class ThreadState(threading.local):
    scope: ExecutionScope | None = None  # a class default: reading it never misses (a miss is slow)
