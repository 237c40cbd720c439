"""The pool's logic on fake addresses (no memory), and its views on real host memory."""

import threading

import numpy as np
import pytest
import torch

from tidepool.pool import MemoryPool, OutOfMemory, PoolError, size_class
from tidepool.pool.arena import SLAB_SIZE, SMALL_ARENA_BYTES
from tidepool.pool.errors import CudaUnavailable
from tidepool.pool.resources.fake import FakeResource

MiB = 2**20


def fake_pool(**kwargs) -> MemoryPool:
    return MemoryPool(resource=FakeResource(), arena_bytes=kwargs.pop("arena_bytes", 16 * MiB), **kwargs)


def test_size_classes_are_powers_of_two_of_at_least_256():
    assert [size_class(n) for n in (0, 1, 256, 257, 1000, 1 << 20)] == [256, 256, 256, 512, 1024, 1 << 20]


def test_a_repeated_shape_is_served_from_the_free_list_without_upstream():
    pool = fake_pool()
    first = pool.allocate(3 * MiB)
    address = first.ptr
    first.free()
    for _ in range(100):
        with pool.allocate(3 * MiB) as block:
            assert block.ptr == address
    stats = pool.stats()
    assert stats.upstream_allocs == 1 and stats.free_list_hits == 100 and stats.num_allocs == 101
    assert stats.reuse_ratio == pytest.approx(100 / 101)


def test_blocks_are_aligned_and_at_least_as_large_as_asked():
    pool = fake_pool()
    for nbytes in (1, 255, 256, 300, 5000, 40_000, 700_000, 5 * MiB):
        block = pool.allocate(nbytes)
        assert block.ptr % 256 == 0 and block.capacity >= nbytes and block.nbytes == nbytes


def test_double_free_and_use_after_free_are_refused_clearly():
    pool = MemoryPool("host")
    block = pool.allocate(100)
    block.free()
    with pytest.raises(PoolError, match="already freed"):
        block.free()
    with pytest.raises(PoolError, match="as_numpy: block at 0x[0-9a-f]+ .100 bytes. was already freed"):
        block.as_numpy()
    with pytest.raises(PoolError, match="non-negative int"):
        pool.allocate(-1)
    pool.close()
    with pytest.raises(PoolError, match="the pool is closed"):
        pool.allocate(10)


def test_the_limit_raises_out_of_memory_with_the_figures_and_the_pool_keeps_serving():
    pool = fake_pool(limit_bytes=8 * MiB, arena_bytes=4 * MiB)
    kept = pool.allocate(3 * MiB)  # a 4 MiB block
    with pytest.raises(OutOfMemory) as caught:
        pool.allocate(6 * MiB)
    error = caught.value
    assert isinstance(error, MemoryError)
    assert (error.requested, error.limit) == (6 * MiB, 8 * MiB)
    assert error.allocated == 4 * MiB and error.reserved == 4 * MiB
    assert "requested 6291456 bytes" in str(error) and "limit 8.00 MiB" in str(error)
    assert pool.stats().num_ooms == 1
    with pool.allocate(2 * MiB) as fits:
        assert fits.capacity == 2 * MiB
    kept.free()


def test_cached_blocks_are_recycled_before_the_limit_is_declared_hit():
    pool = fake_pool(limit_bytes=16 * MiB, arena_bytes=16 * MiB)
    for size in (1 * MiB, 2 * MiB, 4 * MiB):
        pool.allocate(size).free()  # all cached in free lists, splitting the arena
    with pool.allocate(16 * MiB) as whole:  # only fits once the cached blocks merge back
        assert whole.capacity == 16 * MiB
    assert pool.stats().upstream_allocs == 1 and pool.stats().num_ooms == 0


def test_empty_arenas_are_trimmed_to_make_room_for_a_larger_one():
    pool = fake_pool(limit_bytes=12 * MiB, arena_bytes=4 * MiB)
    pool.allocate(1 * MiB).free()  # one 4 MiB arena, now empty
    with pool.allocate(8 * MiB):  # 4 + 8 fits the limit
        pass
    assert pool.stats().reserved_bytes == 12 * MiB
    with pytest.raises(OutOfMemory, match="reserved 0.00 MiB"):
        pool.allocate(9 * MiB)  # needs 16 MiB: over the limit even after trimming both arenas
    assert pool.stats().upstream_frees == 2


def test_trim_gives_back_empty_arenas_and_keeps_what_is_asked():
    pool = fake_pool(arena_bytes=4 * MiB)
    blocks = [pool.allocate(3 * MiB) for _ in range(3)]  # three arenas
    for block in blocks:
        block.free()
    assert pool.stats().reserved_bytes == 12 * MiB
    assert pool.trim(keep_bytes=4 * MiB) == 8 * MiB
    assert pool.stats().reserved_bytes == 4 * MiB and pool.stats().upstream_frees == 2
    assert pool.trim() == 4 * MiB and pool.stats().reserved_bytes == 0


