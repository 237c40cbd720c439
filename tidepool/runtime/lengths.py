"""Requests of different lengths in one execution (a model with sequence inputs, sequences.py):
which requests share a forward pass (chosen by length under a token budget), each pass's batch
padded on the right in the caller's blocks, token-level outputs cut back to each request's length,
and the check at load that says which outputs follow the length and whether padding leaves the
outputs as they are alone."""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass, field

import numpy as np

from tidepool.inputs import random_inputs
from tidepool.runtime.batching import Allocate, numpy_allocate
from tidepool.sequences import Sequences, model_at_length
from tidepool.spec import Array, ConfigError, ModelSpec

# Padding must leave a request's outputs as they are alone, up to the rounding a different batch
# shape brings (relative to the largest output value; a masked position adds exactly zero).
PAD_TOLERANCE = 1e-3
Forward = Callable[[dict[str, Array], int], dict[str, Array]]  # a batch and its rows -> outputs


@dataclass(frozen=True)
class Pass:
    """Requests run in one forward pass, and the length it runs at (pass_length)."""

    members: tuple[int, ...]  # positions in the execution's valid requests
    length: int


def pass_length(lengths: Sequence[int], sequences: Sequences) -> int:
    """What a pass of requests of these lengths runs at: their one length where they share it,
    else the longest padded to its bucket."""
    longest = max(lengths)
    return longest if min(lengths) == longest else sequences.padded(longest)


def plan_passes(
    lengths: Sequence[int],
    rows: Sequence[int],
    shapes: Sequence[Hashable],
    sequences: Sequences,
    pad: bool,
) -> list[Pass]:
    """The passes that serve these requests at the least cost, where a pass costs
    PASS_COST_TOKENS plus its padded tokens, and takes at most MAX_BATCH_TOKENS (one request
    always may). Requests share a pass only where their other dims agree (`shapes`), and, without
    padding, only at equal lengths. Sorted by length, the best split into runs of neighbours is
    found by dynamic programming (an execution holds at most max_batch_size requests)."""
    groups: dict[Hashable, list[int]] = {}
    for index, shape in enumerate(shapes):
        groups.setdefault(shape if pad else (shape, lengths[index]), []).append(index)
    passes: list[Pass] = []
    for members in groups.values():
        order = sorted(members, key=lambda i: lengths[i])
        passes += _split(order, lengths, rows, sequences)
    return passes


def _split(order: list[int], lengths: Sequence[int], rows: Sequence[int], sequences: Sequences) -> list[Pass]:
    budget = sequences.max_batch_tokens
    one = lengths[order[0]]
    if lengths[order[-1]] == one and (budget is None or sum(rows[i] for i in order) * one <= budget):
        return [Pass(tuple(order), one)]  # one length within the budget (Triton's equal shapes): one pass
    best = [0.0] + [float("inf")] * len(order)  # best[i]: the cost of serving order[:i]
    start = [0] * (len(order) + 1)  # where the last pass of that best begins
    for end in range(1, len(order) + 1):
        longest = lengths[order[end - 1]]
        taken = 0
        for first in range(end - 1, -1, -1):
            taken += rows[order[first]]
            length = longest if lengths[order[first]] == longest else sequences.padded(longest)
            tokens = taken * length
            if budget is not None and tokens > budget and first < end - 1:
                break
            cost = best[first] + sequences.pass_cost_tokens + tokens
            if cost < best[end]:
                best[end], start[end] = cost, first
    passes = []
    end = len(order)
    while end > 0:
        first = start[end]
        members = tuple(order[first:end])
        passes.append(Pass(members, pass_length([lengths[m] for m in members], sequences)))
        end = first
    return passes[::-1]


