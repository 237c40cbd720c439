"""The memory pool: exact-size free lists in front of slabs (small blocks) and buddy arenas
(large blocks) that grow on demand from an upstream resource, under a hard limit, with stats,
execution scopes, and trimming at quiet moments. Memory a live view still uses (see block.py) is
neither reused nor given back until the view goes, nor memory a queued copy still uses
(stream_order.py). Nothing waits (for the node budget, a stream or the driver) with its lock held."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from tidepool.pool.arena import (
    ALIGNMENT,
    DEFAULT_ARENA_BYTES,
    SLAB_MAX_BLOCK,
    SLAB_SIZE,
    SMALL_ARENA_BYTES,
    Arena,
    Location,
    next_power_of_two,
)
from tidepool.pool.block import Block
from tidepool.pool.errors import OutOfMemory, PoolError
from tidepool.pool.ledger import BudgetDenied, LedgerEntry
from tidepool.pool.maintenance import Maintenance
from tidepool.pool.resources import make_resource
from tidepool.pool.resources.base import MemoryResource
from tidepool.pool.resources.budgeted import BudgetedResource
from tidepool.pool.scope import ExecutionScope, ThreadState
from tidepool.pool.stats import PoolStats
from tidepool.pool.store import BlockStore, stream_key
from tidepool.pool.views import Views

DEFAULT_FRAGMENTATION_THRESHOLD = 0.10


class MemoryPool(Maintenance):
    """Hands out Blocks; in steady state every block comes from memory it already holds.

    kind: "auto" (CUDA when a driver and device are present, else host), "host", "pinned",
    "cuda". limit_bytes caps reserved memory; initial_bytes is reserved at creation;
    fragmentation_threshold triggers recycling and trimming at the end of an execution, or, with
    `defer_housekeeping`, at the next `housekeep()` (a model instance calls it between executions,
    from its background thread). With a `budget` (a node ledger entry, see ledger.py) every
    upstream allocation is also counted against the node's budget, and `answer_trim` gives back
    what the pool holds above its floor."""

    def __init__(
        self,
        kind: str = "auto",
        device: int = 0,
        limit_bytes: int | None = None,
        initial_bytes: int = 0,
        arena_bytes: int = DEFAULT_ARENA_BYTES,
        fragmentation_threshold: float = DEFAULT_FRAGMENTATION_THRESHOLD,
        resource: MemoryResource | None = None,
        budget: LedgerEntry | None = None,
        defer_housekeeping: bool = False,
        reclaim: Callable[[], object] | None = None,
    ) -> None:
        if limit_bytes is not None and limit_bytes <= 0:
            raise PoolError(f"limit_bytes must be positive, got {limit_bytes}")
        if not 0.0 <= fragmentation_threshold <= 1.0:
            raise PoolError(f"fragmentation_threshold must be in [0, 1], got {fragmentation_threshold}")
        if resource is None:
            resource, self.kind_reason = make_resource(kind, device, limit_bytes)
        else:
            self.kind_reason = f"given resource {type(resource).__name__}"
        self.budget = budget
        # What the pool asks of whoever else caches the same memory before it reports the device
        # out of memory (a GPU instance: torch's caching allocator empties its cache).
        self.reclaim = reclaim
        if budget is not None:
            resource = BudgetedResource(resource, budget)
        self.resource = resource
        self.kind: str = resource.kind
        self.device = resource.device
        self.limit_bytes = limit_bytes
        self.arena_bytes = next_power_of_two(max(arena_bytes, SLAB_SIZE))
        self.fragmentation_threshold = fragmentation_threshold
        self._store = BlockStore(resource)
        self._free = self._store.free  # the hot path's dict, reached without an attribute hop
        self.defer_housekeeping = defer_housekeeping
        self._housekeeping_due = False

        self._lock = threading.Lock()
        self._local = ThreadState()
        self._closed = False
        self._views = Views(self._lock, self._settle_export)
        self._orphans: list[Arena] = []  # arenas of a closed pool that views still use
        self._active_scopes = 0
        self._working_set = 0  # the largest execution peak seen
        self._reserved = self._allocated = self._peak_reserved = self._peak_allocated = 0
        self._num_allocs = self._num_frees = self._free_list_hits = self._held_hits = 0
        self._upstream_allocs = self._upstream_frees = self._num_ooms = 0
        self._budget_trims = self._budget_denials = self._staging_waits = 0
        self.initial_bytes = initial_bytes
        if initial_bytes > 0:
            with self._lock:
                self._add_arena(self.initial_arena_bytes(initial_bytes), None, small=False)

    # -- the hot path ---------------------------------------------------------------------

    def allocate(self, nbytes: int, stream: Any = None) -> Block:
        """A block of at least `nbytes`, aligned to 256 bytes; OutOfMemory past the limit."""
        if type(nbytes) is not int or nbytes < 0:
            raise PoolError(f"allocate: nbytes must be a non-negative int, got {nbytes!r}")
        capacity = ALIGNMENT if nbytes <= ALIGNMENT else next_power_of_two(nbytes)  # size_class
        key = self._store.key(capacity, stream)
        with self._lock:
            if self._closed:
                raise PoolError("allocate: the pool is closed")
            cached = self._free.get(key)
            if cached:
                loc = cached.pop()
                self._free_list_hits += 1
            else:
                loc = self._allocate_uncached(capacity, nbytes, stream)
            self._num_allocs += 1
            allocated = self._allocated + capacity
            self._allocated = allocated
            if allocated > self._peak_allocated:
                self._peak_allocated = allocated
            block = Block(self, loc, nbytes, capacity, stream)
            scope = self._local.scope
            if scope is not None:
                scope.add(block)
        if self._views.waiting:
            self._views.drain_soon()
        return block

    def release(self, block: Block) -> None:
        """Take a block back onto its free list (what `Block.free` calls); a block that views still
        use goes back when the last of them does, a pinned block freed on a stream once the work
        queued there so far has run."""
        with self._lock:
            if block.freed:
                raise PoolError(f"free: block at {block.ptr:#x} ({block.nbytes} bytes) was already freed")
            if self._closed:
                raise PoolError(f"free: the pool of block {block.ptr:#x} is closed")
            block.freed = True
            if block.scope is not None:
                block.scope.released(block)
            if block.exports:
                block.release_pending = True
            else:
                self._put_back(block)
        if self._views.waiting:
            self._views.drain_soon()

    def _put_back(self, block: Block) -> None:
        self._allocated -= block.capacity
        self._num_frees += 1
        self._store.put_back(block.location, block.capacity, block.stream)

    # -- exports (views): see views.py -----------------------------------------------------

    def export_started(self, block: Block) -> None:
        with self._lock:
            self._views.started(block)

    def export_ended(self, block: Block) -> None:
        self._views.ended(block)

    def _settle_export(self, block: Block) -> None:
        """With the lock: the last view of `block` went; what its free or the pool's close left
        waiting on it happens now."""
        arena = block.location.arena
        if block.release_pending:
            block.release_pending = False
            if not self._closed:
                self._put_back(block)
        if self._closed and not arena.exports and arena in self._orphans:
            self._orphans.remove(arena)
            self.resource.deallocate(arena.allocation)
            self._upstream_frees += 1
            if not self._orphans:
                self.resource.close()

    @contextmanager
    def _unlocked(self) -> Iterator[None]:
        """Let go of the lock (held by the caller) while waiting: for the node budget, a stream,
        the driver. Whatever the caller holds (a taken location, reserved bytes) is already its own."""
        self._lock.release()
        try:
            yield
        finally:
            self._lock.acquire()

    # -- the slow path (lock held) ----------------------------------------------------------

    def _allocate_uncached(self, capacity: int, nbytes: int, stream: Any) -> Location:
        store = self._store
        if store.pending:
            loc = self._take_pending(capacity)
            if loc is not None:
                self._free_list_hits += 1
                return loc
        loc = store.take_held(capacity)
        if loc is None:
            store.recycle()  # cached blocks of other sizes, merged back, may serve it
            loc = store.take_held(capacity)
        if loc is not None:
            self._held_hits += 1  # memory already reserved: a cache hit, though not an exact one
        else:
            loc = self._grow_and_take(capacity, nbytes, stream)
        store.order_after_fences(stream)
        return loc

    def _take_pending(self, capacity: int) -> Location | None:
        """A pinned block of this size whose copy has run, waiting (without the lock) for the
        oldest one's copy where none has: a steady pool reuses its blocks rather than growing."""
        loc = self._store.settled_pending(capacity)
        if loc is not None:
            return loc
        oldest = self._store.oldest_pending(capacity)
        if oldest is None:
            return None
        event, loc = oldest
        with self._unlocked():
            event.wait()
            event.close()
        self._staging_waits += 1
        return loc

    def _grow_and_take(self, capacity: int, nbytes: int, stream: Any) -> Location:
        """Reserve a new arena (trimming empty ones first if that is what it takes, and where the
        device refused, asking `reclaim` to give back what others cache of it)."""
        small = capacity <= SLAB_MAX_BLOCK
        need = SLAB_SIZE if small else max(capacity, 2 * SLAB_MAX_BLOCK)
        cause, refused_by_budget, refused_by_device = "", False, False
        for trim_first in (False, True):
            if trim_first:
                self._store.recycle()
                empty = self._take_empty_arenas(keep_bytes=0)
                reclaim = self.reclaim if refused_by_device else None
                if empty or reclaim is not None:
                    with self._unlocked():
                        self._give_back(empty)
                        if reclaim is not None:
                            reclaim()
                taken = self._store.take_held(capacity)  # others may have freed meanwhile
                if taken is not None:
                    return taken
            size = max(SMALL_ARENA_BYTES if small else self.arena_bytes, need)
            if self.limit_bytes is not None and self._reserved + size > self.limit_bytes:
                size = need  # the smallest arena that serves this request
            if self.budget is not None and size > need and self._beyond_share(size):
                size = need
            if self.limit_bytes is not None and self._reserved + size > self.limit_bytes:
                cause = "the pool's limit would be exceeded"
                continue
            try:
                self._add_arena(size, stream, small)
            except BudgetDenied as exc:
                self._budget_denials += 1
                cause, refused_by_budget = str(exc), True
                continue
            except MemoryError as exc:
                cause, refused_by_budget = f"upstream {self.kind} memory refused {size} bytes ({exc})", False
                refused_by_device = True
                continue
            taken = self._store.take_held(capacity)
            assert taken is not None, "a fresh arena large enough always serves the request"
            return taken
        raise self._out_of_memory(nbytes, cause, refused_by_budget, refused_by_device)

    def _beyond_share(self, size: int) -> bool:
        """Whether an arena of `size` would take more of the node budget than this pool's even
        share, or than what is free: then the pool grows by what the request needs, so that memory
        it would only cache stays with the budget (and no other pool is asked to trim for it)."""
        assert self.budget is not None
        return self._reserved + size > self.budget.fair_share() or size > self.budget.available()

    def _out_of_memory(
        self, nbytes: int, cause: str, node_budget: bool = False, device: bool = False
    ) -> OutOfMemory:
        self._num_ooms += 1
        return OutOfMemory(
            requested=nbytes,
            allocated=self._allocated,
            reserved=self._reserved,
            limit=self.limit_bytes,
            largest_free_block=self._store.largest_free_block(),
            cause=cause,
            node_budget=node_budget,
            device=device,
        )

    def _add_arena(self, size: int, stream: Any, small: bool) -> None:
        """Grow by `size` from upstream, without the lock while upstream (and the node budget, which
        may wait for other pools to trim) answers; the bytes count as reserved meanwhile, so that
        another thread's growth sees them against the limit."""
        self._reserved += size
        try:
            on_stream = stream_key(stream) if self._store.per_stream else None
            with self._unlocked():
                allocation = self.resource.allocate(size, on_stream)
        except BaseException:
            self._reserved -= size
            raise
        if self._closed:
            self._reserved -= size
            self.resource.deallocate(allocation)
            raise PoolError("allocate: the pool was closed meanwhile")
        self._store.add_arena(Arena(allocation, small), on_stream or 0)
        self._upstream_allocs += 1
        self._peak_reserved = max(self._peak_reserved, self._reserved)

    # -- scopes and stats ---------------------------------------------------------

    def begin_execution(self) -> ExecutionScope:
        """Start collecting this thread's allocations into a new scope; `scope.release()` gives
        them back (at a quiet moment, with no other execution open, the pool then recycles and
        trims if fragmentation is high)."""
        scope = ExecutionScope(self, self._local.scope)
        self._local.scope = scope
        with self._lock:
            self._active_scopes += 1
        return scope

    @contextmanager
    def execution(self) -> Iterator[ExecutionScope]:
        """A scope whose blocks all go back at exit."""
        scope = self.begin_execution()
        try:
            yield scope
        finally:
            scope.release()

    def _end_collecting(self, scope: ExecutionScope) -> None:
        if self._local.scope is scope:
            self._local.scope = scope.outer

    def _end_execution(self, scope: ExecutionScope) -> None:
        empty: list[Arena] = []
        with self._lock:
            self._active_scopes -= 1
            self._working_set = max(self._working_set, scope.peak_bytes)
            if self._active_scopes == 0 and self._maintenance_wanted():
                if self.defer_housekeeping:
                    self._housekeeping_due = True
                else:
                    empty = self._maintain()
        if empty:
            self._give_back(empty)

    def stats(self, walk_arenas: bool = True) -> PoolStats:
        """The pool's figures. Without `walk_arenas` the largest free block (and so fragmentation)
        is left out: the rest are counters, cheap enough to read after every execution."""
        with self._lock:
            return PoolStats(
                kind=self.kind,
                reserved_bytes=self._reserved,
                allocated_bytes=self._allocated,
                peak_reserved_bytes=self._peak_reserved,
                peak_allocated_bytes=self._peak_allocated,
                num_allocs=self._num_allocs,
                num_frees=self._num_frees,
                cache_hits=self._free_list_hits + self._held_hits,
                free_list_hits=self._free_list_hits,
                upstream_allocs=self._upstream_allocs,
                upstream_frees=self._upstream_frees,
                largest_free_block=self._store.largest_free_block() if walk_arenas else None,
                num_ooms=self._num_ooms,
                num_arenas=len(self._store.arenas),
                live_blocks=self._num_allocs - self._num_frees,
                floor_bytes=self.budget.floor if self.budget is not None else 0,
                budget_trims=self._budget_trims,
                budget_denials=self._budget_denials,
                staging_waits=self._staging_waits,
            )

    @property
    def allocated_bytes(self) -> int:
        """Bytes of blocks in use now (a read without the lock, for the ledger's figures)."""
        return self._allocated

    @staticmethod
    def initial_arena_bytes(initial_bytes: int) -> int:
        """What a pool created with `initial_bytes` reserves at once: its floor."""
        return next_power_of_two(max(initial_bytes, SLAB_SIZE)) if initial_bytes > 0 else 0

    @property
    def closed(self) -> bool:
        return self._closed

    def close(self) -> None:
        """Give everything back upstream, once the copies queued on pinned blocks have run. Blocks
        still live become unusable; an arena that views still use goes back (and the resource
        closes) when the last of those views does."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            waiting = list(self._store.pending.take_all())
            # Device blocks still cached per stream leave fences as they merge back: the frees
            # below are queued after the work that used them.
            self._store.recycle()
            self._store.order_after_fences(self.resource.release_stream)
        for event, _ in waiting:
            event.wait()
            event.close()
        with self._lock:
            for arena in self._store.arenas:
                if arena.exports:
                    self._orphans.append(arena)
                else:
                    self.resource.deallocate(arena.allocation)
                    self._upstream_frees += 1
            self._store.clear()
            self._reserved = self._allocated = 0
            close_now = not self._orphans
        if close_now:
            self.resource.close()
        if self._views.waiting:
            self._views.drain_soon()

    def __enter__(self) -> MemoryPool:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<MemoryPool {self.kind} reserved={self._reserved} allocated={self._allocated}>"
