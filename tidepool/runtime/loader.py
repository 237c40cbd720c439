"""Loads the torch model a config names, from inside the model's own directory only: a
TorchScript file (`TORCHSCRIPT`) or a Python factory `module:function` (`MODEL_FACTORY`), with
optional weights (`WEIGHTS`, a state dict read with `weights_only=True`: tensors, never code);
and converts it once to the precision it runs in (`PRECISION`)."""

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


def load_model(model_dir: Path | str, model: ModelSpec) -> torch.nn.Module:
    """Build the model's nn.Module in eval mode, as its config's parameters say."""
    model_dir = Path(model_dir)
    factory = param.MODEL_FACTORY.read(model.parameters)
    script = param.TORCHSCRIPT.read(model.parameters)
    if bool(factory) == bool(script):
        raise ConfigError(
            f"model {model.name}: set exactly one of the parameters MODEL_FACTORY "
            "('module:function' in the model directory) or TORCHSCRIPT (a file in it)"
        )
    if factory:
        module = _load_factory(model_dir, factory, model.name)
    else:
        assert script is not None
        path = resolve_inside(model_dir, script, "TORCHSCRIPT file")
        try:
            module = torch.jit.load(str(path), map_location="cpu")  # type: ignore[no-untyped-call]
        except Exception as exc:
            raise ModelLoadError(f"loading TorchScript {path} failed: {exc}") from exc
    weights = param.WEIGHTS.read(model.parameters)
    if weights:
        path = resolve_inside(model_dir, weights, "WEIGHTS file")
        try:
            state = torch.load(str(path), map_location="cpu", weights_only=True)
            module.load_state_dict(state)
        except Exception as exc:
            raise ModelLoadError(f"loading WEIGHTS {path} failed: {exc}") from exc
    return module.eval()


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
