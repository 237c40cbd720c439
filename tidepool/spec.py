"""The model's config as every part of Tidepool sees it: typed tensor specs and parameters, parsed
from the JSON that Triton hands to `initialize` (or that a client reads from the server), with
clear errors for parameters that make no sense. Needs numpy only: the Python stub imports it."""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

from tidepool.errors import TidepoolError

Array = npt.NDArray[Any]  # a tensor's data as the backend holds it
DType = np.dtype[Any]

# Triton data types that a torch model can take or give, and their numpy equivalents.
TRITON_TO_NUMPY: dict[str, DType] = {
    "TYPE_BOOL": np.dtype(np.bool_),
    "TYPE_UINT8": np.dtype(np.uint8),
    "TYPE_INT8": np.dtype(np.int8),
    "TYPE_INT16": np.dtype(np.int16),
    "TYPE_INT32": np.dtype(np.int32),
    "TYPE_INT64": np.dtype(np.int64),
    "TYPE_FP16": np.dtype(np.float16),
    "TYPE_FP32": np.dtype(np.float32),
    "TYPE_FP64": np.dtype(np.float64),
}

# The wire names (KServe v2 protocol) of the same types, used by clients and error messages.
TRITON_TO_WIRE: dict[str, str] = {k: k.removeprefix("TYPE_") for k in TRITON_TO_NUMPY}


def dims_match(shape: Sequence[int], dims: Sequence[int]) -> bool:
    """Whether a shape fits declared dims, where -1 takes any size."""
    return len(shape) == len(dims) and all(want in (-1, got) for got, want in zip(shape, dims, strict=True))


def concrete_dims(dims: Sequence[int]) -> tuple[int, ...]:
    """Declared dims with every variable (-1) dimension taken as 1: the smallest valid shape."""
    return tuple(1 if d == -1 else d for d in dims)


def shape_text(shape: Sequence[int | str]) -> str:
    """A shape as config.pbtxt and error messages write it: [2, 128]."""
    return "[" + ", ".join(str(d) for d in shape) + "]"


class ConfigError(TidepoolError, ValueError):
    """The model's config.pbtxt asks for something the backend cannot do."""


@dataclass(frozen=True)
class ValueRange:
    """Inclusive bounds a tensor's values must stay within (declared by a config parameter)."""

    low: float
    high: float

    @classmethod
    def parse(cls, text: str, where: str) -> ValueRange:
        parts = [p.strip() for p in text.split(",")]
        try:
            low, high = (float(p) for p in parts)
        except ValueError:
            raise ConfigError(f"{where}: expected 'LOW,HIGH' (inclusive), got {text!r}") from None
        if low > high:
            raise ConfigError(f"{where}: LOW {low} is above HIGH {high}")
        return cls(low, high)


@dataclass(frozen=True)
class LengthMix:
    """A distribution of sequence lengths: each length with its share of the requests."""

    lengths: tuple[int, ...]
    shares: tuple[float, ...]  # sum to 1
    text: str  # as written: '8..512', '64', '8..64:0.7,65..512:0.3'

    @classmethod
    def parse(cls, text: str, where: str = "lengths") -> LengthMix:
        """'64' (one length), '8..512' (uniform), or parts with shares, 'A..B:SHARE' or
        'L:SHARE', each part uniform within its range: '8..64:0.7,65..256:0.25,257..512:0.05'."""
        weights: dict[int, float] = {}
        parts = [part.strip() for part in text.split(",") if part.strip()]
        if not parts:
            raise ConfigError(
                f"{where}: expected e.g. '8..512', '64' or '8..64:0.7,65..512:0.3', got {text!r}"
            )
        for part in parts:
            span, _, share_text = part.partition(":")
            low_text, dots, high_text = span.partition("..")
            try:
                low = int(low_text)
                high = int(high_text) if dots else low
                share = float(share_text) if share_text else 1.0
            except ValueError:
                raise ConfigError(
                    f"{where}: {part!r} is not LENGTH, LOW..HIGH, or either with :SHARE (in {text!r})"
                ) from None
            if low < 1 or high < low or share <= 0 or not math.isfinite(share):
                raise ConfigError(f"{where}: {part!r} needs 1 <= LOW <= HIGH and a share above 0")
            for length in range(low, high + 1):
                weights[length] = weights.get(length, 0.0) + share / (high - low + 1)
        return cls.of(weights, text)

    @classmethod
    def of(cls, weights: Mapping[int, float], text: str) -> LengthMix:
        total = sum(weights.values())
        lengths = tuple(sorted(weights))
        return cls(lengths, tuple(weights[n] / total for n in lengths), text)

    @classmethod
    def from_lengths(cls, lengths: Sequence[int], text: str = "") -> LengthMix:
        """The mix of observed lengths (real samples), each with its share of them."""
        if not lengths:
            raise ConfigError("a length mix needs at least one length")
        counts: dict[int, float] = {}
        for length in lengths:
            counts[int(length)] = counts.get(int(length), 0.0) + 1.0
        low, high = min(counts), max(counts)
        return cls.of(counts, text or f"{len(lengths)} samples, {low}..{high}, mean {np.mean(lengths):.0f}")

    @property
    def mean(self) -> float:
        return float(np.dot(self.lengths, self.shares))

    @property
    def longest(self) -> int:
        return self.lengths[-1]

    @property
    def shortest(self) -> int:
        return self.lengths[0]

    def quantile(self, q: float) -> int:
        """The smallest length at or below which at least a share `q` of requests fall."""
        cumulative = np.cumsum(self.shares)
        return self.lengths[min(int(np.searchsorted(cumulative, q - 1e-12)), len(self.lengths) - 1)]

    def draw(self, count: int, seed: int = 0) -> list[int]:
        rng = np.random.default_rng(seed)
        return [int(n) for n in rng.choice(self.lengths, size=count, p=self.shares)]

    def describe(self) -> str:
        return f"{self.text} (mean {self.mean:.0f}, median {self.quantile(0.5)}, longest {self.longest})"


