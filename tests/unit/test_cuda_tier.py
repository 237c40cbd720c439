"""The CUDA tier's resources and pool without a GPU, over the simulated device (tests/sim_cuda.py):
contexts per thread, arenas and the driver's maxSize, reserved memory kept until trimmed, the
budget's trim with frees still queued, device blocks moving between streams only behind an event,
both generations of cuda-bindings, and views that keep their memory."""

from __future__ import annotations

import gc
import json
import os
import subprocess
import sys
import threading

import numpy as np
import pytest

from tests.sim_cuda import SimDevice
from tests.sim_cuda_types import SimFault
from tests.unit.specs import TOKENS_CONFIG, tiny_model_dir
from tidepool.pool import CudaUnavailable, MemoryPool, OutOfMemory, PoolError
from tidepool.pool.resources import driver as cuda_driver
from tidepool.pool.resources import make_resource
from tidepool.pool.resources.cuda import CudaResource
from tidepool.pool.resources.host import HostResource
from tidepool.testing import REPO_ROOT

MiB = 2**20


def in_thread(work):
    """Run `work()` in a new thread (whose CUDA context starts unset); return what it returned."""
    done: list = []
    failed: list = []

    def run():
        try:
            done.append(work())
        except BaseException as error:  # noqa: BLE001 - re-raised below
            failed.append(error)

    thread = threading.Thread(target=run)
    thread.start()
    thread.join()
    if failed:
        raise failed[0]
    return done[0]


@pytest.mark.parametrize(("driver", "bindings"), [(12040, 12), (12080, 12), (13000, 13), (13040, 12)])
def test_matching_bindings_run_the_pool_and_the_status_says_which(sim, driver, bindings):
    device = sim(driver, bindings)
    available, reason = cuda_driver.cuda_status(0)
    built = {12: "12.9", 13: "13.4"}[bindings]
    assert available, reason
    driver_text = cuda_driver.describe_version(driver)
    assert reason == f"Simulated GPU, driver {driver_text}, cuda-bindings for CUDA {built}"
    with MemoryPool("cuda", limit_bytes=256 * MiB) as pool:
        with pool.execution():
            pool.allocate(8 * MiB, stream=0)
        assert pool.stats().upstream_allocs == 1
    assert device.calls_without_context == []


def test_bindings_newer_than_the_driver_are_refused_with_the_install_that_fits(sim):
    sim(12040, 13)
    available, reason = cuda_driver.cuda_status(0)
    assert not available
    assert "built for CUDA 13.4 and need a CUDA 13 driver; this node's driver is CUDA 12.4" in reason
    assert "cuda12 (torch's cu126 build, cuda-python 12.9)" in reason
    resource, why = make_resource("auto", 0, None)
    assert isinstance(resource, HostResource) and "need a CUDA 13 driver" in why
    with pytest.raises(CudaUnavailable, match="need a CUDA 13 driver"):
        MemoryPool("cuda")


def test_resource_calls_work_from_any_thread(sim):
    device = sim()
    for kind in ("cuda", "pinned"):
        pool = MemoryPool(kind, limit_bytes=256 * MiB)
        block = in_thread(lambda pool=pool: pool.allocate(8 * MiB))  # another thread grows it
        in_thread(lambda pool=pool: pool.trim())
        block.free()
        in_thread(pool.close)
    assert device.calls_without_context == []
    assert not any(a.live for a in device.device_memory.values()) and device.host_allocations == {}


def test_a_large_and_a_small_block_take_two_arenas_once_and_the_limit_holds(sim):
    sim()
    with MemoryPool("cuda", limit_bytes=64 * MiB, arena_bytes=32 * MiB) as pool:
        for _ in range(100):
            with pool.execution():
                pool.allocate(8 * MiB)
                pool.allocate(1000)
        stats = pool.stats()
        assert stats.upstream_allocs == 2  # one large arena, one small (slab) arena: then reuse
        assert stats.reuse_ratio > 0.98
        with pytest.raises(OutOfMemory, match="limit 64.00 MiB"):
            pool.allocate(100 * MiB)


def test_an_old_driver_ignores_max_size_so_the_pools_own_limit_caps_it(sim):
    device = sim(12010)
    with MemoryPool("cuda", limit_bytes=64 * MiB, arena_bytes=32 * MiB) as pool:
        assert not pool.resource.capped_by_driver
        assert "ignores a CUDA pool's maxSize" in pool.kind_reason
        [state] = device.pools.values()
        assert state.max_size == 0
        pool.allocate(40 * MiB)
        with pytest.raises(OutOfMemory, match="limit 64.00 MiB"):
            pool.allocate(40 * MiB)
    device = sim(12020)
    with MemoryPool("cuda", limit_bytes=64 * MiB) as pool:
        assert pool.resource.capped_by_driver
        assert [state.max_size for state in device.pools.values()] == [64 * MiB]


