"""A GPU instance over the simulated device (tests/sim_cuda.py), whose streams run their work only
when something waits for it: staging written again only after its copy ran, outputs read back only
after theirs, the outputs of many executions exact end to end, no upstream allocation in steady
state, and no housekeeping (trims, synchronizes) inside an execution."""

from __future__ import annotations

import copy
import threading

import numpy as np
import pytest

from tests.sim_link import SimulatedLink
from tests.unit.specs import TOKENS_CONFIG, tiny_model_dir
from tidepool.inputs import random_inputs
from tidepool.pool import housekeeping
from tidepool.runtime.instance import ModelInstance
from tidepool.runtime.settings import Placement
from tidepool.runtime.validation import RequestError


@pytest.fixture(params=[0, None], ids=["legacy default stream", "a created stream"])
def stream(request) -> int | None:
    """The stream the instance runs on: 0, what torch hands a GPU instance (its current stream,
    unless per-thread default streams are on), or one created for it."""
    return request.param


def gpu_instance(device, tmp_path, stream, outputs="host", placement=None, **parameters) -> ModelInstance:
    config = copy.deepcopy(TOKENS_CONFIG)
    config["parameters"] |= {"DEVICE": {"string_value": "cuda"}, "GPU_OUTPUTS": {"string_value": outputs}}
    config["parameters"] |= {name: {"string_value": value} for name, value in parameters.items()}
    link = SimulatedLink(device, stream)
    return ModelInstance.load(
        config, tiny_model_dir(tmp_path), placement, cuda_available=lambda: True, link=link
    )


def expected(request) -> np.ndarray:
    return request["IDS"].astype(np.float32) * request["SCALE"]


def test_staging_is_written_again_only_after_the_copy_that_reads_it_ran(sim, tmp_path, stream):
    """Two executions back to back, the device still behind: the second gathers its rows into the
    pinned block the first one's copy reads. Without the event, that copy would carry the second
    batch's rows and the first batch's outputs would be the second's."""
    device = sim()
    instance = gpu_instance(device, tmp_path, stream, outputs="device")
    assert instance.pool.kind == "cuda" and instance.staging.kind == "pinned"
    first, second = (random_inputs(instance.model, batch=3, seed=seed) for seed in (1, 2))
    [outputs_first] = instance.execute([first]).results
    assert device.queued(instance.link.stream) > 0  # its copy and its pass are still queued
    waits = instance.staging.stats().staging_waits
    [outputs_second] = instance.execute([second]).results
    assert instance.staging.stats().staging_waits > waits  # the host waited for the first copy
    device.cuCtxSynchronize()
    np.testing.assert_array_equal(outputs_first["OUT"].numpy(), expected(first))
    np.testing.assert_array_equal(outputs_second["OUT"].numpy(), expected(second))
    instance.close()


def test_outputs_read_back_to_the_host_are_there_when_execute_returns(sim, tmp_path, stream):
    device = sim()
    instance = gpu_instance(device, tmp_path, stream, outputs="host")
    for seed in range(5):
        request = random_inputs(instance.model, batch=1 + seed % 4, seed=seed)
        [outputs] = instance.execute([request]).results
        assert isinstance(outputs["OUT"], np.ndarray)
        np.testing.assert_array_equal(outputs["OUT"], expected(request))
    assert device.queued(instance.link.stream) == 0
    instance.close()


@pytest.mark.parametrize("outputs", ["host", "device"])
@pytest.mark.parametrize("seed", range(4))
def test_every_output_is_exact_while_the_device_runs_work_at_random_moments(
    sim, tmp_path, stream, outputs, seed
):
    device = sim(progress=0.3, seed=seed)
    instance = gpu_instance(device, tmp_path, stream, outputs=outputs)
    rng = np.random.default_rng(seed)
    answered = []
    for round_number in range(25):
        requests = [random_inputs(instance.model, batch=int(rows), seed=round_number * 10 + i)
                    for i, rows in enumerate(rng.integers(1, 3, size=rng.integers(1, 3)))]  # fmt: skip
        results = instance.execute(requests).results
        # Host outputs are valid until the next execute; device outputs stay the torch tensors they are.
        for request, result in zip(requests, results, strict=True):
            answered.append((request, np.array(result["OUT"]) if outputs == "host" else result["OUT"]))
    device.cuCtxSynchronize()
    for request, out in answered:
        np.testing.assert_array_equal(np.asarray(out), expected(request))
    instance.close()
    assert not any(a.live and a.pool is not None for a in device.device_memory.values())


