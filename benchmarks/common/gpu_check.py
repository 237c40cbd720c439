"""The steps of benchmarks/gpu_check.sh that prove on a device what the simulated one
(tests/sim_cuda.py) claims of the pool and the instance, each ending in a one-line verdict: pinned
staging reused only after its copy ran while the stream is kept busy, device memory moving between
streams only behind an event, every output of back-to-back executions exact (GPU_OUTPUTS host and
device), no upstream allocation after warm-up, reserved memory kept across a synchronize and
returned by a trim, a typed out-of-memory past the pool's limit. On a GPU:

    python -m benchmarks.common.gpu_check [STEP ...]

`make test` runs the same steps on the simulated device (tests/unit/test_gpu_check.py), so they
cannot rot before a GPU is lent."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from tidepool.pool import Block, MemoryPool, OutOfMemory
from tidepool.pool.resources.cuda import CudaResource
from tidepool.runtime.instance import ModelInstance, Result
from tidepool.runtime.validation import RequestError
from tidepool.testing import TEST_MODELS

MiB = 2**20
DOUBLER = TEST_MODELS / "pool_limited"  # Y = 2 X, no weights: any output is checked exactly
DOUBLER_CONFIG: dict[str, Any] = {
    "name": "doubler",
    "max_batch_size": 8,
    "input": [{"name": "X", "data_type": "TYPE_FP32", "dims": [4096]}],
    "output": [{"name": "Y", "data_type": "TYPE_FP32", "dims": [4096]}],
    "parameters": {"MODEL_FACTORY": {"string_value": "doubler:build"}, "DEVICE": {"string_value": "cuda"}},
}


@dataclass
class Device:
    """What the steps need of a device (a real one through torch, or the simulated one)."""

    name: str
    load: Callable[[dict[str, Any], Path], ModelInstance]  # an instance on the legacy default stream
    new_stream: Callable[[], int]
    keep_busy: Callable[[int], None]  # queue long work on a stream
    write: Callable[[Block, int, int], None]  # queue a copy of one byte value into a block, on a stream
    read: Callable[[Block], np.ndarray]  # a block's bytes (after synchronize)
    synchronize: Callable[[], None]  # the whole device
    kept: list[Any] = field(default_factory=list)  # what must live as long as its work is queued


def doubler(device: Device, outputs: str) -> ModelInstance:
    parameters = {**DOUBLER_CONFIG["parameters"], "GPU_OUTPUTS": {"string_value": outputs}}
    return device.load({**DOUBLER_CONFIG, "parameters": parameters}, DOUBLER)


def rows(count: int, seed: int) -> dict[str, np.ndarray]:
    return {"X": np.random.default_rng(seed).standard_normal((count, 4096)).astype(np.float32)}


def answer(result: Result) -> dict[str, Any]:
    """A request's outputs; AssertionError where it got an error instead."""
    assert not isinstance(result, RequestError), f"a request failed: {result}"
    return result


def host(value: Any) -> np.ndarray:
    """An output as numpy: a host array as it is, a device tensor copied back."""
    return np.asarray(value.cpu()) if hasattr(value, "cpu") else np.asarray(value)


def staging(device: Device) -> str:
    instance = doubler(device, "device")  # nothing in execute waits for the stream
    assert instance.link is not None and instance.staging is not None
    device.keep_busy(instance.link.stream)
    first, second = rows(3, 1), rows(3, 2)
    [a] = instance.execute([first]).results
    [b] = instance.execute([second]).results  # gathered into the pinned block the first copy reads
    device.synchronize()
    np.testing.assert_array_equal(host(answer(a)["Y"]), 2 * first["X"])
    np.testing.assert_array_equal(host(answer(b)["Y"]), 2 * second["X"])
    waits = instance.staging.stats().staging_waits
    instance.close()
    assert waits >= 1, "the second execution did not wait for the first one's copy"
    return (
        f"two batches back to back on stream {instance.link.stream}, kept busy: both exact, {waits} wait(s)"
    )


def cross_stream(device: Device) -> str:
    one, two = device.new_stream(), device.new_stream()
    with MemoryPool("cuda", limit_bytes=256 * MiB, arena_bytes=4 * MiB) as pool:
        device.keep_busy(one)
        block = pool.allocate(1 * MiB, stream=one)
        device.write(block, 0xAA, one)
        block.free()
        pool.trim(keep_bytes=4 * MiB)  # recycled into the arena: any stream may take it now
        again = pool.allocate(1 * MiB, stream=two)
        device.write(again, 0x11, two)
        device.synchronize()
        assert (device.read(again) == 0x11).all(), "the second stream's copy ran before the first's"
        which = "the same block" if again.ptr == block.ptr else "another block"
    return f"memory freed on a busy stream, taken on another ({which}): the second copy came last"


