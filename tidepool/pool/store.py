"""Which memory serves a request (the pool's strategies): exact-size free lists (per stream for
device memory), slabs cut from small arenas for blocks up to SLAB_MAX_BLOCK, buddy allocators
inside large arenas for the rest, and the stream order of memory whose last use may still be
queued (stream_order.py). No lock of its own: the pool holds its lock around every call."""

from __future__ import annotations

from typing import Any

from tidepool.pool.arena import SLAB_MAX_BLOCK, SLAB_SIZE, Arena, Location
from tidepool.pool.resources.base import MemoryResource, StreamEvent
from tidepool.pool.slab import Slab
from tidepool.pool.stream_order import Fences, PendingBlocks

FreeKey = Any  # a capacity, or (stream, capacity) where blocks are reused per stream


def stream_key(stream: Any) -> int:
    """A stream as the driver names it: a raw handle, or torch.cuda.Stream's; 0 for none."""
    if stream is None:
        return 0
    return int(getattr(stream, "cuda_stream", stream))


class BlockStore:
    """The arenas a pool holds and how their free memory is found again. Device blocks are reused
    per stream: a block freed on one stream is handed out again on that stream at once, on another
    only behind an event (Fences). Pinned blocks freed on a stream wait for the work queued there
    to run before anyone writes them (PendingBlocks)."""

    def __init__(self, resource: MemoryResource) -> None:
        self.resource = resource
        self.per_stream = resource.kind == "cuda"
        self.staged = resource.kind == "pinned"
        self.arenas: list[Arena] = []
        self.free: dict[FreeKey, list[Location]] = {}  # size class (per stream) -> free locations
        self.slabs: dict[int, list[Slab]] = {}  # block size -> slabs cut to that size
        self.pending = PendingBlocks()
        self.fences = Fences()

    def key(self, capacity: int, stream: Any) -> FreeKey:
        return (stream_key(stream), capacity) if self.per_stream else capacity

    def capacity_of(self, key: FreeKey) -> int:
        capacity: int = key[1] if self.per_stream else key
        return capacity

    def put_back(self, location: Location, capacity: int, stream: Any) -> None:
        """A freed block's memory, onto its free list (or pending, behind its stream's work)."""
        key = self.key(capacity, stream)
        # Any stream, the legacy default stream (handle 0) included: None is the host's own use.
        if self.staged and stream is not None:
            event = self.resource.record_event(stream_key(stream))
            if event is not None:
                self.pending.add(key, event, location)
                return
        cached = self.free.get(key)
        if cached is None:
            self.free[key] = [location]
        else:
            cached.append(location)

    def settled_pending(self, capacity: int) -> Location | None:
        """A pinned block of this size whose copy has run (asks the events, never waits)."""
        self.pending.settle(self.free)
        cached = self.free.get(capacity)
        return cached.pop() if cached else None

    def oldest_pending(self, capacity: int) -> tuple[StreamEvent, Location] | None:
        """The oldest pinned block of this size still behind its copy, for a caller that waits."""
        return self.pending.take_oldest(capacity)

    def take_held(self, capacity: int) -> Location | None:
        """A free location from the slabs or arenas already held, or None."""
        if capacity <= SLAB_MAX_BLOCK:
            return self._take_from_slab(capacity)
        for arena in self.arenas:
            offset = None if arena.small else arena.buddy.allocate(capacity)
            if offset is not None:
                return Location.at(arena, offset)
        return None

    def _take_from_slab(self, capacity: int) -> Location | None:
        slabs = self.slabs.setdefault(capacity, [])
        slab = next((s for s in slabs if s.free_slots), None)
        if slab is None:
            for arena in self.arenas:
                offset = arena.buddy.allocate(SLAB_SIZE) if arena.small else None
                if offset is not None:
                    slab = Slab(arena, offset, SLAB_SIZE, capacity)
                    slabs.append(slab)
                    break
            else:
                return None
        return Location.at(slab.arena, slab.free_slots.pop(), slab)

    def order_after_fences(self, stream: Any) -> None:
        """Arena memory that other streams gave back is used on `stream` only after their work."""
        if self.fences:
            self.fences.order(stream_key(stream))

    def add_arena(self, arena: Arena, stream: int) -> None:
        """An arena allocated in `stream`'s order: carved for another stream, it is used there only
        after that point (a fence, as for memory a stream gave back)."""
        self.arenas.append(arena)
        self.arenas.sort(key=lambda a: a.size)  # fill small arenas first
        if self.per_stream:
            event = self.resource.record_event(stream)
            if event is not None:
                self.fences.add(stream, event)

    def recycle(self, small_too: bool = True) -> None:
        """Give cached free blocks back to their buddy allocators, merging buddies. With
        `small_too` (trim, OOM) small blocks go back to their slabs and empty slabs to their
        small arenas; otherwise small blocks stay cached, since returning them merges nothing."""
        if self.pending:
            self.pending.settle(self.free)
        for key in list(self.free):
            if self.capacity_of(key) <= SLAB_MAX_BLOCK and not small_too:
                continue
            locs = self.free.pop(key)
            if self.per_stream and locs:
                # Once merged, any stream may take this memory: after the work queued so far on
                # the stream that freed it (the taker's stream waits for this event on the device).
                event = self.resource.record_event(key[0])
                if event is not None:
                    self.fences.add(key[0], event)
            for arena, offset, slab, _ in locs:
                if slab is None:
                    arena.buddy.release(offset)
                else:
                    slab.free_slots.append(offset)
        if small_too:
            for slabs in self.slabs.values():
                for slab in [s for s in slabs if s.empty]:
                    slab.arena.buddy.release(slab.offset)
                    slabs.remove(slab)

    def take_empty_arenas(self, keep_bytes: int, per_kind: bool = False) -> list[Arena]:
        """Take empty arenas off (largest first) while `keep_bytes` stays reserved; with `per_kind`
        (trimming to a learned working set), while the arenas of each kind left hold it: small ones
        serve slabs alone and large ones the rest, so a working set kept in arenas of the other kind
        would be grown again at the next execution. The caller returns them upstream, which orders
        their frees after the fences."""
        taken = []
        held = {kind: sum(a.size for a in self.arenas if a.small == kind) for kind in (True, False)}
        for arena in sorted(self.arenas, key=lambda a: a.size, reverse=True):
            left = held[arena.small] if per_kind else held[True] + held[False]
            if arena.buddy.empty and left - arena.size >= keep_bytes:
                self.arenas.remove(arena)
                held[arena.small] -= arena.size
                taken.append(arena)
        if taken:
            self.order_after_fences(self.resource.release_stream)  # where upstream frees are queued
        return taken

    def has_cached_large(self) -> bool:
        """Whether cached blocks above slab size exist (only merging those changes fragmentation)."""
        return any(locs for key, locs in self.free.items() if self.capacity_of(key) > SLAB_MAX_BLOCK)

    def largest_free_block(self) -> int:
        largest = max((arena.buddy.largest_free() for arena in self.arenas), default=0)
        cached = max((self.capacity_of(key) for key, locs in self.free.items() if locs), default=0)
        in_slabs = max(
            (size for size, slabs in self.slabs.items() if any(s.free_slots for s in slabs)), default=0
        )
        return max(largest, cached, in_slabs)

    def clear(self) -> None:
        self.arenas.clear()
        self.free.clear()
        self.slabs.clear()