def test_steady_state_takes_nothing_from_the_driver(sim, tmp_path, stream):
    device = sim(progress=0.5)
    instance = gpu_instance(device, tmp_path, stream)
    warm = [pool.stats().upstream_allocs for pool in instance.pools]
    for round_number in range(40):
        rows = 1 + round_number % 4
        instance.execute([random_inputs(instance.model, batch=rows, seed=round_number)])
    assert [pool.stats().upstream_allocs for pool in instance.pools] == warm
    instance.close()


def test_a_gpu_instance_without_the_pool_copies_from_pageable_memory(sim, tmp_path, stream):
    device = sim()
    instance = gpu_instance(device, tmp_path, stream, outputs="host", POOL="off")
    assert instance.pools == []
    request = random_inputs(instance.model, batch=2, seed=4)
    [outputs] = instance.execute([request]).results
    np.testing.assert_array_equal(outputs["OUT"], expected(request))
    instance.close()


def test_an_execute_waits_for_no_trim_and_the_housekeeping_does_it_afterwards(
    sim, tmp_path, stream, monkeypatch
):
    """A budgeted GPU instance asked to lend, with its maintenance due: the execution itself
    neither trims nor waits for the device (counted by the simulated driver); the housekeeping
    that runs after it does both."""
    monkeypatch.setattr("tidepool.pool.ledger.SHM_DIRECTORY", tmp_path)
    device = sim()
    placement = Placement(kind="GPU", model_name="tokens", instance_name="tokens_0", server_pid=4_000_001)
    instance = gpu_instance(device, tmp_path, stream, outputs="device", placement=placement)
    housekeeping.unwatch(instance.housekeep)  # this test runs it itself, after the execution
    request = random_inputs(instance.model, batch=2, seed=1)
    instance.execute([request])
    device_pool = instance.pool
    ledger = device_pool.budget.ledger
    ledger._entries["trim_wanted"][device_pool.budget.slot] = 1  # another device pool asked
    device_pool._housekeeping_due = True
    device.cuCtxSynchronize()  # the device caught up: the staging blocks need no wait either
    before = len(device.blocking_calls)
    instance.execute([request])
    executing = threading.current_thread().name
    assert [call for call, thread in device.blocking_calls[before:] if thread == executing] == []
    assert device_pool.stats().budget_trims == 0
    instance.housekeep()
    assert device_pool.stats().budget_trims == 1 and device_pool.budget.trim_wanted() == 0
    assert "cuMemPoolTrimTo" in [call for call, _ in device.blocking_calls[before:]]
    instance.close()


def test_the_log_line_names_the_device_the_driver_and_the_bindings(sim, tmp_path, stream):
    device = sim(13000, 13)
    instance = gpu_instance(device, tmp_path, stream)
    line = instance.describe()
    assert "cuda:0, outputs to the host" in line
    assert "pool cuda (asked for cuda: Simulated GPU, driver CUDA 13.0, cuda-bindings for CUDA 13.4)" in line
    instance.close()


def test_torch_out_of_device_memory_has_the_pool_give_back_and_the_batch_run_as_halves(sim, tmp_path, stream):
    device = sim()
    instance = gpu_instance(
        device, tmp_path, stream, MODEL_FACTORY="tiny:build_oom_above_two", POOL_WARMUP_BATCH_SIZES="1"
    )
    requests = [random_inputs(instance.model, batch=1, seed=seed) for seed in range(4)]
    trims = len(device.trims)
    with instance.execute(requests) as execution:
        for request, result in zip(requests, execution.results, strict=True):
            np.testing.assert_array_equal(result["OUT"], expected(request))
        assert execution.batches == [2, 2]  # the pass of 4 failed; its halves ran
    assert len(device.trims) > trims  # the pool gave back what it caches before the halves
    instance.close()


def test_a_request_torch_cannot_fit_alone_is_refused_with_who_holds_the_memory(sim, tmp_path, stream):
    device = sim()
    device.torch_cached = 3 * 2**20
    instance = gpu_instance(device, tmp_path, stream, MODEL_FACTORY="tiny:build_oom_always")
    assert "warm-up skipped batch size 1: the device ran out of memory" in instance.describe()
    [refused] = instance.execute([random_inputs(instance.model, batch=1, seed=1)]).results
    assert isinstance(refused, RequestError) and refused.code == "UNAVAILABLE"
    message = str(refused)
    assert "the device ran out of memory for this request (1 row(s)), after the pool gave back" in message
    assert "torch's caching allocator holds 3.0 MiB (0.0 MiB in use), the instance's pool" in message
    instance.close()
