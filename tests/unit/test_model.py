"""The backend's TritonPythonModel through the fake pb_utils: the whole execute path of one
instance, its error contract and its metrics."""

import gc
import json
import time

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
def model(pb_utils, tmp_path, monkeypatch):
    from tidepool.runtime.model import TritonPythonModel

    monkeypatch.setenv("TIDEPOOL_METRICS_INTERVAL_S", "60")  # the tests flush by hand

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
    """The stub copies output tensors after execute returns: nothing may reuse their blocks before,
    not the housekeeping that runs as the responses go out, not a trim, not the next execution
    while a view of them is still read."""
    first = model.execute([request(pb_utils, np.full((2, 6), 7), 1.0)])
    held = output_of(first[0], "OUT")
    assert np.shares_memory(held, model.instance.pool._store.arenas[0].host_view)  # a view of a pool block
    assert model.instance.pool.stats().allocated_bytes > 0  # still reserved between executes
    model.instance.housekeep()
    model.instance.pool.trim()
    np.testing.assert_array_equal(held, np.full((2, 6), 7.0))
    second = model.execute([request(pb_utils, np.full((2, 6), 3), 1.0)])
    again = output_of(second[0], "OUT")
    np.testing.assert_array_equal(again, np.full((2, 6), 3.0))
    np.testing.assert_array_equal(held, np.full((2, 6), 7.0))
    assert not np.shares_memory(held, again)


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


def test_execute_only_notes_metrics_and_a_flush_sends_them(pb_utils, model):
    batch = [request(pb_utils, np.zeros((3, 6)), 1.0), request(pb_utils, np.zeros((3, 6)), 1.0)]
    families = pb_utils.state.families
    model.execute(batch)
    assert families["tidepool_batches_total"].metrics == []  # no message from execute
    model.metrics.flush()
    [six] = families["tidepool_batches_total"].metrics
    assert six.labels == {"model": "tokens", "instance": "tokens_0", "batch_size": "6"}
    assert six.value() == 1  # warm-up is not traffic
    [upstream] = families["tidepool_pool_upstream_allocs_total"].metrics
    assert upstream.value() == model.instance.pool.stats().upstream_allocs >= 1
    assert families["tidepool_pool_reserved_bytes"].metrics[0].value() > 0
    allocated = families["tidepool_pool_allocated_bytes"].metrics[0].value()
    assert allocated == model.instance.pool.stats().allocated_bytes > 0
    model.execute(batch)
    model.execute(batch[:1])
    model.metrics.flush()
    three = next(m for m in families["tidepool_batches_total"].metrics if m.labels["batch_size"] == "3")
    assert (six.value(), three.value()) == (2, 1)
    assert families["tidepool_batch_rows_total"].metrics[0].value() == 6 + 6 + 3
    assert "tidepool_elastic_passes_total" not in families  # only elastic instances share cores
    [(level, logged)] = pb_utils.state.logged
    assert (
        level == "info"
        and "tokens_0: cpu, fp32, eager graph; pool host" in logged
        and "custom metrics on" in logged
    )


def test_garbage_collections_in_the_stub_are_counted_and_their_pause_sent(pb_utils, tmp_path, monkeypatch):
    from tidepool.runtime.model import TritonPythonModel

    monkeypatch.setenv("TIDEPOOL_METRICS_INTERVAL_S", "60")
    model = TritonPythonModel()
    model.initialize(triton_args(tiny_model_dir(tmp_path)))
    families = pb_utils.state.families
    [pause] = families["tidepool_gc_pause_us_total"].metrics
    model.metrics.flush()
    paused_before = pause.value()
    gc.collect()
    model.metrics.flush()
    full = next(m for m in families["tidepool_gc_collections_total"].metrics if m.labels["generation"] == "2")
    assert full.labels["instance"] == "tokens_0" and full.value() >= 1
    assert pause.value() > paused_before
    watch = model.metrics.sources.gc
    model.finalize()
    assert watch.on_gc not in gc.callbacks  # the watch leaves with the last instance


def test_an_instance_that_joins_a_shared_watch_sends_only_the_collections_after_it(pb_utils):
    from tidepool.runtime import gc_watch
    from tidepool.runtime.metrics import InstanceMetrics, MetricSources

    watch = gc_watch.start_watching()
    try:
        gc.collect()  # before this instance: another's
        metrics = InstanceMetrics(pb_utils, "tokens", "tokens_1", MetricSources(gc=watch))
        metrics.flush()
        assert pb_utils.state.families["tidepool_gc_collections_total"].metrics == []
        gc.collect()
        metrics.flush()
        collections = pb_utils.state.families["tidepool_gc_collections_total"].metrics
        assert [m.value() for m in collections if m.labels["generation"] == "2"] == [1]
    finally:
        gc_watch.stop_watching()


