"""backend/model.py through the fake pb_utils: the whole execute path of one instance."""

import json

import numpy as np
import pytest

from tests import fake_pb_utils

pb_utils = fake_pb_utils.install()
from backend.model import TritonPythonModel  # noqa: E402
from tests.unit.specs import TOKENS_CONFIG, tiny_model_dir  # noqa: E402


@pytest.fixture
def model(tmp_path):
    instance = TritonPythonModel()
    instance.initialize(
        {
            "model_config": json.dumps(TOKENS_CONFIG),
            "model_repository": str(tiny_model_dir(tmp_path)),
            "model_name": "tokens",
            "model_instance_name": "tokens_0",
            "model_version": "1",
        }
    )
    yield instance
    instance.finalize()


def request(ids: np.ndarray, scale: float) -> fake_pb_utils.InferenceRequest:
    rows = ids.shape[0]
    return pb_utils.InferenceRequest(
        [
            pb_utils.Tensor("IDS", ids.astype(np.int32)),
            pb_utils.Tensor("SCALE", np.full((rows, 1), scale, dtype=np.float32)),
        ]
    )


def test_each_request_gets_its_own_rows(model):
    ids_a = np.arange(6).reshape(1, 6)
    ids_b = np.arange(18).reshape(3, 6)
    responses = model.execute([request(ids_a, 2.0), request(ids_b, 0.5)])
    assert [r.has_error() for r in responses] == [False, False]
    np.testing.assert_allclose(responses[0].output("OUT"), ids_a * 2.0)
    np.testing.assert_allclose(responses[1].output("OUT"), ids_b * 0.5)


def test_one_bad_request_among_good_ones_fails_alone(model):
    good = np.arange(12).reshape(2, 6)
    bad = np.full((1, 6), 500)  # above range.IDS
    responses = model.execute([request(good, 1.0), request(bad, 1.0), request(good, 3.0)])
    assert [r.has_error() for r in responses] == [False, True, False]
    assert responses[1].error.code() == pb_utils.TritonError.INVALID_ARG
    assert "input IDS: value 500 is outside the allowed range [0, 99]" in responses[1].error.message()
    np.testing.assert_allclose(responses[2].output("OUT"), good * 3.0)


def test_a_model_failure_answers_every_request_of_the_batch_with_internal(model):
    model.instance.module = lambda *tensors: (_ for _ in ()).throw(RuntimeError("boom"))
    responses = model.execute([request(np.zeros((1, 6)), 1.0), request(np.zeros((2, 6)), 1.0)])
    assert all(r.has_error() for r in responses)
    assert responses[0].error.code() == pb_utils.TritonError.INTERNAL
    assert "the model failed: RuntimeError: boom" in responses[0].error.message()


def test_an_output_of_the_wrong_shape_is_reported(model):
    model.instance.module = lambda ids, scale: ids.float()[:, :5]
    [response] = model.execute([request(np.zeros((2, 6)), 1.0)])
    assert "output OUT has shape [2, 5], the config declares [2, 6]" in response.error.message()
