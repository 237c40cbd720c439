"""The pool on a real GPU: device blocks and their views, the owned cuMemPool, pinned memory,
torch's allocator left to torch; and a frozen graph on the GPU.
Marked `gpu`; skipped with the reason where no CUDA device is present."""

import numpy as np
import pytest

from tidepool.pool import MemoryPool, OutOfMemory

pytestmark = pytest.mark.gpu
MiB = 2**20


def test_device_blocks_hold_what_torch_writes():
    import torch

    with MemoryPool("cuda", limit_bytes=256 * MiB) as pool:
        assert pool.kind == "cuda"
        block = pool.allocate(4 * MiB)
        tensor = block.as_torch(torch.float32, (MiB,))
        assert tensor.device.type == "cuda" and tensor.data_ptr() == block.ptr
        tensor.copy_(torch.arange(MiB, dtype=torch.float32, device="cuda"))
        again = torch.as_tensor(block.as_cuda_array(), device="cuda").view(torch.float32)
        assert again[12345].item() == 12345.0
        from_dlpack = torch.from_dlpack(block)
        assert from_dlpack.data_ptr() == block.ptr
        block.free()
        assert pool.stats().allocated_bytes == 4 * MiB  # the tensors still use it
        del tensor, again, from_dlpack
        torch.cuda.synchronize()
        stats = pool.stats()
        assert stats.allocated_bytes == 0 and stats.reserved_bytes >= 4 * MiB
        assert pool.resource.attribute("RESERVED_MEM_CURRENT") >= stats.reserved_bytes


def test_reuse_does_not_go_back_to_the_driver_and_the_limit_holds():
    with MemoryPool("cuda", limit_bytes=64 * MiB, arena_bytes=32 * MiB) as pool:
        for _ in range(100):
            with pool.execution():
                pool.allocate(8 * MiB)
                pool.allocate(1000)
        assert pool.stats().upstream_allocs == 2  # a large arena and a small (slab) one
        with pytest.raises(OutOfMemory, match="limit 64.00 MiB"):
            pool.allocate(100 * MiB)


def test_pinned_blocks_are_readable_from_the_host():
    with MemoryPool("pinned") as pool:
        block = pool.allocate(4096)
        block.as_numpy(np.int32)[:] = 7
        assert int(block.as_torch("int32").sum()) == 7 * 1024


@pytest.mark.parametrize("outputs", ["host", "device"])
def test_torch_keeps_its_own_allocator_and_the_instance_pool_holds_its_inputs(tmp_path, outputs):
    """A GPU instance: torch's caching allocator holds weights and activations (its statistics
    read them); the instance's CUDA pool holds the batch's device inputs, reused across executions;
    its outputs are host arrays (GPU_OUTPUTS=host, the default) or device tensors (device)."""
    import copy

    import torch

    from tests.unit.specs import TOKENS_CONFIG, tiny_model_dir
    from tidepool.inputs import random_inputs
    from tidepool.runtime.instance import ModelInstance

    config = copy.deepcopy(TOKENS_CONFIG)
    config["parameters"]["DEVICE"] = {"string_value": "cuda"}
    config["parameters"]["GPU_OUTPUTS"] = {"string_value": outputs}
    instance = ModelInstance.load(config, tiny_model_dir(tmp_path))
    assert instance.pool.kind == "cuda" and instance.staging.kind == "pinned"
    assert torch.cuda.memory_allocated() > 0  # torch's own allocator, with statistics that read
    requests = [random_inputs(instance.model, batch=rows, seed=rows) for rows in (1, 3)]
    instance.execute(requests)
    warm = instance.pool.stats()
    for _ in range(20):
        results = instance.execute(requests).results
    torch.cuda.synchronize()
    stats = instance.pool.stats()
    assert stats.num_allocs > warm.num_allocs and stats.upstream_allocs == warm.upstream_allocs
    out = results[1]["OUT"]
    if outputs == "host":
        assert isinstance(out, np.ndarray)
    else:
        assert out.device.type == "cuda"
        out = out.cpu().numpy()
    np.testing.assert_array_equal(out, requests[1]["IDS"].astype(np.float32) * requests[1]["SCALE"])
    instance.close()


def test_a_frozen_graph_runs_on_the_gpu_and_answers_as_eager(tmp_path):
    import copy

    from tests.unit.specs import TOKENS_CONFIG, tiny_model_dir
    from tidepool.inputs import random_inputs
    from tidepool.runtime.instance import ModelInstance

    model_dir = tiny_model_dir(tmp_path)
    instances = {}
    for graph in ("eager", "frozen"):
        config = copy.deepcopy(TOKENS_CONFIG)
        config["parameters"] |= {"GRAPH": {"string_value": graph}, "DEVICE": {"string_value": "cuda"}}
        instances[graph] = ModelInstance.load(config, model_dir)
    requests = [random_inputs(instances["eager"].model, batch=rows, seed=rows) for rows in (1, 3)]
    answers = {  # GPU_OUTPUTS=host (the default): numpy arrays, valid until the next execute
        graph: [np.array(r["OUT"]) for r in instance.execute(requests).results]
        for graph, instance in instances.items()
    }
    for frozen, eager in zip(answers["frozen"], answers["eager"], strict=True):
        np.testing.assert_array_equal(frozen, eager)
    for instance in instances.values():
        instance.close()
