"""The backend's TritonPythonModel through the fake pb_utils: the whole execute path of one
instance, its error contract and its metrics."""

import json

import numpy as np
import pytest

from tests.fake_pb_utils import output_of
from tests.unit.specs import TOKENS_CONFIG, tiny_model_dir


def triton_args(model_dir, config=TOKENS_CONFIG, kind="CPU", device_id="0") -> dict:
    return {
        "model_config": json.dumps(config),
        "model_repository": str(model_dir),
        "model_name": "tokens",
        "model_instance_name": "tokens_0",
        "model_instance_kind": kind,
        "model_instance_device_id": device_id,
        "model_version": "1",
    }


@pytest.fixture
def model(pb_utils, tmp_path):
    from tidepool.runtime.model import TritonPythonModel

    instance = TritonPythonModel()
    instance.initialize(triton_args(tiny_model_dir(tmp_path)))
    yield instance
    instance.finalize()


def request(pb_utils, ids: np.ndarray, scale: float):
    rows = ids.shape[0]
    return pb_utils.InferenceRequest(
        requested_output_names=["OUT"],
        model_name="tokens",
        inputs=[
            pb_utils.Tensor("IDS", ids.astype(np.int32)),
            pb_utils.Tensor("SCALE", np.full((rows, 1), scale, dtype=np.float32)),
        ],
    )


def test_each_request_gets_its_own_rows(pb_utils, model):
    ids_a = np.arange(6).reshape(1, 6)
    ids_b = np.arange(18).reshape(3, 6)
    responses = model.execute([request(pb_utils, ids_a, 2.0), request(pb_utils, ids_b, 0.5)])
    assert [r.has_error() for r in responses] == [False, False]
    np.testing.assert_allclose(output_of(responses[0], "OUT"), ids_a * 2.0)
    np.testing.assert_allclose(output_of(responses[1], "OUT"), ids_b * 0.5)


def test_one_bad_request_among_good_ones_fails_alone(pb_utils, model):
    good = np.arange(12).reshape(2, 6)
    bad = np.full((1, 6), 500)  # above range.IDS
    batch = [request(pb_utils, good, 1.0), request(pb_utils, bad, 1.0), request(pb_utils, good, 3.0)]
    responses = model.execute(batch)
    assert [r.has_error() for r in responses] == [False, True, False]
    assert responses[1].error().code() == pb_utils.TritonError.INVALID_ARG
    assert "input IDS: value 500 is outside the allowed range [0, 99]" in responses[1].error().message()
    np.testing.assert_allclose(output_of(responses[2], "OUT"), good * 3.0)


def test_a_model_failure_answers_every_request_of_the_batch_with_internal(pb_utils, model):
    model.instance.module = lambda *tensors: (_ for _ in ()).throw(RuntimeError("boom"))
    responses = model.execute(
        [request(pb_utils, np.zeros((1, 6)), 1.0), request(pb_utils, np.zeros((2, 6)), 1.0)]
    )
    assert all(r.has_error() for r in responses)
    assert responses[0].error().code() == pb_utils.TritonError.INTERNAL
    assert "the model failed: RuntimeError: boom" in responses[0].error().message()


def test_an_output_of_the_wrong_shape_is_reported(pb_utils, model):
    model.instance.module = lambda ids, scale: ids.float()[:, :5]
    [response] = model.execute([request(pb_utils, np.zeros((2, 6)), 1.0)])
    assert "output OUT has shape [2, 5], the config declares [2, 6]" in response.error().message()


def test_outputs_stay_intact_until_the_next_execute(pb_utils, model):
    """The stub copies output tensors after execute returns: nothing may reuse their blocks before."""
    first = model.execute([request(pb_utils, np.full((2, 6), 7), 1.0)])
    held = output_of(first[0], "OUT")
    assert np.shares_memory(held, model.instance.pool._arenas[0].host_view)  # a view of a pool block
    assert model.instance.pool.stats().allocated_bytes > 0  # still reserved between executes
    np.testing.assert_array_equal(held, np.full((2, 6), 7.0))


