"""Property-based: random allocate/free sequences keep the pool's promises."""

from hypothesis import given, settings
from hypothesis import strategies as st

from tidepool.pool import MemoryPool, OutOfMemory
from tidepool.pool.resources.fake import FakeResource

MiB = 2**20
sizes = st.one_of(st.integers(0, 4096), st.integers(4096, 64 * 1024), st.integers(64 * 1024, 6 * MiB))
steps = st.lists(st.tuples(st.booleans(), sizes, st.integers(0, 1000)), min_size=1, max_size=120)


@settings(max_examples=150, deadline=None)
@given(steps=steps, limit_mib=st.sampled_from([None, 8, 24]), scoped=st.booleans())
def test_random_sequences_keep_every_promise(steps, limit_mib, scoped):
    limit = limit_mib * MiB if limit_mib else None
    pool = MemoryPool(resource=FakeResource(), limit_bytes=limit, arena_bytes=4 * MiB)
    live = []
    ooms = grew = 0
    for allocate, nbytes, pick in steps:
        if allocate or not live:
            upstream = pool.stats().upstream_allocs
            try:
                block = pool.allocate(nbytes)
            except OutOfMemory:
                ooms += 1
                continue
            grew += pool.stats().upstream_allocs > upstream
            assert block.ptr % 256 == 0 and block.capacity >= nbytes
            live.append(block)
        else:
            freed = live.pop(pick % len(live))
            freed.free()
            if pick % 3 == 0:  # taken again at once: the same block, from the free list
                hits = pool.stats().free_list_hits
                again = pool.allocate(freed.nbytes)
                assert again.ptr == freed.ptr and pool.stats().free_list_hits == hits + 1
                live.append(again)
        spans = sorted((b.ptr, b.ptr + b.capacity) for b in live)
        assert all(end <= start for (_, end), (start, _) in zip(spans, spans[1:], strict=False))
        stats = pool.stats()
        assert stats.allocated_bytes == sum(b.capacity for b in live)
        assert stats.live_blocks == len(live) == stats.num_allocs - stats.num_frees
        assert stats.allocated_bytes <= stats.reserved_bytes <= stats.peak_reserved_bytes
        assert stats.peak_allocated_bytes >= stats.allocated_bytes
        # Each allocation counted once: from memory the pool held (a cache hit), or by growing.
        assert stats.cache_hits == stats.num_allocs - grew
        assert stats.num_ooms == ooms
        if limit is not None:
            assert stats.reserved_bytes <= limit
        assert 0.0 <= stats.fragmentation <= 1.0
    if scoped:
        with pool.execution() as scope:
            for block in live:
                try:
                    pool.allocate(block.nbytes)
                except OutOfMemory:
                    break
        assert scope.live_bytes == 0 and not any(b.freed for b in live)
    for block in live:
        block.free()
    assert pool.stats().allocated_bytes == 0 and pool.stats().live_blocks == 0
