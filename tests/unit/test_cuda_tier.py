"""The CUDA tier without a GPU: the resources over a fake driver (contexts per thread, arenas, the
driver's maxSize), views that keep their memory, and torch's allocator left as the process has it."""

from __future__ import annotations

import gc
import json
import os
import subprocess
import sys
import threading

import numpy as np
import pytest

from tests.fake_cuda_driver import FakeDriver
from tests.unit.specs import TOKENS_CONFIG, tiny_model_dir
from tidepool.pool import MemoryPool, OutOfMemory, PoolError
from tidepool.pool.resources import driver as cuda_driver
from tidepool.pool.resources.host import HostResource
from tidepool.testing import REPO_ROOT

MiB = 2**20


@pytest.fixture
def fake_driver(monkeypatch):
    def install(version: int = 12040) -> FakeDriver:
        fake = FakeDriver(version)
        monkeypatch.setattr(cuda_driver, "bindings", lambda: fake)
        cuda_driver.cuda_status.cache_clear()
        return fake

    yield install
    cuda_driver.cuda_status.cache_clear()


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


def test_the_status_names_the_device_and_the_driver(fake_driver):
    fake_driver(12040)
    assert cuda_driver.cuda_status(0) == (True, "Fake GPU, driver CUDA 12.4")
    assert cuda_driver.cuda_status(3)[0] is False


def test_resource_calls_work_from_any_thread(fake_driver):
    fake = fake_driver()
    for kind in ("cuda", "pinned"):
        pool = MemoryPool(kind, limit_bytes=256 * MiB)
        block = in_thread(lambda pool=pool: pool.allocate(8 * MiB))  # another thread grows it
        in_thread(lambda pool=pool: pool.trim())
        block.free()
        in_thread(pool.close)
    assert fake.calls_without_context == []
    assert fake.device_allocations == {} and fake.host_allocations == {}


def test_a_large_and_a_small_block_take_two_arenas_once_and_the_limit_holds(fake_driver):
    fake_driver()
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


def test_an_old_driver_ignores_max_size_so_the_pools_own_limit_caps_it(fake_driver):
    fake = fake_driver(12010)
    with MemoryPool("cuda", limit_bytes=64 * MiB, arena_bytes=32 * MiB) as pool:
        assert not pool.resource.capped_by_driver
        assert "ignores a CUDA pool's maxSize" in pool.kind_reason
        [state] = fake.pools.values()
        assert state.max_size == 0
        pool.allocate(40 * MiB)
        with pytest.raises(OutOfMemory, match="limit 64.00 MiB"):
            pool.allocate(40 * MiB)
    fake = fake_driver(12020)
    with MemoryPool("cuda", limit_bytes=64 * MiB) as pool:
        assert pool.resource.capped_by_driver
        assert [state.max_size for state in fake.pools.values()] == [64 * MiB]


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


def test_close_waits_for_the_views_before_pinned_memory_is_freed(fake_driver):
    fake = fake_driver()
    pool = MemoryPool("pinned")
    block = pool.allocate(4096)
    view = block.as_numpy(np.uint8)
    view[:] = 5
    pool.close()
    assert len(fake.host_allocations) == 1  # not freed under the view
    assert (view == 5).all()
    with pytest.raises(PoolError, match="closed"):
        block.as_numpy()
    del view
    assert fake.host_allocations == {}  # freed when the view went


def test_a_view_that_goes_in_another_thread_gives_its_block_back(fake_driver):
    fake_driver()
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


def test_a_device_block_freed_on_one_stream_is_not_handed_to_another(fake_driver):
    fake_driver()
    with MemoryPool("cuda", limit_bytes=256 * MiB) as pool:
        first = pool.allocate(1 * MiB, stream=7)
        first.free()
        assert pool.allocate(1 * MiB, stream=7).ptr == first.ptr  # same stream: reused at once
        other = pool.allocate(1 * MiB, stream=9)
        assert other.ptr != first.ptr  # another stream: its work may still be queued on the first


def test_a_budgeted_device_pool_reserves_from_its_devices_ledger_and_trims_what_it_gives_back(
    fake_driver, tmp_path
):
    from tidepool.pool.budget import budget_for
    from tidepool.pool.ledger import NodeLedger

    fake = fake_driver()
    default = budget_for("cuda:0", {})
    assert default.nbytes == int(fake.device_bytes * 0.8) and "cuda:0's memory" in default.why
    ledger = NodeLedger.attach("cuda:0", 4_000_000, tmp_path, budget=default)
    pool = MemoryPool("cuda", budget=ledger.join("m", "m_0", 0), arena_bytes=32 * MiB)
    with pool.execution():
        pool.allocate(8 * MiB)
    assert ledger.reserved_total() == 32 * MiB
    [handle] = fake.pools
    ledger._entries["trim_wanted"][pool.budget.slot] = 32 * MiB  # another device pool asked
    assert pool.answer_trim() == 32 * MiB
    # The driver got the arena back before the ledger counted it free: nothing cached is counted.
    assert (handle, 0) in fake.trims and fake.pools[handle].reserved == 0
    assert ledger.reserved_total() == 0
    pool.close()
    assert not ledger.path.exists()
