"""Both example models served by a real tritonserver, over HTTP and gRPC."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
import torch
from tritonclient.utils import InferenceServerException

from tests.integration.conftest import server_config
from tidepool.clients.connection import Connection
from tidepool.inputs import random_inputs
from tidepool.launcher.server import ServerError, TritonServer
from tidepool.runtime.loader import load_model
from tidepool.testing import MODEL_REPOSITORY

_local_models: dict[str, torch.nn.Module] = {}


def local_model(name: str, spec) -> torch.nn.Module:
    """The same torch module, built in the test process from the same model directory."""
    if name not in _local_models:
        _local_models[name] = load_model(MODEL_REPOSITORY / name, spec)
    return _local_models[name]


@pytest.mark.parametrize(("model", "batch"), [("encoder", 1), ("encoder", None), ("convnet", 2)])
def test_outputs_equal_the_same_module_run_in_process(connection, model, batch):
    spec = connection.model_spec(model)
    batch = batch or spec.max_batch_size  # None: the largest the config takes
    inputs = random_inputs(spec, batch=batch, seed=batch)
    served = connection.infer(model, inputs, spec)
    with torch.inference_mode():
        expected = local_model(model, spec)(*(torch.from_numpy(inputs[s.name]) for s in spec.inputs))
    [output] = spec.outputs
    assert served[output.name].shape == (batch, *output.dims)
    np.testing.assert_allclose(served[output.name], expected.numpy(), rtol=1e-5, atol=1e-5)


BAD_ENCODER_REQUESTS = {
    "token id above the vocabulary": (
        lambda x: x["INPUT_IDS"].__setitem__((0, 5), 30522),
        "input INPUT_IDS: value 30522 is outside the allowed range [0, 30521]",
    ),
    "negative token id": (
        lambda x: x["INPUT_IDS"].__setitem__((0, 0), -4),
        "input INPUT_IDS: value -4 is outside the allowed range",
    ),
}


@pytest.mark.parametrize("case", sorted(BAD_ENCODER_REQUESTS))
def test_bad_values_get_a_clear_error_and_the_server_stays_ready(connection, case):
    change, message = BAD_ENCODER_REQUESTS[case]
    spec = connection.model_spec("encoder")
    inputs = random_inputs(spec, batch=1)
    change(inputs)
    with pytest.raises(InferenceServerException) as caught:
        connection.infer("encoder", inputs, spec)
    assert message in str(caught.value)
    assert connection.is_ready()


def test_nan_in_an_image_is_rejected(connection):
    spec = connection.model_spec("convnet")
    inputs = random_inputs(spec, batch=1)
    inputs["IMAGE"][0, 1, 2, 3] = np.nan
    with pytest.raises(InferenceServerException, match="input IMAGE: 1 value.s. are not finite"):
        connection.infer("convnet", inputs, spec)
    assert connection.is_ready()


def test_a_wrong_shape_is_refused_with_the_model_shape_named(connection):
    spec = connection.model_spec("encoder")
    inputs = {"INPUT_IDS": np.zeros((1, 64), dtype=np.int32)}
    with pytest.raises(InferenceServerException, match="INPUT_IDS"):
        connection.infer("encoder", inputs, spec)
    assert connection.is_ready()


def test_a_bad_request_among_concurrent_good_ones_fails_alone(server):
    # tritonclient's HTTP client is gevent-based: one client per thread.
    def send(index: int):
        with Connection.open("http", server.config.http_url) as http:
            spec = http.model_spec("encoder")
            inputs = random_inputs(spec, batch=1, seed=index)
            if index == 5:
                inputs["INPUT_IDS"][0, 0] = 99999
            try:
                return http.infer("encoder", inputs, spec)["EMBEDDING"].shape
            except InferenceServerException as exc:
                return str(exc)

    with ThreadPoolExecutor(8) as pool:
        results = list(pool.map(send, range(16)))
    failed = [i for i, r in enumerate(results) if isinstance(r, str)]
    assert failed == [5] and "value 99999 is outside" in results[5]
    assert all(r == (1, 256) for i, r in enumerate(results) if i != 5)


def settled_statistics(connection: Connection, model: str) -> dict:
    """The model's statistics once they stop changing: Triton counts a request after its
    response is sent, so the last answered requests may not be counted yet."""
    previous = connection.statistics(model)["model_stats"][0]
    while True:
        time.sleep(0.1)
        current = connection.statistics(model)["model_stats"][0]
        if current.get("inference_count") == previous.get("inference_count"):
            return current
        previous = current


def test_concurrent_clients_are_batched_by_the_dynamic_batcher(server):
    with Connection.open("grpc", server.config.grpc_url) as grpc:
        spec = grpc.model_spec("encoder")
        before = settled_statistics(grpc, "encoder")
        inputs = random_inputs(spec, batch=1)

        def send(_):
            with Connection.open("grpc", server.config.grpc_url) as own:
                for _ in range(12):
                    own.infer("encoder", inputs, spec)

        with ThreadPoolExecutor(8) as pool:
            list(pool.map(send, range(8)))
        after = settled_statistics(grpc, "encoder")
    inferences = int(after["inference_count"]) - int(before.get("inference_count", 0))
    executions = int(after["execution_count"]) - int(before.get("execution_count", 0))
    assert inferences == 96
    assert executions < inferences, f"{executions} executions for {inferences} requests: no batching"


def test_a_model_that_fails_to_load_is_reported_by_name(tmp_path):
    broken = tmp_path / "broken"
    (broken / "1").mkdir(parents=True)
    config = (MODEL_REPOSITORY / "encoder" / "config.pbtxt").read_text()
    (broken / "config.pbtxt").write_text(
        config.replace('name: "encoder"', 'name: "broken"').replace("encoder_model:build", "absent:build")
    )
    with pytest.raises(ServerError) as caught:
        TritonServer(server_config(tmp_path)).start(timeout_s=120)
    report = str(caught.value)
    assert "failed to load 'broken'" in report and "absent.py" in report
    assert "A model failed to load" in report


def test_the_command_line_answers_in_one_line_and_names_a_protocol_mix_up(server, capsys):
    from tidepool import cli

    assert cli.main(["infer", "encoder", "--protocol", "grpc", "--url", server.config.grpc_url]) == 0
    assert "EMBEDDING: shape [1, 256]" in capsys.readouterr().out
    # HTTP (the default) sent to the gRPC port: the reason and the fix, not "a bug in Tidepool".
    assert cli.main(["infer", "encoder", "--url", server.config.grpc_url]) == 1
    error = capsys.readouterr().err
    assert "did not answer in HTTP" in error and "--protocol grpc" in error and "bug" not in error
    assert error.count("\n") == 1
