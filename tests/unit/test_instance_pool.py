"""The instance's data path through its pool: blocks, limits, warm-up, page faults."""

import dataclasses
import json
import mmap

import numpy as np
import pytest

from tests.unit.specs import TOKENS_CONFIG, tiny_model_dir
from tidepool.pool.host_heap import HeapRetention
from tidepool.runtime.instance import ModelInstance
from tidepool.runtime.process import process_state
from tidepool.spec import ConfigError


def config_with(**parameters) -> dict:
    config = json.loads(json.dumps(TOKENS_CONFIG))
    config["parameters"].update({k: {"string_value": v} for k, v in parameters.items()})
    return config


def tokens(rows: int, scale: float = 1.0) -> dict[str, np.ndarray]:
    return {
        "IDS": (np.arange(rows * 6, dtype=np.int32).reshape(rows, 6) % 100),
        "SCALE": np.full((rows, 1), scale, dtype=np.float32),
    }


def test_inputs_and_outputs_live_in_pool_blocks_that_all_come_back(tmp_path):
    instance = ModelInstance.load(config_with(), tiny_model_dir(tmp_path))
    warm = instance.pool.stats()
    with instance.execute([tokens(1, 2.0), tokens(3, 0.5)]) as execution:
        np.testing.assert_allclose(execution.results[1]["OUT"], tokens(3)["IDS"] * 0.5)
        arena = instance.pool._store.arenas[0].host_view
        assert np.shares_memory(execution.results[0]["OUT"], arena)  # a view of pool memory
        assert instance.pool.stats().allocated_bytes > 0  # held while the results are in use
    assert execution.batches == [4]
    # Released, but the results still hold views of OUT's block: it stays theirs until they go.
    assert instance.pool.stats().allocated_bytes == 256
    instance.release()  # the instance let go of its last execution too
    del execution
    stats = instance.pool.stats()
    assert stats.num_allocs - warm.num_allocs == 3  # IDS, SCALE, OUT: one block each
    assert stats.allocated_bytes == 0 and stats.upstream_allocs == warm.upstream_allocs


def test_results_of_one_execute_never_share_memory_even_without_a_batch_dimension(tmp_path):
    config = config_with()
    config["max_batch_size"] = 0  # each request runs on its own forward pass
    instance = ModelInstance.load(config, tiny_model_dir(tmp_path))
    one = {"IDS": np.full(6, 1, dtype=np.int32), "SCALE": np.ones(1, dtype=np.float32)}
    two = {"IDS": np.full(6, 2, dtype=np.int32), "SCALE": np.ones(1, dtype=np.float32)}
    execution = instance.execute([one, two])
    first, second = (result["OUT"] for result in execution.results)
    assert not np.shares_memory(first, second)
    np.testing.assert_array_equal(first, np.full(6, 1.0))  # not overwritten by the second pass
    np.testing.assert_array_equal(second, np.full(6, 2.0))
    assert execution.batches == [1, 1]


def test_the_previous_execution_is_released_by_the_next(tmp_path):
    instance = ModelInstance.load(config_with(), tiny_model_dir(tmp_path))
    scopes = instance.execute([tokens(2)]).scopes  # the instance alone holds the execution now
    held = instance.pool.stats().allocated_bytes
    instance.execute([tokens(2)])
    assert all(scope.done for scope in scopes)
    assert instance.pool.stats().allocated_bytes == held  # one execution's blocks, not two
    instance.release()
    assert instance.pool.stats().allocated_bytes == 0


def test_steady_executions_never_go_upstream(tmp_path):
    instance = ModelInstance.load(config_with(POOL_WARMUP_BATCH_SIZES="1,2,3,4"), tiny_model_dir(tmp_path))
    warm = instance.pool.stats()
    rng = np.random.default_rng(0)
    for _ in range(200):
        instance.execute([tokens(int(rng.integers(1, 3))) for _ in range(int(rng.integers(1, 3)))])
    instance.release()
    stats = instance.pool.stats()
    assert stats.upstream_allocs == warm.upstream_allocs and stats.allocated_bytes == 0
    assert stats.reuse_ratio > 0.99