@dataclass
class LengthBatcher:
    """How an instance runs requests of different lengths together (see the module's docstring)."""

    sequences: Sequences
    pad: bool  # pad requests of different lengths into one pass (else: one pass per length)
    token_axes: dict[str, int]  # output -> the axis of its sample that follows the input's length
    notes: list[str] = field(default_factory=list)

    def describe(self) -> list[str]:
        """What the log says of it: how lengths share passes, and why where padding was refused."""
        s = self.sequences
        if not self.pad:
            return [f"lengths of {', '.join(s.names)}: each its own pass", *self.notes]
        budget = f", at most {s.max_batch_tokens} tokens a pass" if s.max_batch_tokens else ""
        return [
            f"lengths of {', '.join(s.names)}: padded together to multiples of {s.bucket}{budget}, "
            f"a pass worth {s.pass_cost_tokens} tokens of padding",
            *self.notes,
        ]

    def shape_key(self, request: dict[str, Array]) -> Hashable:
        """What requests sharing a pass must agree on: every dim but the sequence axis."""
        key = []
        axes = self.sequences.axis_of
        for name in sorted(request):
            shape = list(request[name].shape[1:])
            if name in axes:
                shape[axes[name]] = 0
            key.append(tuple(shape))
        return tuple(key)

    def passes(
        self, requests: Sequence[dict[str, Array]], rows: Sequence[int], lengths: Sequence[int]
    ) -> list[Pass]:
        shapes = [self.shape_key(request) for request in requests]
        return plan_passes(lengths, rows, shapes, self.sequences, self.pad)

    def gather(
        self,
        requests: Sequence[dict[str, Array]],
        rows: Sequence[int],
        lengths: Sequence[int],
        length: int,
        model: ModelSpec,
        allocate: Allocate,
    ) -> dict[str, Array]:
        """One batch of these requests, each sequence input padded on the right to `length` with
        its pad value; other inputs copied as they are."""
        axes = self.sequences.axis_of
        total = sum(rows)
        batch: dict[str, Array] = {}
        for spec in model.inputs:
            sample = list(requests[0][spec.name].shape[1:])
            axis = axes.get(spec.name)
            if axis is not None:
                sample[axis] = length
            out = allocate((total, *sample), spec.dtype)
            row = 0
            for request, count, own in zip(requests, rows, lengths, strict=True):
                rows_here = slice(row, row + count)
                if axis is None:
                    out[rows_here] = request[spec.name]
                else:
                    lead = (rows_here,) + (slice(None),) * axis
                    out[(*lead, slice(0, own))] = request[spec.name]
                    if own < length:
                        out[(*lead, slice(own, length))] = spec.pad_value
                row += count
            batch[spec.name] = out
        return batch

    def cut(
        self, outputs: dict[str, Array], rows: Sequence[int], lengths: Sequence[int], allocate: Allocate
    ) -> list[dict[str, Array]]:
        """Each request's rows of every output, token-level outputs cut back to its length: a view
        where that is contiguous (one row, the length first), else a copy into a block."""
        per_request = []
        row = 0
        for count, own in zip(rows, lengths, strict=True):
            mine: dict[str, Array] = {}
            for name, array in outputs.items():
                part = array[row : row + count]
                axis = self.token_axes.get(name)
                if axis is not None and part.shape[1 + axis] != own:
                    part = part[(slice(None),) * (1 + axis) + (slice(0, own),)]
                    if not part.flags.c_contiguous:
                        copy = allocate(part.shape, part.dtype)
                        copy[...] = part
                        part = copy
                mine[name] = part
            per_request.append(mine)
            row += count
        return per_request


def probe(forward: Forward, model: ModelSpec, sequences: Sequences) -> LengthBatcher:
    """For a ragged model (`allow_ragged_batch`), run it at two lengths, alone and padded together,
    to learn which outputs follow the length (their axis is cut back) and, for LENGTH_GROUPING=auto,
    whether padding is safe: an output whose length does not follow the input's, or one that
    padding changes, means each length runs as its own pass (as for a model that is not ragged)."""
    grouping = sequences.grouping
    if grouping == "exact" or not model.batched or not model.ragged:
        return LengthBatcher(sequences, False, {})
    short, long = sequences.two_lengths()
    if short == long:
        return LengthBatcher(
            sequences, False, {}, [f"LENGTH_GROUPING: MAX_SEQUENCE_LENGTH {long} leaves one length"]
        )
    alone = [random_inputs(model_at_length(model, sequences, n), batch=1, seed=3) for n in (short, long)]
    try:
        outputs = [forward(request, 1) for request in alone]
    except Exception as exc:  # the model's own failure on generated inputs: serve, but unpadded
        why = f"the model failed on generated inputs ({type(exc).__name__}); declare range.<INPUT>"
        return LengthBatcher(sequences, False, {}, [f"LENGTH_GROUPING auto: exact lengths only: {why}"])
    token_axes: dict[str, int] = {}
    for spec in model.outputs:
        if not spec.variable:
            continue
        shapes = [out[spec.name].shape[1:] for out in outputs]
        axis = next((a for a in range(len(spec.dims)) if (shapes[0][a], shapes[1][a]) == (short, long)), None)
        if axis is None:
            why = (
                f"output {spec.name}'s length does not follow the input's ({short} -> {list(shapes[0])}, "
                f"{long} -> {list(shapes[1])})"
            )
            if grouping == "pad":
                raise ConfigError(f"LENGTH_GROUPING=pad: {why}; set LENGTH_GROUPING=exact")
            return LengthBatcher(sequences, False, {}, [f"LENGTH_GROUPING auto: exact lengths only: {why}"])
        token_axes[spec.name] = axis
    batcher = LengthBatcher(sequences, True, token_axes)
    if grouping == "pad":
        return batcher
    rows = [1, 1]
    together = batcher.gather(alone, rows, [short, long], long, model, numpy_allocate)
    padded = batcher.cut(forward(together, 2), rows, [short, long], numpy_allocate)
    for spec in model.outputs:
        for mine, own in zip(padded, outputs, strict=True):
            difference = _relative_difference(mine[spec.name], own[spec.name])
            if difference > PAD_TOLERANCE:
                batcher.pad = False
                batcher.notes.append(
                    f"LENGTH_GROUPING auto: exact lengths only: padding changed output {spec.name} by "
                    f"{difference:.3g} (relative); declare pad.<INPUT> values the model ignores (its "
                    "attention mask at 0)"
                )
                return batcher
    return batcher


def _relative_difference(ours: Array, reference: Array) -> float:
    if ours.shape != reference.shape:
        return float("inf")
    if reference.size == 0:
        return 0.0
    scale = float(np.abs(reference).max()) or 1.0
    return float(np.abs(ours.astype(np.float64) - reference.astype(np.float64)).max()) / scale
