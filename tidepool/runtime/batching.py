"""Gathers the valid requests of one execution into one batch and splits the outputs back per
request. Where the batch lives is the caller's choice (`allocate`), so a pool can own it."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from tidepool.spec import Array, DType, ModelSpec

# Returns an uninitialised array of this shape and dtype; every element is written by gather.
Allocate = Callable[[tuple[int, ...], DType], Array]


def numpy_allocate(shape: tuple[int, ...], dtype: DType) -> Array:
    return np.empty(shape, dtype=dtype)


def gather(
    requests: Sequence[dict[str, Array]],
    batch_sizes: Sequence[int],
    model: ModelSpec,
    allocate: Allocate = numpy_allocate,
) -> dict[str, Array]:
    """Copy each request's rows into one array per input, in request order, with no concatenate.

    Only for batched models (max_batch_size > 0): a model without a batch dimension runs each
    request on its own."""
    total = sum(batch_sizes)
    batch: dict[str, Array] = {}
    for spec in model.inputs:
        sample_shape = requests[0][spec.name].shape[1:]
        out = allocate((total, *sample_shape), spec.dtype)
        row = 0
        for request, rows in zip(requests, batch_sizes, strict=True):
            out[row : row + rows] = request[spec.name]
            row += rows
        batch[spec.name] = out
    return batch


def split(outputs: dict[str, Array], batch_sizes: Sequence[int]) -> list[dict[str, Array]]:
    """Views of each request's rows of every output (no copy)."""
    per_request: list[dict[str, Array]] = []
    row = 0
    for rows in batch_sizes:
        per_request.append({name: array[row : row + rows] for name, array in outputs.items()})
        row += rows
    return per_request


def dummy_inputs(model: ModelSpec, batch: int) -> dict[str, Array]:
    """A valid batch of `batch` rows (the lowest allowed value everywhere), for warm-up."""
    inputs = {}
    for spec in model.inputs:
        shape = spec.shape(batch if model.batched else None)
        low = spec.value_range.low if spec.value_range is not None else 0
        inputs[spec.name] = np.full(shape, low, dtype=spec.dtype)
    return inputs
