"""The instance's data path through its pool, and the metrics it reports (fake pb_utils)."""

import json
import mmap

import numpy as np
import pytest

from tests import fake_pb_utils

pb_utils = fake_pb_utils.install()
from backend.instance import ModelInstance  # noqa: E402
from backend.model import TritonPythonModel  # noqa: E402
from tests.unit.specs import TOKENS_CONFIG, tiny_model_dir  # noqa: E402


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
    results = instance.execute([tokens(1, 2.0), tokens(3, 0.5)])
    np.testing.assert_allclose(results[1]["OUT"], tokens(3)["IDS"] * 0.5)
    stats = instance.pool.stats()
    assert stats.num_allocs - warm.num_allocs == 3  # IDS, SCALE, OUT: one block each
    assert stats.allocated_bytes == 0 and stats.upstream_allocs == warm.upstream_allocs
    arena = instance.pool._arenas[0].host_view
    assert np.shares_memory(results[0]["OUT"], arena)  # the output is a view of pool memory
    assert instance.batches_run == [4]


def test_steady_executions_never_go_upstream(tmp_path):
    instance = ModelInstance.load(config_with(POOL_WARMUP_BATCH_SIZES="1,2,3,4"), tiny_model_dir(tmp_path))
    warm = instance.pool.stats()
    rng = np.random.default_rng(0)
    for _ in range(200):
        instance.execute([tokens(int(rng.integers(1, 3))) for _ in range(int(rng.integers(1, 3)))])
    stats = instance.pool.stats()
    assert stats.upstream_allocs == warm.upstream_allocs and stats.allocated_bytes == 0
    assert stats.reuse_ratio > 0.99


def test_pool_off_serves_the_same_results_with_plain_allocation(tmp_path):
    on = ModelInstance.load(config_with(), tiny_model_dir(tmp_path))
    off = ModelInstance.load(config_with(POOL="off"), tiny_model_dir(tmp_path))
    assert off.pool is None
    requests = [tokens(2, 3.0), tokens(1, -1.0)]
    for a, b in zip(on.execute(requests), off.execute(requests), strict=True):
        np.testing.assert_array_equal(a["OUT"], b["OUT"])


def test_a_batch_over_the_pool_limit_is_unavailable_and_the_next_one_is_served(tmp_path):
    # 256 KiB limit: one arena; the batch of 4 fits, the request of many more rows would not.
    config = config_with(POOL_LIMIT_BYTES="256KiB")
    config["max_batch_size"] = 40000
    config["parameters"]["POOL_WARMUP_BATCH_SIZES"] = {"string_value": "1"}
    instance = ModelInstance.load(config, tiny_model_dir(tmp_path))
    [error] = instance.execute([tokens(20000)])
    assert error.code == "UNAVAILABLE"
    assert "memory pool cannot hold this batch: asked 480000 bytes, pool limit 262144 bytes" in str(error)
    [served] = instance.execute([tokens(4)])
    assert served["OUT"].shape == (4, 6) and instance.pool.stats().allocated_bytes == 0


@pytest.mark.parametrize(
    ("parameters", "message"),
    [
        ({"POOL": "maybe"}, "parameter POOL: expected one of on, off"),
        ({"POOL_LIMIT_BYTES": "lots"}, "parameter POOL_LIMIT_BYTES: expected a size like 512MiB"),
        ({"POOL_WARMUP_BATCH_SIZES": "1,99"}, "POOL_WARMUP_BATCH_SIZES: sizes must be in 1..4"),
        ({"POOL_KIND": "gpu"}, "parameter POOL_KIND: expected one of auto, host, pinned, cuda"),
        ({"POOL_RETAIN_HEAP": "yes"}, "parameter POOL_RETAIN_HEAP: expected one of true, false"),
    ],
)
def test_bad_pool_parameters_are_named(tmp_path, parameters, message):
    from backend.config import ConfigError

    with pytest.raises(ConfigError, match=message):
        ModelInstance.load(config_with(**parameters), tiny_model_dir(tmp_path))


def test_the_backend_reports_pool_figures_and_batch_sizes_as_metrics(tmp_path):
    model = TritonPythonModel()
    model.initialize(
        {
            "model_config": json.dumps(config_with()),
            "model_repository": str(tiny_model_dir(tmp_path)),
            "model_name": "tokens",
            "model_instance_name": "tokens_0",
        }
    )
    request = pb_utils.InferenceRequest([pb_utils.Tensor(name, array) for name, array in tokens(3).items()])
    model.execute([request, request])
    families = pb_utils.MetricFamily.registry
    [upstream] = families["tidepool_pool_upstream_allocs_total"].metrics[-1:]
    assert upstream.labels == {"model": "tokens", "instance": "tokens_0"}
    assert upstream.value == model.instance.pool.stats().upstream_allocs >= 1
    assert families["tidepool_pool_allocated_bytes"].metrics[-1].value == 0
    assert families["tidepool_batch_size"].metrics[-1].observations == [6.0]
    assert families["tidepool_pool_reserved_bytes"].metrics[-1].value > 0
    faults = families["tidepool_page_faults_total"].metrics[-1]
    assert faults.labels == {"model": "tokens", "instance": "tokens_0"} and faults.value >= 0
    level, logged = pb_utils.Logger.messages[-1]
    assert level == "info" and "tokens_0: pool host" in logged and "C heap: glibc" in logged
    model.finalize()


def test_the_c_heap_is_kept_only_with_the_pool_on_the_cpu(tmp_path):
    on = ModelInstance.load(config_with(), tiny_model_dir(tmp_path))
    assert on.heap_retention.applied
    for parameters in ({"POOL": "off"}, {"POOL_RETAIN_HEAP": "false"}):
        instance = ModelInstance.load(config_with(**parameters), tiny_model_dir(tmp_path))
        assert not instance.heap_retention.applied and "not kept" in instance.heap_retention.reason


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
    assert instance.page_faults == 0  # warm-up is not counted
    touch_fresh_memory_in_forward(instance)
    instance.execute([tokens(2)])
    assert instance.page_faults >= 256


def test_warm_up_repeats_a_batch_size_until_it_touches_no_fresh_pages(tmp_path):
    from backend.instance import WARMUP_MAX_ROUNDS

    steady = ModelInstance.load(config_with(POOL_WARMUP_BATCH_SIZES="1,4"), tiny_model_dir(tmp_path))
    assert set(steady.warmup_rounds) == {1, 4} and max(steady.warmup_rounds.values()) < WARMUP_MAX_ROUNDS
    touch_fresh_memory_in_forward(steady)
    steady.warm_up()  # never steady now: every size gets every round, and then it stops
    assert steady.warmup_rounds == {1: WARMUP_MAX_ROUNDS, 4: WARMUP_MAX_ROUNDS}
    off = ModelInstance.load(config_with(POOL="off"), tiny_model_dir(tmp_path))
    touch_fresh_memory_in_forward(off)
    off.warm_up()  # without a kept heap, repeating would change nothing
    assert set(off.warmup_rounds.values()) == {1}
