"""A snapshot of a pool's figures, as a dataclass and as a plain dict (for metrics and JSON)."""

from __future__ import annotations

from dataclasses import asdict, dataclass


@dataclass(frozen=True)
class PoolStats:
    kind: str
    reserved_bytes: int  # held from upstream (arenas)
    allocated_bytes: int  # capacity of live blocks
    peak_reserved_bytes: int
    peak_allocated_bytes: int
    num_allocs: int
    num_frees: int
    cache_hits: int  # allocations served from memory the pool already held
    free_list_hits: int  # of those, served straight from an exact-size free list
    upstream_allocs: int
    upstream_frees: int
    largest_free_block: int | None  # None when the stats were taken without walking the arenas
    num_ooms: int
    num_arenas: int
    live_blocks: int
    # The node budget (ledger.py); zero for a pool outside one.
    floor_bytes: int = 0  # what the pool never lends
    budget_trims: int = 0  # trim requests of other pools this one answered
    budget_denials: int = 0  # reservations the node budget refused this pool
    staging_waits: int = 0  # pinned blocks the host waited for, their last copy still queued

    @property
    def free_bytes(self) -> int:
        return self.reserved_bytes - self.allocated_bytes

    @property
    def reuse_ratio(self) -> float:
        """Cache hits / allocations (1.0 before any allocation)."""
        return self.cache_hits / self.num_allocs if self.num_allocs else 1.0

    @property
    def fragmentation(self) -> float | None:
        """1 - largest free block / free bytes (TF BFC's measure); 0 when nothing is free."""
        if self.largest_free_block is None:
            return None
        free = self.free_bytes
        return 1.0 - self.largest_free_block / free if free > 0 else 0.0

    def as_dict(self) -> dict[str, float | int | str | None]:
        values = asdict(self)
        values.update(
            free_bytes=self.free_bytes, reuse_ratio=self.reuse_ratio, fragmentation=self.fragmentation
        )
        return values