def test_the_driver_keeps_a_pools_memory_reserved_until_it_is_trimmed(sim):
    """A real cuMemPool gives cached memory back at every synchronize unless its release threshold
    is raised (the resource raises it), and gives it back at cuMemPoolTrimTo only once the free ran."""
    device = sim()
    resource = CudaResource(0)
    allocation = resource.allocate(32 * MiB, stream=0)
    resource.deallocate(allocation, stream=0)
    assert resource.attribute("RESERVED_MEM_CURRENT") == 32 * MiB
    assert resource.attribute("USED_MEM_CURRENT") == 32 * MiB  # the free is still queued
    device.cuCtxSynchronize()  # the free runs; the raised threshold keeps the memory
    assert resource.attribute("USED_MEM_CURRENT") == 0
    assert resource.attribute("RESERVED_MEM_CURRENT") == 32 * MiB
    assert resource.attribute("RESERVED_MEM_HIGH") == 32 * MiB
    resource.trim(0)
    assert resource.attribute("RESERVED_MEM_CURRENT") == 0
    resource.close()
    # Without the raised threshold, the same synchronize would have handed it back at once.
    handle = device.cuMemPoolCreate(device.CUmemPoolProps())[1]
    ptr = device.cuMemAllocFromPoolAsync(MiB, handle, 0)[1]
    device.cuMemFreeAsync(ptr, 0)
    device.cuCtxSynchronize()
    assert device.pools[handle].reserved == 0


def test_a_budgeted_device_pool_counts_its_memory_free_only_once_the_driver_has_it(sim, tmp_path):
    from tidepool.pool.budget import budget_for
    from tidepool.pool.ledger import NodeLedger

    device = sim()
    default = budget_for("cuda:0", {})
    assert default.nbytes == int(device.device_bytes * 0.8) and "cuda:0's memory" in default.why
    ledger = NodeLedger.attach("cuda:0", 4_000_000, tmp_path, budget=default)
    pool = MemoryPool("cuda", budget=ledger.join("m", "m_0", 0), arena_bytes=32 * MiB)
    with pool.execution():
        pool.allocate(8 * MiB, stream=0)
    assert ledger.reserved_total() == 32 * MiB
    [handle] = device.pools
    seen_by_the_driver = []
    release = pool.budget.release

    def counted_free(nbytes):  # what the driver holds when the ledger is told the bytes are free
        seen_by_the_driver.append(device.pools[handle].reserved)
        release(nbytes)

    pool.budget.release = counted_free
    ledger._entries["trim_wanted"][pool.budget.slot] = 32 * MiB  # another device pool asked
    assert pool.answer_trim() == 32 * MiB
    assert seen_by_the_driver == [0]  # the queued free ran and the driver took the memory first
    assert (handle, 0) in device.trims and ledger.reserved_total() == 0
    pool.close()
    assert not ledger.path.exists()


def test_a_device_block_freed_on_one_stream_is_not_handed_to_another(sim):
    device = sim()
    one, two = device.new_stream(), device.new_stream()
    with MemoryPool("cuda", limit_bytes=256 * MiB) as pool:
        first = pool.allocate(1 * MiB, stream=one)
        first.free()
        assert pool.allocate(1 * MiB, stream=one).ptr == first.ptr  # same stream: reused at once
        other = pool.allocate(1 * MiB, stream=two)
        assert other.ptr != first.ptr  # another stream: its work may still be queued on the first


def test_memory_another_stream_gave_back_is_used_only_after_its_work(sim):
    """Stream A's kernel writes a block and frees it; recycled, the memory goes to stream B, whose
    copy into it must run after A's kernel, not before (the device waits, the host does not)."""
    device = sim()
    stream_a, stream_b = device.new_stream(non_blocking=True), device.new_stream(non_blocking=True)
    with MemoryPool("cuda", limit_bytes=256 * MiB, arena_bytes=4 * MiB) as pool:
        block = pool.allocate(1 * MiB, stream=stream_a)
        written = device.device_array(block.ptr, 16)
        device.launch(stream_a, lambda: written.fill(0xAA))  # A's work, still queued
        block.free()
        pool.trim(keep_bytes=4 * MiB)  # recycled into the arena: any stream may take it now
        again = pool.allocate(1 * MiB, stream=stream_b)
        assert again.ptr == block.ptr
        source = np.full(16, 0x11, np.uint8)
        device.cuMemcpyHtoDAsync(again.ptr, source.ctypes.data, 16, stream_b)
        device.cuStreamSynchronize(stream_b)
        assert device.queued(stream_a) == 0  # B waited for A on the device
        device.cuCtxSynchronize()
        assert (device.device_array(again.ptr, 16) == 0x11).all()  # B's copy came last
        waits = [call for call, _ in device.blocking_calls if call != "cuMemPoolTrimTo"]
        assert waits == ["cuStreamSynchronize", "cuStreamSynchronize", "cuCtxSynchronize"]


def test_pinned_memory_that_a_queued_copy_reads_is_not_freed_under_it(sim):
    device = sim()
    stream = device.new_stream()
    target = device.device_scratch(4096)
    pool = MemoryPool("pinned")
    block = pool.allocate(4096, stream=stream)
    block.as_numpy(np.uint8)[:] = 3
    device.cuMemcpyHtoDAsync(target, block.ptr, 4096, stream)
    block.free()
    pool.close()  # waits for the copy's event before the pinned memory goes
    assert (device.device_array(target, 4096) == 3).all() and device.host_allocations == {}
    with pytest.raises(SimFault, match="freed while a queued copy uses it"):
        raw = device.cuMemHostAlloc(4096, 0)[1]
        device.cuMemcpyHtoDAsync(target, raw, 4096, stream)
        device.cuMemFreeHost(raw)