@dataclass(frozen=True)
class TensorSpec:
    """One input or output as declared in the config, without the batch dimension."""

    name: str
    triton_type: str
    dims: tuple[int, ...]
    value_range: ValueRange | None = None
    # `shape.<NAME>`: the sizes its variable (-1) dims are planned, generated and warmed up at
    # (real traffic's lengths); None: the smallest, 1.
    planned_dims: tuple[int, ...] | None = None
    # `allow_ragged_batch: true`: Triton batches requests whose lengths differ (runtime/lengths.py).
    allow_ragged: bool = False
    pad_value: float = 0.0  # `pad.<NAME>`: what a shorter sequence is padded with in such a batch

    @property
    def dtype(self) -> DType:
        return TRITON_TO_NUMPY[self.triton_type]

    @property
    def wire_type(self) -> str:
        return TRITON_TO_WIRE[self.triton_type]

    def shape(self, batch: int | None) -> tuple[int, ...]:
        """The shape this tensor is planned at with `batch` rows (no batch dimension if None): its
        `shape.<NAME>` where the config gives one, else the smallest valid shape."""
        sample = self.planned_dims or concrete_dims(self.dims)
        return sample if batch is None else (batch, *sample)

    @property
    def variable(self) -> bool:
        return -1 in self.dims


@dataclass(frozen=True)
class ModelSpec:
    """What the backend needs from config.pbtxt: I/O, the batch limit and the string parameters."""

    name: str
    max_batch_size: int
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]
    parameters: dict[str, str] = field(default_factory=dict)
    cpu_instances: int = 1  # instances of the config's instance groups that are not KIND_GPU

    @property
    def batched(self) -> bool:
        return self.max_batch_size > 0

    def input(self, name: str) -> TensorSpec | None:
        return next((spec for spec in self.inputs if spec.name == name), None)

    @property
    def ragged(self) -> bool:
        """Whether Triton may hand one execution requests whose input shapes differ."""
        return any(spec.allow_ragged for spec in self.inputs)


_BYTE_UNITS = {"": 1, "B": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9, "KIB": 2**10, "MIB": 2**20, "GIB": 2**30}


def positive_ints(text: str, where: str, example: str = "1,8,32") -> list[int]:
    """'1,8,32' -> [1, 8, 32]; a ConfigError that names `where` unless each is a number of 1 or more."""
    try:
        values = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise ConfigError(f"{where}: expected e.g. '{example}', got {text!r}") from None
    if not values or min(values) < 1:
        raise ConfigError(f"{where}: sizes must be 1 or more, got {text!r}")
    return values


def mib(nbytes: int | None, digits: int = 1, unit: bool = True) -> str:
    """Bytes as MiB for a message: '12.5 MiB' ('none' for None; the number alone without `unit`)."""
    if nbytes is None:
        return "none"
    return f"{nbytes / 2**20:.{digits}f}" + (" MiB" if unit else "")


