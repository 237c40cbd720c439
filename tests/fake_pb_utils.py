"""A typed fake of `triton_python_backend_utils` for unit tests: the part of its API that the
backend uses, holding plain numpy arrays. Never used by integration tests."""

from __future__ import annotations

import sys
import types
from dataclasses import dataclass, field

import numpy as np


class Tensor:
    def __init__(self, name: str, array: np.ndarray) -> None:
        if not isinstance(array, np.ndarray):
            raise TypeError(f"Tensor {name}: expected a numpy array, got {type(array).__name__}")
        self._name = name
        self._array = array

    def name(self) -> str:
        return self._name

    def as_numpy(self) -> np.ndarray:
        return self._array


class TritonError(Exception):
    UNKNOWN, INTERNAL, NOT_FOUND, INVALID_ARG, UNAVAILABLE, UNSUPPORTED, ALREADY_EXISTS = range(7)
    CANCELLED = 7

    def __init__(self, message: str, code: int = INTERNAL) -> None:
        super().__init__(message)
        self._message = message
        self._code = code

    def message(self) -> str:
        return self._message

    def code(self) -> int:
        return self._code


@dataclass
class InferenceRequest:
    tensors: list[Tensor]
    request_id: str = ""

    def inputs(self) -> list[Tensor]:
        return self.tensors


@dataclass
class InferenceResponse:
    output_tensors: list[Tensor] = field(default_factory=list)
    error: TritonError | None = None

    def has_error(self) -> bool:
        return self.error is not None

    def output(self, name: str) -> np.ndarray:
        return next(t.as_numpy() for t in self.output_tensors if t.name() == name)


class Metric:
    def __init__(self, family: MetricFamily, labels: dict[str, str]) -> None:
        self.family = family
        self.labels = labels
        self.value = 0.0
        self.observations: list[float] = []

    def set(self, value: float) -> None:
        self.value = float(value)

    def increment(self, value: float) -> None:
        if self.family.kind == MetricFamily.COUNTER and value < 0:
            raise TritonError("a counter cannot decrease")
        self.value += float(value)

    def observe(self, value: float) -> None:
        self.observations.append(float(value))


class MetricFamily:
    COUNTER, GAUGE, HISTOGRAM = range(3)
    registry: dict[str, MetricFamily] = {}

    def __init__(self, name: str, description: str, kind: int) -> None:
        self.name = name
        self.description = description
        self.kind = kind
        self.metrics: list[Metric] = []
        MetricFamily.registry[name] = self

    def Metric(self, labels: dict[str, str] | None = None, buckets: list[float] | None = None) -> Metric:  # noqa: N802
        metric = Metric(self, labels or {})
        metric.buckets = buckets
        self.metrics.append(metric)
        return metric


class Logger:
    """Records what the backend logs, as (level, message)."""

    messages: list[tuple[str, str]] = []

    @classmethod
    def log_info(cls, message: str) -> None:
        cls.messages.append(("info", message))

    @classmethod
    def log_warn(cls, message: str) -> None:
        cls.messages.append(("warn", message))

    @classmethod
    def log_error(cls, message: str) -> None:
        cls.messages.append(("error", message))


def install() -> types.ModuleType:
    """Register this fake as `triton_python_backend_utils` and return it."""
    module = sys.modules[__name__]
    sys.modules["triton_python_backend_utils"] = module
    return module
