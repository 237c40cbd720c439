import numpy as np
import pytest

from tests.unit.specs import tokens_spec
from tidepool.runtime.validation import RequestError, validate_request

SPEC = tokens_spec()


def good(batch: int = 2) -> dict[str, np.ndarray]:
    return {
        "IDS": np.arange(batch * 6, dtype=np.int32).reshape(batch, 6) % 100,
        "SCALE": np.ones((batch, 1), dtype=np.float32),
    }


def test_a_good_request_gives_its_batch_size():
    assert validate_request(good(3), SPEC) == 3


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda r: r.update(IDS=r["IDS"].astype(np.int64)), "input IDS: data type int64 does not match"),
        (
            lambda r: r.update(IDS=r["IDS"][:, :5]),
            "input IDS: shape [2, 5] does not match the model's [batch, 6]",
        ),
        (lambda r: r.update(IDS=r["IDS"][0]), "input IDS: shape [6] does not match"),
        (lambda r: r.pop("SCALE"), "missing input(s) SCALE"),
        (lambda r: r.update(EXTRA=np.zeros(1, np.float32)), "unknown input(s) EXTRA"),
        (
            lambda r: r["IDS"].__setitem__((0, 0), 100),
            "input IDS: value 100 is outside the allowed range [0, 99]",
        ),
        (lambda r: r["IDS"].__setitem__((1, 2), -1), "input IDS: value -1 is outside"),
        (lambda r: r["SCALE"].__setitem__((0, 0), np.nan), "input SCALE: 1 value(s) are not finite"),
        (lambda r: r["SCALE"].__setitem__((1, 0), np.inf), "not finite (first: inf)"),
        (
            lambda r: r.update(SCALE=np.ones((3, 1), np.float32)),
            "input SCALE: batch size 3 differs from IDS's 2",
        ),
        (lambda r: r.update(IDS=np.zeros((0, 6), np.int32)), "input IDS: the batch is empty"),
        (
            lambda r: r.update(IDS=np.zeros((5, 6), np.int32)),
            "batch size 5 is above the model's max_batch_size 4",
        ),
        (lambda r: r.update(IDS=np.int32(3)), "input IDS: a scalar has no batch dimension"),
    ],
)
def test_each_kind_of_bad_request_is_named(change, message):
    request = good()
    change(request)
    if isinstance(request.get("IDS"), np.generic):
        request["IDS"] = np.asarray(request["IDS"])
    with pytest.raises(RequestError) as caught:
        validate_request(request, SPEC)
    assert message in str(caught.value)
    assert caught.value.code == "INVALID_ARG"


def test_nonfinite_values_are_served_when_the_config_allows_them():
    request = good()
    request["SCALE"][0, 0] = np.nan
    assert validate_request(request, SPEC, allow_nonfinite=True) == 2
