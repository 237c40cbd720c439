"""Loads the torch model a config names, from inside the model's own directory only: a Python
factory `module:function` (`MODEL_FACTORY`), a TorchScript file (`TORCHSCRIPT`) or a torch.export
program (`EXPORTED_PROGRAM`), with optional weights (`WEIGHTS`: safetensors, or a state dict read
with `weights_only=True`: tensors, never code), each refused in one line where it does not match
the config; and converts it once to the precision it runs in (`PRECISION`)."""

from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path

import torch

from tidepool import parameters as param
from tidepool.errors import TidepoolError
from tidepool.spec import ConfigError, ModelSpec

_MODULE_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$")


class ModelLoadError(TidepoolError):
    """The model named by the config could not be loaded; the message says why."""


def resolve_inside(model_dir: Path, relative: str, what: str) -> Path:
    """The file `relative` under `model_dir`, refusing anything that leads outside it."""
    root = model_dir.resolve()
    if Path(relative).is_absolute():
        raise ModelLoadError(f"{what} {relative!r} must be a path inside the model directory {root}")
    path = (root / relative).resolve()
    if not path.is_relative_to(root):
        raise ModelLoadError(f"{what} {relative!r} leads outside the model directory {root}")
    if not path.is_file():
        raise ModelLoadError(f"{what} {relative!r}: no such file in {root}")
    return path


def _load_factory(model_dir: Path, factory: str, model_name: str) -> torch.nn.Module:
    module_name, sep, function_name = factory.partition(":")
    if not sep or not _MODULE_NAME.match(module_name) or not function_name.isidentifier():
        raise ConfigError(f"parameter MODEL_FACTORY: expected 'module:function', got {factory!r}")
    path = resolve_inside(model_dir, module_name.replace(".", "/") + ".py", "MODEL_FACTORY module")
    # A name of its own per model, so two models' `model.py` files never shadow each other.
    unique = f"tidepool_models.{re.sub(r'[^A-Za-z0-9_]', '_', model_name)}.{module_name}"
    spec = importlib.util.spec_from_file_location(unique, path)
    if spec is None or spec.loader is None:
        raise ModelLoadError(f"cannot import {path}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[unique] = module
    try:
        spec.loader.exec_module(module)
    except Exception as exc:
        del sys.modules[unique]
        raise ModelLoadError(f"importing {path} failed: {exc!r}") from exc
    build = getattr(module, function_name, None)
    if not callable(build):
        raise ModelLoadError(f"{path} has no function {function_name!r}")
    model = build()
    if not isinstance(model, torch.nn.Module):
        raise ModelLoadError(f"{factory} returned {type(model).__name__}, expected a torch.nn.Module")
    return model


def _load_exported(path: Path, model: ModelSpec) -> torch.nn.Module:
    """A torch.export program as a module, refused where its inputs do not match the config."""
    try:
        program = torch.export.load(str(path))
    except Exception as exc:
        raise ModelLoadError(f"loading EXPORTED_PROGRAM {path.name} failed: {first_line(exc)}") from exc
    names = list(program.graph_signature.user_inputs)
    if len(names) != len(model.inputs):
        declared = ", ".join(spec.name for spec in model.inputs)
        raise ModelLoadError(
            f"EXPORTED_PROGRAM {path.name} takes {len(names)} input(s), the config declares "
            f"{len(model.inputs)} ({declared})"
        )
    placeholders = {node.name: node for node in program.graph.nodes if node.op == "placeholder"}
    for name, spec in zip(names, model.inputs, strict=True):
        shape = placeholders[name].meta["val"].shape
        if model.max_batch_size > 1 and shape and isinstance(shape[0], int):
            raise ModelLoadError(
                f"EXPORTED_PROGRAM {path.name} was exported with a fixed batch of {shape[0]} for "
                f"{spec.name}; max_batch_size {model.max_batch_size} needs its first dimension dynamic "
                "(torch.export.export(..., dynamic_shapes=... torch.export.Dim('batch') ...))"
            )
    return program.module()  # its graph is what it runs: no train or eval mode to set


def _state_dict(path: Path) -> dict[str, torch.Tensor]:
    if path.suffix == ".safetensors":
        from safetensors.torch import load_file

        return load_file(str(path))
    state = torch.load(str(path), map_location="cpu", weights_only=True)
    if not isinstance(state, dict):
        raise ModelLoadError(f"WEIGHTS {path.name} holds a {type(state).__name__}, not a state dict")
    return state


def _load_weights(module: torch.nn.Module, path: Path) -> None:
    """Weights into `module`, refused in one line where their keys or shapes do not match it."""
    try:
        state = _state_dict(path)
    except ModelLoadError:
        raise
    except Exception as exc:
        raise ModelLoadError(f"loading WEIGHTS {path.name} failed: {first_line(exc)}") from exc
    wanted = module.state_dict()
    missing = sorted(set(wanted) - set(state))
    unexpected = sorted(set(state) - set(wanted))
    reshaped = [f"{k} {list(state[k].shape)} where the model has {list(wanted[k].shape)}"
                for k in sorted(set(state) & set(wanted)) if state[k].shape != wanted[k].shape]  # fmt: skip
    kinds = (("missing", missing), ("unexpected", unexpected), ("of another shape", reshaped))
    problems = [f"{len(found)} {what} ({', '.join(found[:3])}{', ...' if len(found) > 3 else ''})"
                for what, found in kinds if found]  # fmt: skip
    if problems:
        raise ModelLoadError(f"WEIGHTS {path.name} does not match the model: keys {'; '.join(problems)}")
    module.load_state_dict(state)


def first_line(exc: BaseException) -> str:
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0]


def load_model(model_dir: Path | str, model: ModelSpec) -> torch.nn.Module:
    """Build the model's nn.Module in eval mode, as its config's parameters say."""
    model_dir = Path(model_dir)
    factory = param.MODEL_FACTORY.read(model.parameters)
    script = param.TORCHSCRIPT.read(model.parameters)
    exported = param.EXPORTED_PROGRAM.read(model.parameters)
    if sum(map(bool, (factory, script, exported))) != 1:
        raise ConfigError(
            f"model {model.name}: set exactly one of the parameters MODEL_FACTORY ('module:function' in "
            "the model directory), TORCHSCRIPT or EXPORTED_PROGRAM (a file in it)"
        )
    if factory:
        module = _load_factory(model_dir, factory, model.name)
    elif script:
        path = resolve_inside(model_dir, script, "TORCHSCRIPT file")
        try:
            module = torch.jit.load(str(path), map_location="cpu")  # type: ignore[no-untyped-call]
        except Exception as exc:
            raise ModelLoadError(f"loading TorchScript {path} failed: {exc}") from exc
    else:
        assert exported is not None
        module = _load_exported(resolve_inside(model_dir, exported, "EXPORTED_PROGRAM file"), model)
    weights = param.WEIGHTS.read(model.parameters)
    if weights:
        _load_weights(module, resolve_inside(model_dir, weights, "WEIGHTS file"))
    return module if exported else module.eval()


def apply_precision(module: torch.nn.Module, precision: str) -> torch.nn.Module:
    """The module in the precision it will run in (weights converted once, at load)."""
    if precision == "bf16":
        return module.to(torch.bfloat16)
    if precision == "fp16":
        return module.to(torch.float16)
    if precision == "int8":
        quantized: torch.nn.Module = torch.ao.quantization.quantize_dynamic(  # type: ignore[no-untyped-call]
            module, {torch.nn.Linear}, dtype=torch.qint8
        )
        return quantized
    return module