def test_pool_off_serves_the_same_results_with_plain_allocation(tmp_path):
    on = ModelInstance.load(config_with(), tiny_model_dir(tmp_path))
    off = ModelInstance.load(config_with(POOL="off"), tiny_model_dir(tmp_path))
    assert off.pool is None
    requests = [tokens(2, 3.0), tokens(1, -1.0)]
    for a, b in zip(on.execute(requests).results, off.execute(requests).results, strict=True):
        np.testing.assert_array_equal(a["OUT"], b["OUT"])


def limited_instance(tmp_path, limit: str = "256KiB") -> ModelInstance:
    # 256 KiB: a request of 4 rows fits, one of 20000 rows (480 KB of IDS alone) does not.
    config = config_with(POOL_LIMIT_BYTES=limit, POOL_WARMUP_BATCH_SIZES="1")
    config["max_batch_size"] = 40000
    return ModelInstance.load(config, tiny_model_dir(tmp_path))


def test_a_request_too_large_for_the_pool_fails_for_good_and_the_next_one_is_served(tmp_path):
    instance = limited_instance(tmp_path)
    [error] = instance.execute([tokens(20000)]).results
    assert error.code == "RESOURCE_EXHAUSTED"  # retrying cannot help: never UNAVAILABLE
    assert "this request (20000 row(s)) does not fit the model instance's memory pool" in str(error)
    assert "needs 480000 bytes more, the pool limit is 262144 bytes" in str(error)
    with instance.execute([tokens(4)]) as execution:
        [served] = execution.results
        assert served["OUT"].shape == (4, 6)
    instance.release()
    del execution, served
    assert instance.pool.stats().allocated_bytes == 0


def test_a_batch_too_large_for_the_pool_is_split_so_each_request_that_fits_is_served(tmp_path):
    instance = limited_instance(tmp_path, "512KiB")
    requests = [tokens(3000, 1.0), tokens(3000, 2.0), tokens(3000, 3.0)]  # 9000 rows do not fit
    execution = instance.execute(requests)
    assert all(isinstance(result, dict) for result in execution.results)
    for scale, result in zip((1.0, 2.0, 3.0), execution.results, strict=True):
        np.testing.assert_allclose(result["OUT"], tokens(3000)["IDS"] * scale)
    assert execution.batches == [3000, 3000, 3000]  # halves, then halves again, as they fit


def test_warm_up_skips_a_batch_size_the_pool_cannot_hold_instead_of_failing_the_load(tmp_path):
    config = config_with(POOL_LIMIT_BYTES="256KiB")
    config["max_batch_size"] = 40000  # warm-up follows it, and 40000 rows do not fit
    instance = ModelInstance.load(config, tiny_model_dir(tmp_path))
    assert set(instance.warmup_rounds) == {1}
    assert "warm-up skipped batch size 40000: it does not fit POOL_LIMIT_BYTES" in instance.describe()


@pytest.mark.parametrize(
    ("parameters", "message"),
    [
        ({"POOL": "maybe"}, "parameter POOL: expected one of on, off"),
        ({"POOL_LIMIT_BYTES": "lots"}, "parameter POOL_LIMIT_BYTES: expected a size like 512MiB"),
        ({"POOL_WARMUP_BATCH_SIZES": "1,x"}, "POOL_WARMUP_BATCH_SIZES: expected e.g. '1,8,32'"),
        ({"POOL_WARMUP_BATCH_SIZES": "0,2"}, "POOL_WARMUP_BATCH_SIZES: sizes must be 1 or more"),
        ({"POOL_KIND": "gpu"}, "parameter POOL_KIND: expected one of auto, host, pinned, cuda"),
        ({"POOL_RETAIN_HEAP": "yes"}, "parameter POOL_RETAIN_HEAP: expected one of true, false"),
    ],
)
def test_bad_pool_parameters_are_named(tmp_path, parameters, message):
    with pytest.raises(ConfigError, match=message):
        ModelInstance.load(config_with(**parameters), tiny_model_dir(tmp_path))


