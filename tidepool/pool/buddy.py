"""A buddy allocator over one arena: blocks of 2^k bytes at offsets from the arena's start,
split on allocation and merged with their buddy on free. Offsets only; no memory is touched."""

from __future__ import annotations


class BuddyAllocator:
    def __init__(self, size: int, min_block: int) -> None:
        if size & (size - 1) or min_block & (min_block - 1) or min_block > size:
            raise ValueError(f"size {size} and min_block {min_block} must be powers of two, min <= size")
        self.size = size
        self.min_order = min_block.bit_length() - 1
        self.max_order = size.bit_length() - 1
        # free[k]: offsets of free blocks of 2^k bytes
        self.free: list[set[int]] = [set() for _ in range(self.max_order + 1)]
        self.free[self.max_order].add(0)
        self.used: dict[int, int] = {}  # offset -> order
        self.used_bytes = 0

    def order_for(self, nbytes: int) -> int:
        return max(self.min_order, (max(nbytes, 1) - 1).bit_length())

    def allocate(self, nbytes: int) -> int | None:
        """Offset of a free block of at least `nbytes` (a power of two), or None if none fits."""
        order = self.order_for(nbytes)
        if order > self.max_order:
            return None
        found = next((k for k in range(order, self.max_order + 1) if self.free[k]), None)
        if found is None:
            return None
        offset = self.free[found].pop()
        for k in range(found - 1, order - 1, -1):  # split, keeping the lower half
            self.free[k].add(offset + (1 << k))
        self.used[offset] = order
        self.used_bytes += 1 << order
        return offset

    def release(self, offset: int) -> None:
        order = self.used.pop(offset)
        self.used_bytes -= 1 << order
        while order < self.max_order:
            buddy = offset ^ (1 << order)
            if buddy not in self.free[order]:
                break
            self.free[order].remove(buddy)
            offset = min(offset, buddy)
            order += 1
        self.free[order].add(offset)

    def largest_free(self) -> int:
        return next((1 << k for k in range(self.max_order, -1, -1) if self.free[k]), 0)

    @property
    def empty(self) -> bool:
        return not self.used
