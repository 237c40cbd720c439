"""Checks one request's inputs against the model's config before anything is gathered, so that a
bad request fails alone with a message that names the input and the problem; and what a client is
told of a failure that is not its own (the exception's type and message, never a traceback or a
path on the server)."""

from __future__ import annotations

import re

import numpy as np

from tidepool.errors import TidepoolError
from tidepool.sequences import SequenceError, Sequences
from tidepool.spec import Array, ModelSpec, TensorSpec, dims_match, shape_text

# A file path on the server: absolute, or three or more /-separated parts (as TorchScript names
# its code files); "tokens/s" is no path.
SERVER_PATH = re.compile(r"(?:(?<![\w.~-])/(?:[\w.~-]+/)*[\w.~-]+)|(?:[\w.~-]+/){2,}[\w.~-]+")


class RequestError(TidepoolError, ValueError):
    """A request the backend refuses; `code` is the Triton error code name to answer with."""

    def __init__(self, message: str, code: str = "INVALID_ARG") -> None:
        super().__init__(message)
        self.code = code


def _check_dims(spec: TensorSpec, shape: tuple[int, ...], batched: bool) -> None:
    sample_shape = shape[1:] if batched else shape
    expected = spec.dims
    wanted = shape_text(("batch", *spec.dims) if batched else spec.dims)
    if not dims_match(sample_shape, expected):
        raise RequestError(
            f"input {spec.name}: shape {shape_text(shape)} does not match the model's {wanted}"
        )


def _check_values(spec: TensorSpec, array: Array, allow_nonfinite: bool) -> None:
    if array.size == 0:
        return
    if array.dtype.kind == "f" and not allow_nonfinite:
        finite = np.isfinite(array)
        if not finite.all():
            bad = array[~finite].flat[0]
            count = int(array.size - np.count_nonzero(finite))
            raise RequestError(
                f"input {spec.name}: {count} value(s) are not finite (first: {bad}); NaN and Inf are rejected"
            )
    if spec.value_range is not None:
        low, high = array.min(), array.max()
        if low < spec.value_range.low or high > spec.value_range.high:
            outlier = low if low < spec.value_range.low else high
            raise RequestError(
                f"input {spec.name}: value {outlier} is outside the allowed range "
                f"[{spec.value_range.low:g}, {spec.value_range.high:g}]"
            )


def validate_request(inputs: dict[str, Array], model: ModelSpec, allow_nonfinite: bool = False) -> int:
    """Raise RequestError if `inputs` does not fit `model`; return the request's batch size."""
    declared = {spec.name for spec in model.inputs}
    unknown = sorted(set(inputs) - declared)
    if unknown:
        raise RequestError(
            f"unknown input(s) {', '.join(unknown)}; the model takes {', '.join(sorted(declared))}"
        )
    missing = [spec.name for spec in model.inputs if spec.name not in inputs]
    if missing:
        raise RequestError(f"missing input(s) {', '.join(missing)}")

    batch_size = 1
    for index, spec in enumerate(model.inputs):
        array = inputs[spec.name]
        if array.dtype != spec.dtype:
            raise RequestError(
                f"input {spec.name}: data type {array.dtype} does not match the model's "
                f"{spec.wire_type} ({spec.dtype})"
            )
        if model.batched:
            if array.ndim == 0:
                raise RequestError(f"input {spec.name}: a scalar has no batch dimension")
            if array.ndim != len(spec.dims) + 1:
                _check_dims(spec, array.shape, batched=True)  # raises, naming both shapes
            rows = array.shape[0]
            if rows < 1:
                raise RequestError(f"input {spec.name}: the batch is empty")
            if rows > model.max_batch_size:
                raise RequestError(
                    f"input {spec.name}: batch size {rows} is above the model's "
                    f"max_batch_size {model.max_batch_size}"
                )
            if index == 0:
                batch_size = rows
            elif rows != batch_size:
                raise RequestError(
                    f"input {spec.name}: batch size {rows} differs from {model.inputs[0].name}'s {batch_size}"
                )
        _check_dims(spec, array.shape, model.batched)
        _check_values(spec, array, allow_nonfinite)
    return batch_size


def sequence_length(inputs: dict[str, Array], model: ModelSpec, sequences: Sequences) -> int:
    """The request's length along its sequence inputs (after validate_request); RequestError where
    they disagree, one is empty, or it is over MAX_SEQUENCE_LENGTH."""
    try:
        return sequences.length(inputs, model.batched)
    except SequenceError as error:
        raise RequestError(str(error)) from None


def public_message(error: BaseException) -> str:
    """`Type: message` of an exception, for a client: a message that carries a traceback (as
    TorchScript's do) is cut to its last line, and paths on the server are left out."""
    text = str(error).strip()
    if "Traceback" in text or "\n" in text:
        lines = [line.strip() for line in text.splitlines() if line.strip()]
        text = lines[-1] if lines else ""
    text = SERVER_PATH.sub("<path>", text)
    name = type(error).__name__
    return text if text.startswith(name) or re.match(r"^\w+(Error|Exception): ", text) else f"{name}: {text}"