def test_a_view_keeps_its_block_after_free():
    with MemoryPool(resource=HostResource()) as pool:
        block = pool.allocate(4096)
        view = block.as_numpy(np.int32)
        view[:] = 7
        block.free()
        other = pool.allocate(4096)
        assert other.ptr != block.ptr  # not handed out again while the view lives
        other.as_numpy(np.int32)[:] = 9
        assert (view == 7).all()
        assert pool.stats().allocated_bytes == 2 * 4096
        del view
        assert pool.stats().allocated_bytes == 4096  # it went back with its last view
        assert pool.allocate(4096).ptr == block.ptr


def test_views_of_views_and_torch_tensors_keep_the_block_too():
    import torch

    with MemoryPool(resource=HostResource()) as pool:
        block = pool.allocate(1024)
        tensor = block.as_torch(torch.float32, (16,))
        column = block.as_numpy(np.float32, (16,))[::2]
        block.free()
        assert pool.stats().live_blocks == 1
        del tensor
        assert pool.stats().live_blocks == 1  # the numpy slice still uses it
        del column
        assert pool.stats().live_blocks == 0


def test_close_waits_for_the_views_before_pinned_memory_is_freed(sim):
    device = sim()
    pool = MemoryPool("pinned")
    block = pool.allocate(4096)
    view = block.as_numpy(np.uint8)
    view[:] = 5
    pool.close()
    assert len(device.host_allocations) == 1  # not freed under the view
    assert (view == 5).all()
    with pytest.raises(PoolError, match="closed"):
        block.as_numpy()
    del view
    assert device.host_allocations == {}  # freed when the view went


def test_a_view_that_goes_in_another_thread_gives_its_block_back(sim):
    sim()
    with MemoryPool("pinned") as pool:
        block = pool.allocate(4096)
        holder = [block.as_numpy()]
        block.free()
        in_thread(holder.clear)  # the last view goes in another thread
        assert pool.stats().allocated_bytes == 0


def test_a_view_in_a_reference_cycle_goes_back_with_garbage_collection():
    with MemoryPool(resource=HostResource()) as pool:
        block = pool.allocate(4096)
        cycle: list = [block.as_numpy()]
        cycle.append(cycle)
        block.free()
        del cycle
        gc.collect()
        assert pool.stats().allocated_bytes == 0


def test_initialize_leaves_torchs_cuda_allocator_as_the_process_has_it(tmp_path):
    """A fresh process, as a stub is: the backend never asks torch for an allocator backend (it
    would be too late once torch has loaded), and its log says what torch will use."""
    model_dir = tiny_model_dir(tmp_path)
    args = {"model_config": json.dumps(TOKENS_CONFIG), "model_repository": str(model_dir),
            "model_name": "tokens", "model_instance_name": "tokens_0", "model_instance_kind": "CPU",
            "model_instance_device_id": "0", "model_version": "1"}  # fmt: skip
    script = f"""
import json, os, sys
sys.path.insert(0, {str(REPO_ROOT)!r})
from tests import fake_pb_utils
installer = fake_pb_utils.installed()
pb_utils = next(installer)
from pathlib import Path
import tidepool.pool.ledger
tidepool.pool.ledger.SHM_DIRECTORY = Path({str(tmp_path)!r})  # this test's own node ledger
from tidepool.runtime.model import TritonPythonModel
TritonPythonModel().initialize(json.loads({json.dumps(args)!r}))
print(json.dumps({{"variable": os.environ.get("PYTORCH_CUDA_ALLOC_CONF"),
                  "log": [message for _, message in fake_pb_utils.state.logged]}}))
"""
    unset = ("PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF")
    environment = {k: v for k, v in os.environ.items() if k not in unset}
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=environment)
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert report["variable"] is None
    [line] = [line for line in report["log"] if "tidepool tokens_0" in line]
    assert "CUDA allocator not initialised (torch's native caching allocator)" in line


def test_every_driver_call_the_tier_makes_exists_in_the_installed_bindings():
    """The simulated device answers the calls by name; the installed cuda-bindings (12.9 or 13.x)
    must have each, with the enums the resources read."""
    driver = pytest.importorskip("cuda.bindings.driver")
    calls = [name for name in dir(SimDevice) if name.startswith("cu") and callable(getattr(SimDevice, name))]
    assert len(calls) > 20
    missing = [name for name in calls if not hasattr(driver, name)]
    assert missing == []
    assert driver.CUevent_flags.CU_EVENT_DISABLE_TIMING and driver.CUresult.CUDA_ERROR_NOT_READY
    assert driver.CUmemPool_attribute.CU_MEMPOOL_ATTR_RELEASE_THRESHOLD and driver.CUDA_VERSION >= 12000
