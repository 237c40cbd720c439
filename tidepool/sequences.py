"""Variable-length inputs as text models take them: which inputs share a sequence axis, a
request's length along it (checked: equal across those inputs, not empty, within the declared
maximum), the bucket a pass of several lengths is padded to, and the length mix traffic has
(`LENGTH_MIX`, `--lengths`), drawn from by the load tools and planned for. Numpy only."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from functools import cached_property

import numpy as np

from tidepool import parameters as param
from tidepool.errors import TidepoolError
from tidepool.inputs import random_inputs
from tidepool.spec import Array, ConfigError, LengthMix, ModelSpec, TensorSpec


class SequenceError(TidepoolError, ValueError):
    """A request whose sequence inputs cannot be served: lengths that differ, an empty sequence,
    or one over the maximum length. The message names the inputs and the limit."""


@dataclass(frozen=True)
class Sequences:
    """A model's sequence inputs and how requests of different lengths share its passes."""

    inputs: tuple[TensorSpec, ...]  # the inputs that share the sequence axis
    axes: tuple[int, ...]  # per input, the axis of its sample (no batch dimension) that is the length
    max_length: int | None
    bucket: int  # a pass of several lengths is padded to a multiple of this (capped at max_length)
    max_batch_tokens: int | None  # padded tokens (rows x padded length) one pass may take
    pass_cost_tokens: int  # a pass's own cost, in padded tokens (see runtime/lengths.py)
    grouping: str  # auto, pad or exact (LENGTH_GROUPING)
    mix: LengthMix | None  # the mix traffic has, where the config declares one

    @classmethod
    def of(cls, model: ModelSpec) -> Sequences | None:
        """The model's sequence inputs (SEQUENCE_INPUTS, else every input with a -1 dim), or None
        where it has none."""
        given = model.parameters
        named = param.SEQUENCE_INPUTS.read(given)
        if named is None:
            inputs = [spec for spec in model.inputs if spec.variable]
        else:
            unknown = [name for name in named if model.input(name) is None]
            if unknown:
                raise ConfigError(f"parameter SEQUENCE_INPUTS names no input called {', '.join(unknown)}")
            inputs = [spec for spec in model.inputs if spec.name in named]
            fixed = [spec.name for spec in inputs if not spec.variable]
            if fixed:
                raise ConfigError(
                    f"parameter SEQUENCE_INPUTS: {', '.join(fixed)} has no -1 dim to be a length"
                )
        if not inputs:
            return None
        return cls(
            inputs=tuple(inputs),
            axes=tuple(spec.dims.index(-1) for spec in inputs),
            max_length=param.MAX_SEQUENCE_LENGTH.read(given),
            bucket=param.LENGTH_BUCKET.read(given),
            max_batch_tokens=param.MAX_BATCH_TOKENS.read(given),
            pass_cost_tokens=param.PASS_COST_TOKENS.read(given),
            grouping=param.LENGTH_GROUPING.read(given),
            mix=param.LENGTH_MIX.read(given),
        )

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(spec.name for spec in self.inputs)

    @cached_property
    def axis_of(self) -> dict[str, int]:
        """Sequence input -> its length's axis (in its sample, no batch dimension)."""
        return dict(zip(self.names, self.axes, strict=True))

    def length(self, inputs: Mapping[str, Array], batched: bool) -> int:
        """The request's sequence length; SequenceError where its sequence inputs disagree, one is
        empty, or it is over the maximum."""
        cut = 1 if batched else 0
        found = [
            (spec.name, inputs[spec.name].shape[cut + axis])
            for spec, axis in zip(self.inputs, self.axes, strict=True)
        ]
        lengths = {length for _, length in found}
        if len(lengths) > 1:
            listed = ", ".join(f"{name} {length}" for name, length in found)
            raise SequenceError(
                f"inputs {', '.join(self.names)} share the sequence axis and must have one length; "
                f"got {listed}"
            )
        length = int(lengths.pop())
        if length == 0:
            raise SequenceError(f"input {found[0][0]}: an empty sequence (length 0); send at least one token")
        if self.max_length is not None and length > self.max_length:
            raise SequenceError(
                f"input {found[0][0]}: length {length} is over the model's maximum, MAX_SEQUENCE_LENGTH "
                f"{self.max_length}; shorten or split the sequence"
            )
        return length

    def padded(self, length: int) -> int:
        """The length a pass whose longest request has `length` runs at."""
        bucketed = -(-length // self.bucket) * self.bucket
        return min(bucketed, self.max_length) if self.max_length is not None else bucketed

    def planned_length(self) -> int:
        """The length the config plans at: shape.<INPUT> of the first sequence input, else 1."""
        spec, axis = self.inputs[0], self.axes[0]
        return spec.shape(None)[axis]

    def two_lengths(self) -> tuple[int, int]:
        """Two lengths half a bucket apart at the planned length (within the maximum), to check
        what the model does with the length at load."""
        planned = self.planned_length()
        step = max(1, self.bucket // 2)
        long = min(max(planned, 2) + step, self.max_length or planned + step)
        return max(1, min(planned, long - step)), long

    def bucket_lengths(self, top: int) -> list[int]:
        """Every length a pass may be padded to, up to `top`."""
        return sorted(
            {self.padded(n) for n in range(self.bucket, top + self.bucket, self.bucket)} | {self.padded(top)}
        )


def at_length(spec: TensorSpec, axis: int, length: int) -> TensorSpec:
    """`spec` planned at `length` along its sequence axis (its other dims as planned)."""
    sample = list(spec.shape(None))
    sample[axis] = length
    return replace(spec, planned_dims=tuple(sample))


def model_at_length(model: ModelSpec, sequences: Sequences, length: int) -> ModelSpec:
    """The model as if its config planned its sequence inputs at `length`: what random inputs of
    that length are generated from."""
    axes = sequences.axis_of
    inputs = tuple(
        at_length(spec, axes[spec.name], length) if spec.name in axes else spec for spec in model.inputs
    )
    return replace(model, inputs=inputs)


def traffic(
    model: ModelSpec, count: int, batch: int = 1, seed: int = 0, mix: LengthMix | None = None
) -> list[dict[str, Array]]:
    """`count` valid requests of `batch` rows, as load tools send them: for a model with sequence
    inputs, at lengths drawn from `mix` (else the config's LENGTH_MIX; else all at its planned
    length), each within MAX_SEQUENCE_LENGTH; for any other model, one generated request."""
    sequences = Sequences.of(model)
    mix = mix or (sequences.mix if sequences else None)
    if sequences is None or mix is None:
        return [random_inputs(model, batch=batch, seed=seed)]  # (no batch dimension where unbatched)
    top = sequences.max_length or mix.longest
    lengths = [min(n, top) for n in mix.draw(count, seed)]
    return [
        random_inputs(model_at_length(model, sequences, n), batch=batch, seed=seed + i)
        for i, n in enumerate(lengths)
    ]


def tokens(request: Mapping[str, Array], model: ModelSpec, sequences: Sequences | None) -> int:
    """The positions a request sends along its sequence axis (rows x length; rows without one)."""
    rows = next(iter(request.values())).shape[0] if model.batched else 1
    if sequences is None:
        return rows
    spec, axis = sequences.inputs[0], sequences.axes[0]
    return rows * int(request[spec.name].shape[(1 if model.batched else 0) + axis])


def padded_to(
    request: Mapping[str, Array], model: ModelSpec, sequences: Sequences, length: int
) -> dict[str, Array]:
    """`request` with its sequence inputs padded on the right to `length` (pad.<INPUT>: masks 0), as
    a client pads where the server cannot batch requests of different lengths together."""
    cut = 1 if model.batched else 0
    padded = dict(request)
    for spec, axis in zip(sequences.inputs, sequences.axes, strict=True):
        array = request[spec.name]
        widths = [(0, 0)] * array.ndim
        widths[cut + axis] = (0, length - array.shape[cut + axis])
        padded[spec.name] = np.pad(array, widths, constant_values=spec.pad_value)
    return padded