def test_warm_up_follows_max_batch_size_and_clamps_sizes_above_it(tmp_path):
    config = config_with()
    config["max_batch_size"] = 2
    default = ModelInstance.load(config, tiny_model_dir(tmp_path))
    assert default.settings.warmup_batch_sizes == (1, 2) and set(default.warmup_rounds) == {1, 2}
    config["parameters"]["POOL_WARMUP_BATCH_SIZES"] = {"string_value": "1,8,32"}  # planned for 32
    clamped = ModelInstance.load(config, tiny_model_dir(tmp_path))
    assert clamped.settings.warmup_batch_sizes == (1, 2)
    assert "lists sizes above max_batch_size 2: warming up 1,2 instead" in clamped.describe()


def test_the_c_heap_is_asked_to_keep_memory_only_with_the_pool_on_the_cpu(tmp_path):
    on = ModelInstance.load(config_with(), tiny_model_dir(tmp_path))
    assert on.settings.why_heap_not_kept() is None and on.process.heap.applied
    for parameters, why in (
        ({"POOL": "off"}, "POOL=off"),
        ({"POOL_RETAIN_HEAP": "false"}, "POOL_RETAIN_HEAP"),
    ):
        instance = ModelInstance.load(config_with(**parameters), tiny_model_dir(tmp_path))
        assert why in instance.settings.why_heap_not_kept()


def touch_fresh_memory_in_forward(instance: ModelInstance) -> None:
    model_forward = instance.module.forward

    def forward_touching_fresh_memory(*inputs):
        with mmap.mmap(-1, 1 << 20) as fresh:  # 256 pages the process never touched
            for offset in range(0, 1 << 20, 4096):
                fresh[offset] = 1
        return model_forward(*inputs)

    instance.module.forward = forward_touching_fresh_memory


def test_each_execute_counts_the_page_faults_it_caused(tmp_path):
    instance = ModelInstance.load(config_with(), tiny_model_dir(tmp_path))
    assert instance.execute([tokens(2)]).page_faults < 256  # warm: nothing fresh
    touch_fresh_memory_in_forward(instance)
    assert instance.execute([tokens(2)]).page_faults >= 256


def test_warm_up_repeats_a_batch_size_until_it_touches_no_fresh_pages(tmp_path, monkeypatch):
    from tidepool.runtime.warmup import WARMUP_MAX_ROUNDS

    steady = ModelInstance.load(config_with(POOL_WARMUP_BATCH_SIZES="1,4"), tiny_model_dir(tmp_path))
    assert set(steady.warmup_rounds) == {1, 4} and max(steady.warmup_rounds.values()) < WARMUP_MAX_ROUNDS
    touch_fresh_memory_in_forward(steady)
    steady.warm_up()  # never steady now: every size gets every round, and then it stops
    assert steady.warmup_rounds == {1: WARMUP_MAX_ROUNDS, 4: WARMUP_MAX_ROUNDS}
    off = ModelInstance.load(config_with(POOL="off"), tiny_model_dir(tmp_path))
    # The heap setting is process-wide and another test's instance kept it: say this process did not.
    not_kept = dataclasses.replace(process_state(), heap=HeapRetention(False, "not kept"))
    monkeypatch.setattr("tidepool.runtime.instance.process_state", lambda: not_kept)
    touch_fresh_memory_in_forward(off)
    off.warm_up()  # without a kept heap, repeating would change nothing
    assert set(off.warmup_rounds.values()) == {1}


