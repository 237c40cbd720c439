"""Arenas (one upstream allocation each, carved by a buddy allocator) and the typed location of a
block inside one; the sizes that decide which blocks come from slabs and which from buddies."""

from __future__ import annotations

from typing import NamedTuple

from tidepool.pool.buddy import BuddyAllocator
from tidepool.pool.resources.base import Allocation
from tidepool.pool.slab import Slab

ALIGNMENT = 256  # the smallest block, and the alignment of every block
SLAB_MAX_BLOCK = 32 * 1024  # blocks up to this size are cut from slabs
SLAB_SIZE = 256 * 1024  # one slab is one buddy block of this size
SMALL_ARENA_BYTES = 2 * 2**20  # slabs come from arenas of their own, so they never split large ones
DEFAULT_ARENA_BYTES = 64 * 2**20


def next_power_of_two(nbytes: int) -> int:
    """The smallest power of two >= nbytes (1 for 0 and 1)."""
    return 1 << (nbytes - 1).bit_length() if nbytes > 1 else 1  # no max(): allocate calls this


def size_class(nbytes: int) -> int:
    """The capacity a request gets: a power of two, at least ALIGNMENT."""
    return ALIGNMENT if nbytes <= ALIGNMENT else next_power_of_two(nbytes)


class Arena:
    """One upstream allocation, carved by a buddy allocator: into slabs (a small arena) or into
    large blocks."""

    __slots__ = ("allocation", "base", "size", "buddy", "host_view", "small", "exports")

    def __init__(self, allocation: Allocation, small: bool) -> None:
        self.allocation = allocation
        self.base = allocation.ptr
        self.size = allocation.nbytes
        self.small = small
        self.buddy = BuddyAllocator(self.size, min_block=SLAB_SIZE if small else 2 * SLAB_MAX_BLOCK)
        self.host_view = allocation.host_view
        self.exports = 0  # blocks in it with live exports: while any, it is not given back upstream


class Location(NamedTuple):
    """Where a block lives: its arena, its offset in it, the slab it was cut from (if any), and its
    address (kept here, so that handing out a recycled location computes nothing)."""

    arena: Arena
    offset: int
    slab: Slab | None
    ptr: int

    @classmethod
    def at(cls, arena: Arena, offset: int, slab: Slab | None = None) -> Location:
        return cls(arena, offset, slab, arena.base + offset)
