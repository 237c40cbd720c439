"""Fuzz: random requests of random names, dtypes, shapes and values never raise past execute,
and every answer is either a RequestError or outputs of exactly the right shape."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.unit.specs import TOKENS_CONFIG, tiny_model_dir
from tidepool.runtime.instance import ModelInstance
from tidepool.runtime.validation import RequestError, validate_request

DTYPES = [np.int32, np.int64, np.float32, np.float64, np.uint8, np.bool_, np.float16]


@st.composite
def arrays(draw):
    dtype = draw(st.sampled_from(DTYPES))
    shape = tuple(draw(st.lists(st.integers(0, 7), min_size=0, max_size=3)))
    size = int(np.prod(shape)) if shape else 1
    if np.dtype(dtype).kind == "f":
        values = draw(
            st.lists(st.floats(allow_nan=True, allow_infinity=True, width=16), min_size=size, max_size=size)
        )
    else:
        values = draw(st.lists(st.integers(-5, 130), min_size=size, max_size=size))
    with np.errstate(all="ignore"):
        return np.array(values).astype(dtype).reshape(shape)


@st.composite
def requests(draw):
    names = draw(st.lists(st.sampled_from(["IDS", "SCALE", "EXTRA"]), unique=True, max_size=3))
    request = {name: draw(arrays()) for name in names}
    if draw(st.booleans()):  # about half the requests start from a valid one, then get bent
        rows = draw(st.integers(1, 4))
        request = {
            "IDS": np.full((rows, 6), draw(st.integers(-1, 100)), dtype=np.int32),
            "SCALE": np.full((rows, 1), draw(st.floats(-2, 2)), dtype=np.float32),
            **request,
        }
    return request


@pytest.fixture(scope="module")
def instance(tmp_path_factory):
    return ModelInstance.load(TOKENS_CONFIG, tiny_model_dir(tmp_path_factory.mktemp("fuzz")))


@settings(max_examples=300, deadline=None)
@given(batch=st.lists(requests(), min_size=1, max_size=5))
def test_execute_answers_every_request_with_a_result_or_its_own_error(instance, batch):
    """A request that validates alone is served, whatever else shares its batch; one that does not
    gets INVALID_ARG, never INTERNAL (which would mean it reached the batch and failed it)."""
    execution = instance.execute(batch)
    results = execution.results
    assert len(results) == len(batch)
    for request, result in zip(batch, results, strict=True):
        try:
            validate_request(request, instance.model, instance.settings.allow_nonfinite)
        except RequestError as refused:
            assert isinstance(result, RequestError) and result.code == "INVALID_ARG", (refused, result)
            assert str(result) == str(refused)
            continue
        assert not isinstance(result, RequestError), result
        rows = request["IDS"].shape[0]
        assert set(result) == {"OUT"} and result["OUT"].shape == (rows, 6)
        np.testing.assert_allclose(result["OUT"], request["IDS"] * request["SCALE"], rtol=1e-6)
    instance.release()  # the instance holds its last execution until told or the next execute
    del execution, results, result  # the last views of the outputs: their blocks go back now
    assert instance.pool.stats().allocated_bytes == 0
