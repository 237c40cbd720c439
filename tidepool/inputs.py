"""Inputs for any model: valid random ones built from its config (dtype, shape, the value range
the config declares), or ones read from a .npz or JSON file."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from tidepool.errors import TidepoolError
from tidepool.spec import ModelSpec, TensorSpec, shape_text

UNDECLARED_INT_BOUND = 100  # integers without a declared range are drawn from [-100, 100]


class InputFileError(TidepoolError):
    """An input file that cannot give the model's inputs; says which file and what is missing."""


def random_tensor(spec: TensorSpec, batch: int | None, rng: np.random.Generator) -> np.ndarray:
    """`batch` rows of valid values (no batch dimension when `batch` is None); -1 dims become 1."""
    shape = spec.shape(batch)
    dtype = spec.dtype
    if dtype.kind == "b":
        return rng.integers(0, 2, size=shape).astype(dtype)
    if dtype.kind in "iu":
        low, high = integer_bounds(spec)
        return rng.integers(low, high, size=shape, endpoint=True, dtype=dtype)
    values = rng.standard_normal(size=shape)
    if spec.value_range is not None:
        values = rng.uniform(spec.value_range.low, spec.value_range.high, size=shape)
    return values.astype(dtype)


def integer_bounds(spec: TensorSpec) -> tuple[int, int]:
    """The inclusive bounds random values of an integer input are drawn from: its declared range,
    else [-100, 100] within its type."""
    if spec.value_range is not None:
        return int(spec.value_range.low), int(spec.value_range.high)
    info = np.iinfo(spec.dtype)
    return max(int(info.min), -UNDECLARED_INT_BOUND), min(int(info.max), UNDECLARED_INT_BOUND)


def describe_generated(model: ModelSpec) -> str:
    """What generated inputs were and the two ways to make them meaningful, for a message that
    follows a model's failure on them."""
    drawn = []
    for spec in model.inputs:
        shape = shape_text(spec.shape(1 if model.batched else None))
        if spec.dtype.kind in "iu":
            low, high = integer_bounds(spec)
            values = f"integers in [{low}, {high}]"
        elif spec.dtype.kind == "b":
            values = "booleans"
        elif spec.value_range is not None:
            values = f"uniform in [{spec.value_range.low:g}, {spec.value_range.high:g}]"
        else:
            values = "standard normal values"
        source = f"range.{spec.name}" if spec.value_range is not None else f"no range.{spec.name} declared"
        if spec.variable and spec.planned_dims is None:
            source += f"; its -1 dims at 1, no shape.{spec.name} declared"
        drawn.append(f"{spec.name} {spec.wire_type} {shape}: {values} ({source})")
    return (
        "the inputs were generated from the config: " + "; ".join(drawn) + ". If the model needs other "
        'values, declare each input\'s range in config.pbtxt (parameters { key: "range.NAME" value { '
        'string_value: "LOW,HIGH" } }), or pass real samples with --inputs FILE (.npz or .json)'
    )


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


def load_requests(path: str | Path, model: ModelSpec) -> list[dict[str, np.ndarray]]:
    """Requests from a file, for the load tools and the planner:
    - a JSON list of per-request objects, {"NAME": nested list}, each with or without its batch
      dimension (text traffic: each request of its own length);
    - an .npz with a `lengths` array beside the inputs: row i cut back to lengths[i] along each
      variable input's first -1 dim (rows padded to one length, as a tokenizer writes them);
    - otherwise (load_inputs) one request of all the file's rows."""
    path = Path(path)
    if path.suffix == ".json":
        raw = json.loads(path.read_text())
        if isinstance(raw, list):
            if not raw or not all(isinstance(item, dict) for item in raw):
                raise InputFileError(
                    f"{path}: a JSON list must hold one object per request, input name -> values"
                )
            return [_one_request(item, model, f"{path}: request {i}") for i, item in enumerate(raw)]
    if path.suffix == ".npz":
        with np.load(path, allow_pickle=False) as data:
            if "lengths" in data.files:
                return _cut_rows({name: data[name] for name in data.files}, model, path)
    return [load_inputs(path, model)]


def _one_request(item: dict, model: ModelSpec, where: str) -> dict[str, np.ndarray]:
    missing = [spec.name for spec in model.inputs if spec.name not in item]
    if missing:
        raise InputFileError(f"{where}: no data for input(s) {', '.join(missing)}")
    request = {}
    for spec in model.inputs:
        array = np.asarray(item[spec.name], dtype=spec.dtype)
        if model.batched and array.ndim == len(spec.dims):
            array = array[np.newaxis]  # one request of one row
        request[spec.name] = array
    return request


def _cut_rows(data: dict[str, np.ndarray], model: ModelSpec, path: Path) -> list[dict[str, np.ndarray]]:
    lengths = data.pop("lengths").astype(int).ravel()
    missing = [spec.name for spec in model.inputs if spec.name not in data]
    if missing:
        raise InputFileError(f"{path}: no data for input(s) {', '.join(missing)}")
    requests = []
    for row, length in enumerate(lengths):
        if length < 1:
            raise InputFileError(
                f"{path}: lengths[{row}] is {length}; every request needs at least one token"
            )
        request = {}
        for spec in model.inputs:
            array = np.asarray(data[spec.name][row : row + 1], dtype=spec.dtype)
            if spec.variable:
                axis = 1 + spec.dims.index(-1)
                if length > array.shape[axis]:
                    raise InputFileError(
                        f"{path}: lengths[{row}] is {length}, but {spec.name} holds "
                        f"{array.shape[axis]} positions"
                    )
                array = np.ascontiguousarray(np.take(array, range(length), axis=axis))
            request[spec.name] = array if model.batched else array[0]
        requests.append(request)
    return requests
