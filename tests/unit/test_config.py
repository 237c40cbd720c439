import pytest

from tests.unit.specs import TOKENS_CONFIG, tokens_spec
from tidepool.runtime.instance import InstanceSettings
from tidepool.spec import ConfigError, parse_model_config


def test_specs_carry_dtype_dims_and_declared_range():
    spec = tokens_spec()
    ids = spec.input("IDS")
    assert ids is not None and ids.dtype.name == "int32" and ids.dims == (6,)
    assert (ids.value_range.low, ids.value_range.high) == (0, 99)
    assert spec.input("SCALE").value_range is None
    assert spec.batched and spec.max_batch_size == 4


@pytest.mark.parametrize(
    ("parameters", "message"),
    [
        ({"range.IDS": "5"}, "expected 'LOW,HIGH'"),
        ({"range.IDS": "9,1"}, "LOW 9.0 is above HIGH 1.0"),
        ({"TORCH_NUM_THREADS": "many"}, "TORCH_NUM_THREADS: expected an integer"),
        ({"TORCH_NUM_THREADS": "0"}, "TORCH_NUM_THREADS: must be at least 1"),
    ],
)
def test_bad_parameters_are_named(parameters, message):
    config = dict(TOKENS_CONFIG)
    config["parameters"] = {k: {"string_value": v} for k, v in parameters.items()}
    with pytest.raises(ConfigError, match=message):
        InstanceSettings.from_spec(parse_model_config(config))


def test_unsupported_dtype_is_named():
    config = dict(TOKENS_CONFIG, input=[{"name": "S", "data_type": "TYPE_STRING", "dims": [1]}])
    with pytest.raises(ConfigError, match="input S: data_type TYPE_STRING is not supported"):
        parse_model_config(config)