def outputs(device: Device) -> str:
    checked = 0
    for place in ("host", "device"):
        instance = doubler(device, place)
        kept = []
        for round_number in range(30):
            requests = [
                rows(1 + (round_number + i) % 3, round_number * 10 + i) for i in range(1 + round_number % 3)
            ]
            results = instance.execute(requests).results
            for request, result in zip(requests, results, strict=True):
                out = answer(result)["Y"]  # a host array is valid until the next execute: a copy
                kept.append((request, np.array(out) if place == "host" else out))
        device.synchronize()
        for request, out in kept:
            np.testing.assert_array_equal(host(out), 2 * request["X"])
            checked += 1
        instance.close()
    return f"{checked} outputs of 60 back-to-back executions exact, GPU_OUTPUTS host and device"


def steady(device: Device) -> str:
    instance = doubler(device, "host")
    warm = [pool.stats().upstream_allocs for pool in instance.pools]
    for round_number in range(40):
        instance.execute([rows(1 + round_number % 8, round_number)])
    after = [pool.stats().upstream_allocs for pool in instance.pools]
    instance.close()
    assert after == warm, f"upstream allocations after warm-up: {warm} -> {after}"
    return f"40 executions after warm-up: upstream allocations {warm} -> {after}"


def reserved(device: Device) -> str:
    with MemoryPool("cuda", arena_bytes=32 * MiB) as pool:
        resource = pool.resource
        assert isinstance(resource, CudaResource)
        pool.allocate(8 * MiB).free()
        device.synchronize()
        kept = resource.attribute("RESERVED_MEM_CURRENT")
        assert kept >= 32 * MiB, f"the driver took the pool's memory back at a synchronize ({kept} bytes)"
        pool.trim()
        left = resource.attribute("RESERVED_MEM_CURRENT")
        assert left == 0, f"trim left {left} bytes reserved"
    return f"{kept // MiB} MiB reserved across a synchronize, 0 after trim"


def out_of_memory(device: Device) -> str:
    with MemoryPool("cuda", limit_bytes=64 * MiB) as pool:
        try:
            pool.allocate(100 * MiB)
        except OutOfMemory as refused:
            assert "limit 64.00 MiB" in str(refused)
            return "100 MiB past a 64 MiB limit: OutOfMemory with the figures"
    raise AssertionError("the pool handed out 100 MiB past its 64 MiB limit")


STEPS: dict[str, Callable[[Device], str]] = {
    "staging": staging,
    "cross-stream": cross_stream,
    "outputs": outputs,
    "steady": steady,
    "reserved": reserved,
    "oom": out_of_memory,
}


def run(device: Device, names: list[str]) -> bool:
    """Each step with its verdict on one line; whether all passed."""
    passed = True
    for name in names:
        began = time.perf_counter()
        try:
            verdict = f"ok: {STEPS[name](device)}"
        except Exception as failure:  # a step's failure is its verdict; the next steps still run
            verdict, passed = f"FAILED: {type(failure).__name__}: {failure}".splitlines()[0], False
        print(f"{name:<13} {verdict} ({time.perf_counter() - began:.1f} s)", flush=True)
    return passed


def torch_device() -> Device:
    """The real GPU, through torch: streams of torch's, busy with torch.cuda._sleep."""
    import torch

    streams: dict[int, Any] = {}

    def new_stream() -> int:
        stream = torch.cuda.Stream()
        streams[stream.cuda_stream] = stream
        return int(stream.cuda_stream)

    def on(handle: int) -> Any:
        return streams.get(handle) or torch.cuda.ExternalStream(handle)

    def keep_busy(handle: int) -> None:
        with torch.cuda.stream(on(handle)):
            torch.cuda._sleep(200_000_000)  # about 0.1-0.2 s of a GPU's clock

    def write(block: Block, value: int, handle: int) -> None:
        source = torch.full((block.nbytes,), value, dtype=torch.uint8, pin_memory=True)
        device.kept.append(source)
        with torch.cuda.stream(on(handle)):
            block.as_torch(torch.uint8, (block.nbytes,)).copy_(source, non_blocking=True)

    def read(block: Block) -> np.ndarray:
        return block.as_torch(torch.uint8, (block.nbytes,)).cpu().numpy()

    device = Device(
        torch.cuda.get_device_name(), lambda config, path: ModelInstance.load(config, path), new_stream,
        keep_busy, write, read, torch.cuda.synchronize,
    )  # fmt: skip
    return device


if __name__ == "__main__":
    chosen = sys.argv[1:] or list(STEPS)
    unknown = [name for name in chosen if name not in STEPS]
    if unknown:
        raise SystemExit(f"unknown step(s) {', '.join(unknown)}; the steps: {', '.join(STEPS)}")
    sys.exit(0 if run(torch_device(), chosen) else 1)
