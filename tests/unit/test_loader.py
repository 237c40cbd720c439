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
    with pytest.raises(ModelLoadError, match="loading WEIGHTS evil.pt failed: .*[Ww]eights only load failed"):
        load_model(model_dir, spec_with(MODEL_FACTORY="lin:build", WEIGHTS="evil.pt"))


def linear_dir(tmp_path):
    model_dir = tmp_path / "m"
    model_dir.mkdir(exist_ok=True)
    (model_dir / "lin.py").write_text(
        "import torch\ndef build():\n    torch.manual_seed(1)\n    return torch.nn.Linear(2, 2)\n"
    )
    return model_dir


def test_safetensors_weights_load_and_a_mismatched_file_is_refused_in_one_line(tmp_path):
    from safetensors.torch import save_file

    model_dir = linear_dir(tmp_path)
    trained = torch.nn.Linear(2, 2)
    save_file(trained.state_dict(), model_dir / "weights.safetensors")
    module = load_model(model_dir, spec_with(MODEL_FACTORY="lin:build", WEIGHTS="weights.safetensors"))
    assert torch.equal(module.weight, trained.weight) and not module.training
    save_file({"weight": torch.zeros(3, 2), "extra": torch.zeros(1)}, model_dir / "other.safetensors")
    with pytest.raises(ModelLoadError) as refused:
        load_model(model_dir, spec_with(MODEL_FACTORY="lin:build", WEIGHTS="other.safetensors"))
    message = str(refused.value)
    assert "\n" not in message
    assert message == (
        "WEIGHTS other.safetensors does not match the model: keys 1 missing (bias); 1 unexpected (extra); "
        "1 of another shape (weight [3, 2] where the model has [2, 2])"
    )


def exported(model_dir, batch_dynamic: bool, inputs: int = 2) -> None:
    class Scale(torch.nn.Module):
        def forward(self, ids, scale):
            return ids.float() * scale

    class One(torch.nn.Module):
        def forward(self, ids):
            return ids.float()

    examples = (torch.ones(2, 6, dtype=torch.int32), torch.ones(2, 1))[:inputs]
    names = ("ids", "scale")[:inputs]
    batch = torch.export.Dim("batch", min=1, max=64)
    dynamic = {name: {0: batch} for name in names} if batch_dynamic else None
    program = torch.export.export(
        (Scale() if inputs == 2 else One()).eval(), examples, dynamic_shapes=dynamic
    )
    torch.export.save(program, model_dir / "model.pt2")


def test_a_torch_export_program_loads_and_serves_any_batch(tmp_path):
    model_dir = tiny_model_dir(tmp_path)
    exported(model_dir, batch_dynamic=True)
    module = load_model(model_dir, spec_with(EXPORTED_PROGRAM="model.pt2"))
    out = module(torch.full((3, 6), 2, dtype=torch.int32), torch.full((3, 1), 0.5))
    assert out.shape == (3, 6) and float(out[0, 0]) == 1.0


@pytest.mark.parametrize(
    ("dynamic", "inputs", "refused"),
    [
        (False, 2, "EXPORTED_PROGRAM model.pt2 was exported with a fixed batch of 2 for IDS; "
                   "max_batch_size 4 needs its first dimension dynamic"),
        (True, 1, "EXPORTED_PROGRAM model.pt2 takes 1 input(s), the config declares 2 (IDS, SCALE)"),
    ],
)  # fmt: skip
def test_a_program_that_does_not_match_the_config_is_refused_in_one_line(tmp_path, dynamic, inputs, refused):
    model_dir = tiny_model_dir(tmp_path)
    exported(model_dir, batch_dynamic=dynamic, inputs=inputs)
    with pytest.raises(ModelLoadError) as caught:
        load_model(model_dir, spec_with(EXPORTED_PROGRAM="model.pt2"))
    assert str(caught.value).startswith(refused) and "\n" not in str(caught.value)


def test_a_variable_length_input_is_planned_at_its_declared_shape():
    config = dict(TOKENS_CONFIG)
    config["input"] = [{"name": "IDS", "data_type": "TYPE_INT32", "dims": [-1]}, TOKENS_CONFIG["input"][1]]
    config["parameters"] = {
        "MODEL_FACTORY": {"string_value": "tiny:build"},
        "shape.IDS": {"string_value": "128"},
    }
    spec = parse_model_config(config)
    assert spec.inputs[0].shape(4) == (4, 128) and spec.inputs[1].shape(4) == (4, 1)
    config["parameters"]["shape.IDS"] = {"string_value": "3,128"}
    with pytest.raises(ConfigError, match=r"shape.IDS: \[3, 128\] does not fit the declared dims \[-1\]"):
        parse_model_config(config)
    config["parameters"]["shape.IDS"] = {"string_value": "0"}
    with pytest.raises(ConfigError, match="sizes must be 1 or more"):
        parse_model_config(config)