def test_metrics_are_sent_by_the_instance_s_thread_and_at_finalize(pb_utils, tmp_path, monkeypatch):
    from tidepool.runtime.model import TritonPythonModel

    monkeypatch.setenv("TIDEPOOL_METRICS_INTERVAL_S", "0.02")
    model = TritonPythonModel()
    model.initialize(triton_args(tiny_model_dir(tmp_path)))
    model.execute([request(pb_utils, np.zeros((2, 6)), 1.0)])
    rows = pb_utils.state.families["tidepool_batch_rows_total"].metrics[0]
    deadline = time.monotonic() + 5
    while rows.value() == 0 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert rows.value() == 2
    monkeypatch.setenv("TIDEPOOL_METRICS_INTERVAL_S", "60")
    slow = TritonPythonModel()
    slow.initialize(triton_args(tiny_model_dir(tmp_path)))
    slow.execute([request(pb_utils, np.zeros((1, 6)), 1.0)])
    slow_rows = pb_utils.state.families["tidepool_batch_rows_total"].metrics[-1]
    assert slow_rows.value() == 0  # noted, not sent
    slow.finalize()
    assert slow_rows.value() == 1  # what was left is sent as the instance ends
    model.finalize()


def test_a_bad_metrics_interval_is_refused_in_one_line(pb_utils, tmp_path, monkeypatch):
    from tidepool.runtime.model import TritonPythonModel
    from tidepool.spec import ConfigError

    monkeypatch.setenv("TIDEPOOL_METRICS_INTERVAL_S", "soon")
    with pytest.raises(ConfigError, match="TIDEPOOL_METRICS_INTERVAL_S must be a number of seconds"):
        TritonPythonModel().initialize(triton_args(tiny_model_dir(tmp_path)))


def test_with_metrics_off_the_model_loads_serves_and_says_so(pb_utils, tmp_path):
    from tidepool.runtime.model import TritonPythonModel

    pb_utils.state.metrics_enabled = False  # as tritonserver --allow-metrics=false
    callbacks = list(gc.callbacks)
    model = TritonPythonModel()
    model.initialize(triton_args(tiny_model_dir(tmp_path)))
    assert gc.callbacks == callbacks  # no garbage-collector watch without metrics to send it
    [response] = model.execute([request(pb_utils, np.ones((1, 6)), 2.0)])
    np.testing.assert_allclose(output_of(response, "OUT"), np.full((1, 6), 2.0))
    assert "custom metrics off" in pb_utils.state.logged[0][1] and not pb_utils.state.families
    model.finalize()


def test_the_log_gets_a_failures_traceback_once_then_a_line_at_each_power_of_ten():
    from tidepool.runtime.model import FailureLog

    log = FailureLog()
    trace = "Traceback (most recent call last):\n  File x\nIndexError: index out of range in self\n"
    lines = [log.line(trace) for _ in range(100)]
    assert lines[0].startswith("the model failed:\nTraceback") and lines[0].endswith("in self\n")
    logged = [(i + 1, line) for i, line in enumerate(lines) if line][1:]
    assert logged == [(n, f"the model failed {n} times so far with: IndexError: index out of range in self")
                      for n in (10, 100)]  # fmt: skip
    assert log.line(trace.replace("IndexError", "KeyError")).startswith(
        "the model failed:\n"
    )  # another failure


def test_a_ragged_model_answers_each_request_as_its_pass_ends(pb_utils, tmp_path, monkeypatch):
    """Requests of different lengths run as several passes of one execution: each is sent through
    its response sender as its own pass ends (the short ones first), not when the execution does."""
    from tests.unit.specs import text_config, text_model_dir
    from tidepool.runtime.model import TritonPythonModel

    monkeypatch.setenv("TIDEPOOL_METRICS_INTERVAL_S", "60")
    model = TritonPythonModel()
    model.initialize(triton_args(text_model_dir(tmp_path), text_config(PASS_COST_TOKENS="0")))
    assert "each request answered as its pass ends" in pb_utils.state.logged[-1][1]

    def text(length: int, seed: int):
        rng = np.random.default_rng(seed)
        return pb_utils.InferenceRequest(
            requested_output_names=["hidden", "pooled"], model_name="text",
            inputs=[pb_utils.Tensor("ids", rng.integers(0, 50, (1, length))),
                    pb_utils.Tensor("mask", np.ones((1, length), np.int64))],
        )  # fmt: skip

    requests = [text(40, 1), text(3, 2), text(0, 3), text(17, 4)]  # the empty one is refused first
    assert model.execute(requests) is None
    sent = [r.get_response_sender().sent for r in requests]
    assert [len(s) for s in sent] == [1, 1, 1, 1]
    (long, _, long_at), (short, _, short_at), (_, refused, refused_at), (middle, _, _) = (s[0] for s in sent)
    assert refused is not None and "an empty sequence" in refused.message() and refused_at < short_at
    assert short_at < long_at  # passes of their own (PASS_COST_TOKENS 0): the shortest answered first
    assert [long["hidden"].shape[1], short["hidden"].shape[1], middle["hidden"].shape[1]] == [40, 3, 17]
    alone = model.instance.execute([{"ids": requests[0].inputs()[0].as_numpy(),
                                     "mask": requests[0].inputs()[1].as_numpy()}]).results[0]  # fmt: skip
    np.testing.assert_allclose(long["hidden"], alone["hidden"], rtol=1e-6)
    model.finalize()