def test_a_request_that_alone_exceeds_the_pool_limit_is_not_answered_retry_later(pb_utils, tmp_path):
    from tidepool.runtime.model import TritonPythonModel

    config = json.loads(json.dumps(TOKENS_CONFIG))
    config["max_batch_size"] = 40000
    config["parameters"]["POOL_LIMIT_BYTES"] = {"string_value": "256KiB"}
    config["parameters"]["POOL_WARMUP_BATCH_SIZES"] = {"string_value": "1"}
    model = TritonPythonModel()
    model.initialize(triton_args(tiny_model_dir(tmp_path), config))
    [response] = model.execute([request(pb_utils, np.zeros((20000, 6)), 1.0)])
    # RESOURCE_EXHAUSTED is missing from this server's pb_utils: the nearest is INVALID_ARG, never
    # UNAVAILABLE (which every Triton client takes as "try again").
    assert response.error().code() == pb_utils.TritonError.INVALID_ARG
    assert "does not fit the model instance's memory pool" in response.error().message()
    model.finalize()


def test_the_backend_reports_pool_figures_and_batch_sizes_as_metrics(pb_utils, model):
    batch = [request(pb_utils, np.zeros((3, 6)), 1.0), request(pb_utils, np.zeros((3, 6)), 1.0)]
    model.execute(batch)
    families = pb_utils.state.families
    [upstream] = families["tidepool_pool_upstream_allocs_total"].metrics
    assert upstream.labels == {"model": "tokens", "instance": "tokens_0"}
    assert upstream.value() == model.instance.pool.stats().upstream_allocs
    assert upstream.value() >= 1 and families["tidepool_pool_reserved_bytes"].metrics[0].value() > 0
    assert families["tidepool_batch_size"].metrics[0].observed == [6.0]  # warm-up is not traffic
    model.execute(batch)
    assert families["tidepool_batch_size"].metrics[0].observed == [6.0, 6.0]
    assert "tidepool_elastic_threads" not in families  # only elastic instances share cores
    [(level, logged)] = pb_utils.state.logged
    assert (
        level == "info"
        and "tokens_0: cpu, fp32, eager graph; pool host" in logged
        and "custom metrics on" in logged
    )


def test_with_metrics_off_the_model_loads_serves_and_says_so(pb_utils, tmp_path):
    from tidepool.runtime.model import TritonPythonModel

    pb_utils.state.metrics_enabled = False  # as tritonserver --allow-metrics=false
    model = TritonPythonModel()
    model.initialize(triton_args(tiny_model_dir(tmp_path)))
    [response] = model.execute([request(pb_utils, np.ones((1, 6)), 2.0)])
    np.testing.assert_allclose(output_of(response, "OUT"), np.full((1, 6), 2.0))
    assert "custom metrics off" in pb_utils.state.logged[0][1] and not pb_utils.state.families
    model.finalize()


def test_the_pool_arenas_are_walked_for_metrics_at_most_once_per_interval(pb_utils, model, monkeypatch):
    pool = model.instance.pool
    walks = []
    largest = pool._largest_free_block
    monkeypatch.setattr(pool, "_largest_free_block", lambda: walks.append(1) or largest())
    monkeypatch.setattr(pool, "_maintain", lambda: None)  # the pool's own housekeeping walks too
    from tidepool.runtime import metrics

    now = [1000.0]
    monkeypatch.setattr(metrics.time, "monotonic", lambda: now[0])
    for _ in range(20):  # inside one FRAGMENTATION_INTERVAL_S
        model.execute([request(pb_utils, np.zeros((1, 6)), 1.0)])
    assert len(walks) == 1
    now[0] += metrics.FRAGMENTATION_INTERVAL_S
    model.execute([request(pb_utils, np.zeros((1, 6)), 1.0)])
    assert len(walks) == 2  # the next interval: walked again
    allocated = pb_utils.state.families["tidepool_pool_allocated_bytes"].metrics[0].value()
    assert allocated == pool.stats().allocated_bytes > 0  # counters are current after every execution