def test_an_execution_scope_returns_its_blocks_and_records_its_peak():
    pool = fake_pool()
    with pool.execution() as scope:
        a = pool.allocate(1 * MiB)
        b = pool.allocate(1 * MiB)
        a.free()
        pool.allocate(300)
    assert scope.peak_bytes == 2 * MiB
    assert b.freed and pool.stats().allocated_bytes == 0 and pool.stats().live_blocks == 0


def test_at_a_quiet_moment_high_fragmentation_is_recycled_away():
    pool = fake_pool(arena_bytes=64 * MiB)
    with pool.execution():
        for size in (1 * MiB, 2 * MiB, 4 * MiB, 300, 5000):
            pool.allocate(size)
    stats = pool.stats()
    # Slabs stay in their own 2 MiB arena: only their free slots count as fragmented.
    assert stats.fragmentation <= 0.10 and stats.largest_free_block == 64 * MiB


def test_maintenance_keeps_the_large_arena_a_working_set_of_large_blocks_needs():
    # Executions of varying large blocks (text traffic: every request its own length) leave cached
    # blocks of other sizes, fragmentation over the threshold, and maintenance at each quiet moment.
    # The small arena (slabs only) must not count as room for them: giving the large arena back
    # would grow it again at the next execution.
    pool = fake_pool(arena_bytes=64 * MiB)
    sizes = [40_000, 300_000, 70_000, 130_000, 500, 90_000]  # a working set under the small arena
    for round_number in range(20):
        with pool.execution():
            for size in sizes[round_number % 3 :]:
                pool.allocate(size)
        if round_number == 1:
            warmed = pool.stats().upstream_allocs
    assert pool.stats().upstream_allocs == warmed


def test_slabs_hold_many_small_blocks_in_one_buddy_block_of_a_small_arena():
    pool = fake_pool()
    blocks = [pool.allocate(1000) for _ in range(SLAB_SIZE // 1024)]
    assert len({b.ptr for b in blocks}) == len(blocks)
    stats = pool.stats()
    assert stats.reserved_bytes == SMALL_ARENA_BYTES and stats.upstream_allocs == 1
    assert stats.largest_free_block == SMALL_ARENA_BYTES // 2  # one 256 KiB slab taken so far


def test_four_threads_lose_no_block_and_corrupt_no_stats():
    pool = fake_pool(arena_bytes=64 * MiB)
    live: dict[int, int] = {}
    guard = threading.Lock()
    errors: list[str] = []

    def work(seed: int) -> None:
        rng = np.random.default_rng(seed)
        mine = []
        for _ in range(3000):
            if mine and rng.random() < 0.5:
                block = mine.pop(int(rng.integers(len(mine))))
                with guard:
                    del live[block.ptr]
                block.free()
            else:
                block = pool.allocate(int(rng.integers(1, 2 * MiB)))
                with guard:
                    if block.ptr in live:
                        errors.append(f"{block.ptr:#x} handed out twice")
                    live[block.ptr] = block.capacity
                mine.append(block)
        for block in mine:
            with guard:
                del live[block.ptr]
            block.free()

    threads = [threading.Thread(target=work, args=(seed,)) for seed in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    stats = pool.stats()
    assert errors == []
    assert stats.num_allocs == stats.num_frees and stats.allocated_bytes == 0 and stats.live_blocks == 0


def test_host_views_write_and_read_real_memory_that_numpy_and_torch_share():
    with MemoryPool("host") as pool:
        block = pool.allocate(4096)
        array = block.as_numpy(np.float32, (32, 32))
        array[:] = np.arange(1024, dtype=np.float32).reshape(32, 32)
        tensor = block.as_torch(torch.float32, (1024,))
        assert tensor[1000].item() == 1000.0
        tensor[5] = -1.0
        assert block.as_numpy(np.float32)[5] == -1.0
        assert array.ctypes.data == block.ptr == tensor.data_ptr()
        with pytest.raises(PoolError, match="needs 8192 bytes, the block holds 4096"):
            block.as_numpy(np.float64, (1024,))
        again = pool.allocate(4096)  # not the same block while the first is live
        assert again.ptr != block.ptr


def test_fake_memory_has_no_host_view():
    with pytest.raises(PoolError, match="fake memory is not readable from the host"):
        fake_pool().allocate(10).as_numpy()


def test_cuda_without_a_driver_names_the_cause_and_auto_falls_back_to_host():
    from tidepool.pool import cuda_status

    available, reason = cuda_status()
    if available:
        pytest.skip("a CUDA device is present")
    with pytest.raises(CudaUnavailable, match="CUDA memory is not available: .*driver"):
        MemoryPool("cuda")
    with MemoryPool("auto") as pool:
        assert pool.kind == "host" and "because" in pool.kind_reason
