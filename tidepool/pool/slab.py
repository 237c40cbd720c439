"""A slab: one buddy block cut into equal small blocks, so many small buffers cost one buddy
block and no per-block bookkeeping beyond a free-slot list."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from tidepool.pool.arena import Arena


class Slab:
    __slots__ = ("arena", "offset", "block_size", "free_slots", "slots")

    def __init__(self, arena: Arena, offset: int, slab_size: int, block_size: int) -> None:
        self.arena = arena
        self.offset = offset  # the slab's own buddy block within the arena
        self.block_size = block_size
        self.slots = slab_size // block_size
        self.free_slots = [offset + i * block_size for i in range(self.slots - 1, -1, -1)]

    @property
    def empty(self) -> bool:
        """No slot handed out (every slot is back on the free-slot list)."""
        return len(self.free_slots) == self.slots
