"""Inputs for any model: valid random ones built from its config (dtype, shape, the value range
the config declares), or ones read from a .npz or JSON file."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from tidepool.errors import TidepoolError
from tidepool.spec import ModelSpec, TensorSpec


class InputFileError(TidepoolError):
    """An input file that cannot give the model's inputs; says which file and what is missing."""


def random_tensor(spec: TensorSpec, batch: int | None, rng: np.random.Generator) -> np.ndarray:
    """`batch` rows of valid values (no batch dimension when `batch` is None); -1 dims become 1."""
    shape = spec.shape(batch)
    dtype = spec.dtype
    if dtype.kind == "b":
        return rng.integers(0, 2, size=shape).astype(dtype)
    if dtype.kind in "iu":
        info = np.iinfo(dtype)
        low, high = info.min, info.max
        if spec.value_range is not None:
            low, high = int(spec.value_range.low), int(spec.value_range.high)
        else:
            low, high = max(low, -100), min(high, 100)
        return rng.integers(low, high, size=shape, endpoint=True, dtype=dtype)
    values = rng.standard_normal(size=shape)
    if spec.value_range is not None:
        values = rng.uniform(spec.value_range.low, spec.value_range.high, size=shape)
    return values.astype(dtype)


def random_inputs(model: ModelSpec, batch: int = 1, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    rows = batch if model.batched else None
    return {spec.name: random_tensor(spec, rows, rng) for spec in model.inputs}


def load_inputs(path: str | Path, model: ModelSpec) -> dict[str, np.ndarray]:
    """Inputs from a .npz file (arrays by input name) or a JSON file ({"NAME": nested lists}),
    cast to the model's dtypes and checked to name every input."""
    path = Path(path)
    if path.suffix == ".npz":
        with np.load(path, allow_pickle=False) as data:
            raw = {name: data[name] for name in data.files}
    elif path.suffix == ".json":
        raw = json.loads(path.read_text())
        if not isinstance(raw, dict):
            raise InputFileError(f"{path}: expected a JSON object of input name -> nested list")
    else:
        raise InputFileError(f"{path}: input files must be .npz or .json")
    missing = [spec.name for spec in model.inputs if spec.name not in raw]
    if missing:
        raise InputFileError(f"{path}: no data for input(s) {', '.join(missing)}")
    return {spec.name: np.asarray(raw[spec.name], dtype=spec.dtype) for spec in model.inputs}