def parse_bytes(text: str, where: str) -> int:
    """'512MiB', '2GiB', '1.5GB' or a plain number of bytes."""
    cleaned = text.strip().upper().replace(" ", "")
    number = cleaned.rstrip("KMGIB")
    unit = cleaned[len(number) :]
    try:
        value = float(number) * _BYTE_UNITS[unit]
    except (ValueError, KeyError):
        raise ConfigError(f"{where}: expected a size like 512MiB, 2GiB or 1000000, got {text!r}") from None
    if value < 0:
        raise ConfigError(f"{where}: a size cannot be negative, got {text!r}")
    return int(value)


_SECONDS_PER = {"": 1.0, "s": 1.0, "ms": 0.001, "m": 60.0, "min": 60.0, "h": 3600.0}


def parse_duration(text: str, where: str) -> float:
    """'10s', '500ms', '5m', '1h' or a plain number of seconds -> seconds (above 0)."""
    cleaned = text.strip().lower().replace(" ", "")
    number = cleaned.rstrip("amhins")
    unit = cleaned[len(number) :]
    try:
        value = float(number) * _SECONDS_PER[unit]
    except (ValueError, KeyError):
        raise ConfigError(f"{where}: expected e.g. 10s, 500ms, 5m or 30 (seconds), got {text!r}") from None
    if value <= 0:
        raise ConfigError(f"{where}: a duration must be above 0, got {text!r}")
    return value


def planned_dims(text: str, dims: tuple[int, ...], where: str) -> tuple[int, ...]:
    """`shape.<NAME>`: one size per declared dim ('128', or '1,128'), each variable dim's at least 1
    and every fixed dim's as declared."""
    sizes = tuple(positive_ints(text, where, example=",".join("128" if d == -1 else str(d) for d in dims)))
    if len(sizes) != len(dims) or not dims_match(sizes, dims):
        raise ConfigError(
            f"{where}: {shape_text(sizes)} does not fit the declared dims {shape_text(dims)}: give one size "
            "per dim, the fixed ones as declared (the batch dimension is not part of it)"
        )
    return sizes


def _number(text: str, where: str) -> float:
    try:
        return float(text)
    except ValueError:
        raise ConfigError(f"{where}: expected a number, got {text!r}") from None


def _tensor_specs(
    entries: list[dict[str, Any]], parameters: dict[str, str], kind: str
) -> tuple[TensorSpec, ...]:
    specs = []
    for entry in entries:
        name = entry["name"]
        triton_type = entry.get("data_type", "")
        if triton_type not in TRITON_TO_NUMPY:
            supported = ", ".join(sorted(TRITON_TO_NUMPY))
            raise ConfigError(f"{kind} {name}: data_type {triton_type} is not supported ({supported})")
        dims = tuple(int(d) for d in entry.get("dims", []))
        range_key = f"range.{name}"
        value_range = (
            ValueRange.parse(parameters[range_key], f"parameter {range_key}")
            if range_key in parameters
            else None
        )
        shape_key = f"shape.{name}"
        planned = (
            planned_dims(parameters[shape_key], dims, f"parameter {shape_key}")
            if shape_key in parameters
            else None
        )
        pad_key = f"pad.{name}"
        pad = _number(parameters[pad_key], f"parameter {pad_key}") if pad_key in parameters else 0.0
        ragged = bool(entry.get("allow_ragged_batch", False))
        specs.append(TensorSpec(name, triton_type, dims, value_range, planned, ragged, pad))
    return tuple(specs)


def parse_model_config(config: dict[str, Any] | str) -> ModelSpec:
    """Build a ModelSpec from Triton's JSON model config (a dict, or the JSON text itself)."""
    config = json.loads(config) if isinstance(config, str) else config
    parameters = {key: value.get("string_value", "") for key, value in config.get("parameters", {}).items()}
    inputs = _tensor_specs(config.get("input", []), parameters, "input")
    outputs = _tensor_specs(config.get("output", []), parameters, "output")
    if not inputs or not outputs:
        raise ConfigError("the model config must declare at least one input and one output")
    return ModelSpec(
        name=config.get("name", ""),
        max_batch_size=int(config.get("max_batch_size", 0)),
        inputs=inputs,
        outputs=outputs,
        parameters=parameters,
        cpu_instances=sum(
            int(group.get("count") or 1)
            for group in config.get("instance_group") or [{}]
            if group.get("kind") != "KIND_GPU"
        ),
    )
