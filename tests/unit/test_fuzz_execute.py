"""Fuzz: random requests of random names, dtypes, shapes and values never raise past execute,
and every answer is what the config says it must be: outputs for a request the tiny model's
config admits (judged here from the config, not by the validator under test), its own INVALID_ARG
naming what is wrong for one it does not."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.unit.specs import TOKENS_CONFIG, tiny_model_dir
from tidepool.runtime.instance import ModelInstance
from tidepool.runtime.validation import RequestError

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
            # the range's edges and one past each, where an off-by-one would hide
            "IDS": np.full(
                (rows, 6), draw(st.sampled_from([-1, 0, 99, 100]) | st.integers(-1, 100)), dtype=np.int32
            ),
            "SCALE": np.full((rows, 1), draw(st.floats(-2, 2)), dtype=np.float32),
            **request,
        }
    return request


def problems(request: dict[str, np.ndarray]) -> set[str]:
    """TOKENS_CONFIG's rules, written out: exactly IDS (int32, rows x 6, values 0-99) and SCALE
    (float32, rows x 1, finite), the same 1-4 rows each. Every rule the request breaks, as words one
    of which its error must contain (the validator names the first it meets); empty: it is valid."""
    found = set()
    if set(request) - {"IDS", "SCALE"}:
        found.add("unknown input")
    if {"IDS", "SCALE"} - set(request):
        found.add("missing input")
    wanted = {"IDS": (np.int32, 6), "SCALE": (np.float32, 1)}
    rows = set()
    for name, array in request.items():
        if name not in wanted:
            continue
        dtype, width = wanted[name]
        if array.dtype != dtype:
            found.add("data type")
        if array.ndim == 0:
            found.add("scalar")
            continue
        if array.ndim != 2 or array.shape[1] != width:
            found.add("shape")
        rows.add(array.shape[0])
        if not 1 <= array.shape[0] <= 4:
            found.add("batch")
        if array.dtype == dtype and array.size and name == "IDS" and (array.min() < 0 or array.max() > 99):
            found.add("outside the allowed range")
        if array.dtype == dtype and array.size and name == "SCALE" and not np.isfinite(array).all():
            found.add("not finite")
    if len(rows) > 1:
        found.add("batch size")
    return found


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
        wrong = problems(request)
        if wrong:
            assert isinstance(result, RequestError) and result.code == "INVALID_ARG", (wrong, result)
            assert any(word in str(result) for word in wrong), (wrong, str(result))
            continue
        assert not isinstance(result, RequestError), result
        rows = request["IDS"].shape[0]
        assert set(result) == {"OUT"} and result["OUT"].shape == (rows, 6)
        np.testing.assert_allclose(result["OUT"], request["IDS"] * request["SCALE"], rtol=1e-6)
    instance.release()  # the instance holds its last execution until told or the next execute
    del execution, results, result  # the last views of the outputs: their blocks go back now
    assert instance.pool.stats().allocated_bytes == 0