def test_the_device_running_out_splits_the_batch_then_fails_only_what_cannot_fit(tmp_path, monkeypatch):
    """torch's own OutOfMemoryError (the device's memory, not the pool's limit): a batch is run
    again as halves; a request that alone still does not fit gets UNAVAILABLE (it may fit later);
    the others are served and the pool keeps nothing of the failed attempts."""
    import torch

    instance = ModelInstance.load(config_with(), tiny_model_dir(tmp_path))
    instance.release()
    forward = instance.forward

    def forward_on_a_full_device(batch, rows, allocate):
        if rows is not None and rows > 2:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 20.00 MiB")
        return forward(batch, rows, allocate)

    monkeypatch.setattr(instance, "forward", forward_on_a_full_device)
    execution = instance.execute([tokens(1, 2.0), tokens(2, 3.0), tokens(3, 4.0)])
    served, halves, alone = execution.results
    np.testing.assert_allclose(served["OUT"], tokens(1)["IDS"] * 2.0)
    np.testing.assert_allclose(halves["OUT"], tokens(2)["IDS"] * 3.0)
    assert alone.code == "UNAVAILABLE" and "the device ran out of memory for this request" in str(alone)
    assert execution.batches == [1, 2]  # 6 rows failed, then 1 + 2 ran; 3 alone failed again
    instance.release()
    del execution, served, halves, alone
    assert instance.pool.stats().allocated_bytes == 0


def model_dir_with(tmp_path, source: str):
    """A model directory whose factory builds the module `source` defines as `Model`."""
    model_dir = tiny_model_dir(tmp_path)
    (model_dir / "odd.py").write_text("import torch\n" + source + "\ndef build():\n    return Model()\n")
    return model_dir


def test_outputs_that_do_not_match_the_config_fail_the_load_with_the_reason(tmp_path):
    from tidepool.runtime.loader import ModelLoadError

    forward = "class Model(torch.nn.Module):\n    def forward(self, ids, scale):\n        return "
    cases = {
        "{'OTHER': ids.float()}": "the model's output dict lacks OUT",
        "ids.float(), scale": "the model returned 2 outputs, the config declares 1 (OUT)",
        "ids.float()[:, :3]": "output OUT has shape [1, 3], the config declares [1, 6]",
    }
    for index, (returned, message) in enumerate(cases.items()):
        model_dir = model_dir_with(tmp_path / str(index), forward + returned + "\n")
        with pytest.raises(ModelLoadError) as caught:
            ModelInstance.load(config_with(MODEL_FACTORY="odd:build"), model_dir)
        assert "warm-up at batch size 1 failed: the model failed: ModelOutputError" in str(caught.value)
        assert message in str(caught.value)


def test_bf16_runs_in_bf16_and_answers_in_the_configs_float32(tmp_path):
    instance = ModelInstance.load(config_with(PRECISION="bf16"), tiny_model_dir(tmp_path))
    assert instance.compute_dtype is not None and str(instance.compute_dtype) == "torch.bfloat16"
    with instance.execute([tokens(2, 0.5)]) as execution:
        [result] = execution.results
        assert result["OUT"].dtype == np.float32  # as the config declares, whatever ran inside
        np.testing.assert_allclose(result["OUT"], tokens(2)["IDS"] * 0.5, rtol=1e-2)


def test_the_pool_reserves_its_initial_bytes_at_load_and_reset_peak_starts_the_peaks_afresh(tmp_path):
    instance = ModelInstance.load(config_with(POOL_INITIAL_BYTES="8MiB"), tiny_model_dir(tmp_path))
    stats = instance.pool.stats()
    assert stats.reserved_bytes >= 8 * 2**20 and stats.upstream_allocs >= 1
    instance.execute([tokens(4), tokens(4)])
    instance.release()
    peak = instance.pool.stats().peak_allocated_bytes
    assert peak > 0
    instance.pool.reset_peak()
    assert instance.pool.stats().peak_allocated_bytes == 0  # nothing is in use right now
    instance.execute([tokens(1)])
    assert 0 < instance.pool.stats().peak_allocated_bytes < peak
