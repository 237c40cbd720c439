import os

import pytest
import torch

from tests.unit.specs import TOKENS_CONFIG, tiny_model_dir
from tidepool.runtime.loader import ModelLoadError, load_model
from tidepool.spec import ConfigError, parse_model_config


def spec_with(**parameters):
    config = dict(TOKENS_CONFIG)
    config["parameters"] = {k: {"string_value": v} for k, v in parameters.items()}
    return parse_model_config(config)


def test_a_factory_in_the_model_directory_loads_in_eval_mode(tmp_path):
    module = load_model(tiny_model_dir(tmp_path), spec_with(MODEL_FACTORY="tiny:build"))
    assert isinstance(module, torch.nn.Module) and not module.training


def test_a_torchscript_file_in_the_model_directory_loads(tmp_path):
    model_dir = tiny_model_dir(tmp_path)
    torch.jit.script(torch.nn.Linear(2, 2)).save(str(model_dir / "model.pt"))
    module = load_model(model_dir, spec_with(TORCHSCRIPT="model.pt"))
    assert module(torch.ones(1, 2)).shape == (1, 2)


@pytest.mark.parametrize("path", ["../outside.pt", "/etc/passwd", "sub/../../outside.pt"])
def test_torchscript_outside_the_model_directory_is_refused(tmp_path, path):
    (tmp_path / "outside.pt").write_text("x")
    with pytest.raises(ModelLoadError, match="outside the model directory|inside the model directory"):
        load_model(tiny_model_dir(tmp_path), spec_with(TORCHSCRIPT=path))


def test_a_factory_reached_through_a_link_to_outside_is_refused(tmp_path):
    (tmp_path / "evil.py").write_text("def build():\n    raise SystemExit('ran outside code')\n")
    model_dir = tiny_model_dir(tmp_path)
    os.symlink(tmp_path / "evil.py", model_dir / "linked.py")
    with pytest.raises(ModelLoadError, match="leads outside the model directory"):
        load_model(model_dir, spec_with(MODEL_FACTORY="linked:build"))


@pytest.mark.parametrize("factory", ["tiny", "../tiny:build", "tiny:", "os.path:join;"])
def test_a_malformed_factory_is_a_config_error(tmp_path, factory):
    with pytest.raises(ConfigError, match="MODEL_FACTORY"):
        load_model(tiny_model_dir(tmp_path), spec_with(MODEL_FACTORY=factory))


def test_missing_function_and_wrong_return_type_are_named(tmp_path):
    model_dir = tiny_model_dir(tmp_path)
    with pytest.raises(ModelLoadError, match="no function 'nope'"):
        load_model(model_dir, spec_with(MODEL_FACTORY="tiny:nope"))
    (model_dir / "bad.py").write_text("def build():\n    return 42\n")
    with pytest.raises(ModelLoadError, match="returned int, expected a torch.nn.Module"):
        load_model(model_dir, spec_with(MODEL_FACTORY="bad:build"))


def test_exactly_one_source_must_be_named(tmp_path):
    with pytest.raises(ConfigError, match="exactly one of"):
        load_model(tiny_model_dir(tmp_path), spec_with())


def test_weights_load_as_tensors_only(tmp_path):
    model_dir = tmp_path / "m"
    model_dir.mkdir()
    (model_dir / "lin.py").write_text(
        "import torch\ndef build():\n    torch.manual_seed(1)\n    return torch.nn.Linear(2, 2)\n"
    )
    trained = torch.nn.Linear(2, 2)
    torch.save(trained.state_dict(), model_dir / "weights.pt")
    module = load_model(model_dir, spec_with(MODEL_FACTORY="lin:build", WEIGHTS="weights.pt"))
    assert torch.equal(module.weight, trained.weight)


class Payload:
    def __reduce__(self):
        return (os.system, ("echo pwned > /dev/null",))


def test_weights_that_carry_code_are_refused(tmp_path):
    model_dir = tmp_path / "m"
    model_dir.mkdir()
    (model_dir / "lin.py").write_text("import torch\ndef build():\n    return torch.nn.Linear(2, 2)\n")
    torch.save({"weight": Payload()}, model_dir / "evil.pt")
    with pytest.raises(
        ModelLoadError, match="loading WEIGHTS .*evil.pt failed: .*[Ww]eights only load failed"
    ):
        load_model(model_dir, spec_with(MODEL_FACTORY="lin:build", WEIGHTS="evil.pt"))
