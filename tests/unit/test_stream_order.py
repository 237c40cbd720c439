"""The CUDA tier's stream order over the simulated device, each test failing where its rule is
broken: an arena allocated in one stream's order carved for another only behind an event, close
freeing nothing a queued copy still uses, trim waiting for what it frees and nothing else, every
event destroyed, the caller's context restored, the primary context released; and a pool the
device refuses asking torch's cache for room first."""

from __future__ import annotations

import numpy as np
import pytest

from tidepool.pool import MemoryPool, OutOfMemory

MiB = 2**20


def copy_into(device, ptr: int, stream: int, value: int, nbytes: int = 16) -> np.ndarray:
    """Queue a copy of `nbytes` of `value` into device memory at `ptr` on `stream`; the source."""
    source = np.full(nbytes, value, np.uint8)
    device.cuMemcpyHtoDAsync(ptr, source.ctypes.data, nbytes, stream)
    return source


def test_an_arena_allocated_in_one_streams_order_is_used_on_another_only_after_that_point(sim):
    device = sim()
    busy, other = device.new_stream(non_blocking=True), device.new_stream(non_blocking=True)
    device.launch(busy, lambda: None)  # work queued before the arena: its allocation waits behind it
    with MemoryPool("cuda", limit_bytes=256 * MiB, arena_bytes=4 * MiB) as pool:
        pool.allocate(1 * MiB, stream=busy)  # the arena, in `busy`'s order
        carved = pool.allocate(1 * MiB, stream=other)  # the same arena, for another stream
        assert pool.stats().upstream_allocs == 1
        copy_into(device, carved.ptr, other, 0x22)
        device.cuStreamSynchronize(other)  # without the event: the copy runs before the allocation
        assert (device.device_array(carved.ptr, 16) == 0x22).all()


def test_close_frees_no_memory_that_work_queued_on_a_stream_still_uses(sim):
    device = sim()
    stream = device.new_stream(non_blocking=True)
    pool = MemoryPool("cuda", limit_bytes=256 * MiB, arena_bytes=4 * MiB)
    block = pool.allocate(1 * MiB, stream=stream)
    copy_into(device, block.ptr, stream, 0x33)  # still queued
    block.free()  # onto its stream's free list
    pool.close()  # the arena's free is queued after the copy, not before it
    device.cuCtxSynchronize()
    assert not any(allocation.live for allocation in device.device_memory.values())


def test_trim_waits_for_the_frees_it_queues_and_not_for_other_work(sim):
    device = sim()
    used, busy = device.new_stream(), device.new_stream()  # both blocking: stream 0 would wait for both
    pool = MemoryPool("cuda", limit_bytes=256 * MiB, arena_bytes=4 * MiB)
    block = pool.allocate(1 * MiB, stream=used)
    copy_into(device, block.ptr, used, 0x44)
    device.launch(busy, lambda: None)  # the instance's other work, unrelated to this memory
    block.free()
    assert pool.trim() == 4 * MiB
    [state] = device.pools.values()
    assert state.reserved == 0  # the driver has the memory back
    assert device.queued(used) == 0 and device.queued(busy) == 1  # what it freed ran; nothing else
    pool.close()


def test_every_event_the_pools_made_is_destroyed_when_they_close(sim):
    device = sim()
    one, two = device.new_stream(non_blocking=True), device.new_stream(non_blocking=True)
    device.launch(one, lambda: None)
    device_pool = MemoryPool("cuda", limit_bytes=256 * MiB, arena_bytes=4 * MiB)
    staging = MemoryPool("pinned")
    for stream in (one, two, one):
        with device_pool.execution(), staging.execution():
            device_pool.allocate(1 * MiB, stream=stream)
            staging.allocate(4096, stream=stream)
    device_pool.trim(keep_bytes=4 * MiB)  # fences between the streams, some still pending
    assert device.events
    device_pool.close()
    staging.close()
    assert device.events == {}


def test_the_pools_leave_the_callers_own_context_current(sim):
    device = sim()
    stream = device.new_stream()
    device.cuCtxSetCurrent(("context", 99))  # a thread with a context of its own
    for kind in ("cuda", "pinned"):
        pool = MemoryPool(kind, limit_bytes=256 * MiB)
        with pool.execution():
            pool.allocate(8 * MiB, stream=stream)
        pool.trim()
        pool.close()
        assert device.cuCtxGetCurrent()[1] == ("context", 99), kind
    assert device.calls_without_context == []


@pytest.mark.parametrize("kind", ["cuda", "pinned"])
def test_the_primary_context_is_released_when_the_pool_closes(sim, kind):
    device = sim()
    pool = MemoryPool(kind, limit_bytes=256 * MiB)
    assert device.primary_retained == 1
    pool.close()
    assert device.primary_retained == 0


def test_a_pool_the_device_refuses_has_torch_empty_its_cache_and_tries_once_more(sim):
    device = sim(device_bytes=64 * MiB)
    device.torch_cached = 48 * MiB  # torch's caching allocator holds most of the device, unused
    emptied = []

    def empty_cache():
        emptied.append(device.torch_cached)
        device.torch_cached = 0

    with MemoryPool("cuda", arena_bytes=32 * MiB, reclaim=empty_cache) as pool:
        block = pool.allocate(32 * MiB)
        assert emptied == [48 * MiB] and block.capacity == 32 * MiB
    device.torch_cached = 48 * MiB
    with MemoryPool("cuda", arena_bytes=32 * MiB) as pool, pytest.raises(OutOfMemory) as refused:
        pool.allocate(32 * MiB)
    assert refused.value.device and "upstream cuda memory refused" in str(refused.value)
