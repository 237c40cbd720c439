"""The table of backend parameters: the one place a parameter is declared, read and written."""

from __future__ import annotations

import pytest

from tidepool import parameters as param
from tidepool.configfile import read_config
from tidepool.spec import ConfigError
from tidepool.testing import MODEL_REPOSITORY


def test_the_table_is_rewritten_in_place(tmp_path):
    readme = tmp_path / "README.md"
    readme.write_text(
        "before\n| parameter | meaning | default |\n| old | row |\n" + param.RANGE_ROW + "\nafter\n"
    )
    assert param.rewrite_table(readme)
    assert readme.read_text() == "before\n" + param.markdown_table() + "\nafter\n"
    assert not param.rewrite_table(readme)  # already current


@pytest.mark.parametrize("parameter", param.ALL, ids=lambda p: p.name)
def test_a_default_reads_back_as_written(parameter):
    assert parameter.read({}) == parameter.default  # unset
    assert parameter.read({parameter.name: "  "}) == parameter.default  # blank
    if parameter.default is not None:
        assert parameter.read({parameter.name: parameter.write(parameter.default)}) == parameter.default


@pytest.mark.parametrize(
    ("parameter", "text", "message"),
    [
        (param.ELASTIC_THREADS, "yes", "parameter ELASTIC_THREADS: expected one of true, false, got 'yes'"),
        (param.TORCH_NUM_THREADS, "0", "parameter TORCH_NUM_THREADS: must be at least 1, got 0"),
        (param.TORCH_NUM_THREADS, "two", "parameter TORCH_NUM_THREADS: expected an integer, got 'two'"),
        (param.POOL_LIMIT_BYTES, "lots", "parameter POOL_LIMIT_BYTES: expected a size like 512MiB"),
        (param.POOL_FRAGMENTATION_THRESHOLD, "1.5", "POOL_FRAGMENTATION_THRESHOLD: must be between"),
        (param.POOL_WARMUP_BATCH_SIZES, "1,x", "parameter POOL_WARMUP_BATCH_SIZES: expected e.g."),
        (param.PRECISION, "fp64", "parameter PRECISION: expected one of fp32, bf16, fp16, int8"),
    ],
)
def test_a_bad_value_is_refused_with_the_parameters_name(parameter, text, message):
    with pytest.raises(ConfigError, match=message.replace("(", r"\(")):
        parameter.read({parameter.name: text})


def test_values_are_read_as_users_write_them():
    assert param.ELASTIC_THREADS.read({"ELASTIC_THREADS": "True"}) is True
    assert param.POOL.read({"POOL": "OFF"}) is False
    assert param.POOL_LIMIT_BYTES.read({"POOL_LIMIT_BYTES": "2GiB"}) == 2 * 2**30
    assert param.POOL_WARMUP_BATCH_SIZES.read({"POOL_WARMUP_BATCH_SIZES": "1, 8"}) == (1, 8)


def test_the_planned_configs_hold_only_parameters_of_the_table():
    known = {p.name for p in param.ALL}
    for model in ("encoder", "convnet"):
        config = read_config(MODEL_REPOSITORY / model / "config.pbtxt")
        written = set(config.parameters) - {key for key in config.parameters if key.startswith("range.")}
        assert written <= known, written - known
