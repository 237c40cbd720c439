"""A typed fake of `triton_python_backend_utils` for unit tests: the part of its API the backend
uses, with the real signatures (Python backend of tritonserver 2.51), holding numpy arrays.
Installed per test by the `pb_utils` fixture; never used by integration tests.

What the real module does not have is marked fake-only: state tests read to check what the
backend did (what was logged, what a metric holds), and switches that make the fake behave like a
server configured otherwise (`metrics_enabled`)."""

from __future__ import annotations

import sys
import time
from collections.abc import Iterator
from typing import Any

import numpy as np


class TritonModelException(Exception):
    """What the real stub raises when a pb_utils call fails (e.g. metrics are disabled)."""


class Tensor:
    def __init__(self, name: str, array: np.ndarray) -> None:
        if not isinstance(array, np.ndarray):
            raise TritonModelException(f"Tensor {name}: expected a numpy array, got {type(array).__name__}")
        self._name = name
        self._array = array
        self._source: Any = None  # the torch tensor from_dlpack shares (fake-only)

    def name(self) -> str:
        return self._name

    def as_numpy(self) -> np.ndarray:
        if self._device is not None:  # as the real one: GPU memory has no numpy view
            raise TritonModelException("Tensor is stored in GPU memory and cannot be converted to NumPy")
        return self._array

    def read(self) -> np.ndarray:
        """What the stub copies into the response (fake-only): the tensor's memory as it is now,
        device memory included, as the real stub reads it once `execute` has returned."""
        return self._source.cpu().numpy().copy() if self._source is not None else self._array.copy()

    def is_cpu(self) -> bool:
        return self._device is None

    _device: Any = None  # the torch device of a GPU tensor made by from_dlpack (fake-only)

    @staticmethod
    def from_dlpack(name: str, tensor: Any) -> Tensor:
        """A DLPack capsule, or an object with __dlpack__ and __dlpack_device__ (the real one asks
        for it on its own stream)."""
        import torch.utils.dlpack

        if not hasattr(tensor, "__dlpack__") and type(tensor).__name__ != "PyCapsule":
            raise TritonModelException(
                "Provided tensor is not supported. Tensor must be a DLPack capsule or have "
                "`__dlpack__` and `__dlpack_device__` attributes"
            )
        value = torch.utils.dlpack.from_dlpack(tensor)
        if not value.is_contiguous():  # r24.10's pb_tensor refuses these
            raise TritonModelException(
                "DLPack tensor is not contiguous. Only contiguous DLPack tensors that are stored in "
                "C-Order are supported."
            )
        # Shared, not copied: the real stub reads the memory after execute returns.
        made = Tensor(name, value.numpy() if value.device.type == "cpu" else np.empty(0))
        made._device = None if value.device.type == "cpu" else value.device
        made._source = value
        return made

    def to_dlpack(self) -> Any:
        return self._array.__dlpack__()


class TritonError:
    UNKNOWN, INTERNAL, NOT_FOUND, INVALID_ARG, UNAVAILABLE, UNSUPPORTED, ALREADY_EXISTS, CANCELLED = range(8)

    def __init__(self, message: str, code: int = INTERNAL) -> None:
        self._message = message
        self._code = code

    def message(self) -> str:
        return self._message

    def code(self) -> int:
        return self._code


class InferenceRequest:
    """The real constructor's arguments, in its order (pybind11: each also by keyword); inputs,
    requested_output_names and model_name are required and may not be None."""

    def __init__(
        self,
        request_id: str = "",
        correlation_id: int | str = 0,
        inputs: list[Tensor] | None = None,
        requested_output_names: list[str] | None = None,
        model_name: str | None = None,
        model_version: int = -1,
        flags: int = 0,
        timeout: int = 0,
    ) -> None:
        if inputs is None or requested_output_names is None or model_name is None:
            raise TypeError("__init__(): incompatible constructor arguments")
        if not isinstance(request_id, str) or not isinstance(model_name, str):
            raise TypeError("__init__(): incompatible constructor arguments")
        self._inputs = inputs
        self._request_id = request_id
        self._sender = InferenceResponseSender()

    def inputs(self) -> list[Tensor]:
        return self._inputs

    def request_id(self) -> str:
        return self._request_id

    def get_response_sender(self) -> InferenceResponseSender:
        return self._sender


TRITONSERVER_RESPONSE_COMPLETE_FINAL = 1


class InferenceResponseSender:
    """A non-decoupled model's sender, as strict as r24.10's: one response, sent with the final flag;
    what it sends is copied at once, as the stub copies it into shared memory."""

    def __init__(self) -> None:
        self.sent: list[tuple[dict[str, np.ndarray], TritonError | None, float]] = []  # fake-only

    def send(self, response: InferenceResponse | None = None, flags: int = 0) -> None:
        if self.sent:
            raise TritonModelException(
                "Unable to send response. Non-decoupled model cannot send more than one response."
            )
        if flags != TRITONSERVER_RESPONSE_COMPLETE_FINAL or response is None:
            raise TritonModelException(
                "Unable to send response. Non-decoupled model must send one final response."
            )
        outputs = {t.name(): np.array(t.as_numpy()) for t in response.output_tensors()}
        self.sent.append((outputs, response.error(), time.perf_counter()))


class InferenceResponse:
    def __init__(self, output_tensors: list[Tensor] | None = None, error: TritonError | None = None) -> None:
        self._output_tensors = list(output_tensors or [])
        self._error = error

    def output_tensors(self) -> list[Tensor]:
        return self._output_tensors

    def has_error(self) -> bool:
        return self._error is not None

    def error(self) -> TritonError | None:
        return self._error


def output_of(response: InferenceResponse, name: str) -> np.ndarray:
    """The named output of a response, as the real `get_output_tensor_by_name` finds it."""
    return next(t.as_numpy() for t in response.output_tensors() if t.name() == name)


class Metric:
    def __init__(self, family: MetricFamily, labels: dict[str, str], buckets: list[float] | None) -> None:
        self.labels = labels  # fake-only
        self.buckets = buckets  # fake-only
        self.observed: list[float] = []  # fake-only: what observe() was given
        self._family = family
        self._value = 0.0

    def value(self) -> float:
        return self._value

    def set(self, value: float) -> None:
        if self._family.kind != MetricFamily.GAUGE:
            raise TritonModelException("set() is for gauges")
        self._value = float(value)

    def increment(self, value: float) -> None:
        if self._family.kind == MetricFamily.COUNTER and value < 0:
            raise TritonModelException("a counter cannot decrease")
        self._value += float(value)

    def observe(self, value: float) -> None:
        if self._family.kind != MetricFamily.HISTOGRAM:
            raise TritonModelException("observe() is for histograms")
        self.observed.append(float(value))


class MetricFamily:
    COUNTER, GAUGE, HISTOGRAM = range(3)

    def __init__(self, name: str, description: str, kind: int) -> None:
        if not state.metrics_enabled:
            raise TritonModelException("Failed to create metric family: metrics not supported")
        self.name = name
        self.kind = kind
        self.metrics: list[Metric] = []  # fake-only
        state.families[name] = self

    def Metric(self, labels: dict[str, str] | None = None, buckets: list[float] | None = None) -> Metric:  # noqa: N802
        # As the real stub (python_backend r24.10, metric_family.cc) refuses them.
        if labels is not None and not isinstance(labels, dict):
            raise TritonModelException("Failed to create metric. Labels must be a dictionary.")
        if buckets is not None and not isinstance(buckets, list):
            raise TritonModelException("Failed to create metric. Buckets must be a list.")
        if buckets is not None and self.kind != MetricFamily.HISTOGRAM:
            raise TritonModelException("Failed to create metric. Unexpected buckets found.")
        if buckets is None and self.kind == MetricFamily.HISTOGRAM:
            raise TritonModelException("Failed to create metric. Missing required buckets.")
        metric = Metric(self, labels or {}, buckets)
        self.metrics.append(metric)
        return metric


class Logger:
    @staticmethod
    def log_info(message: str) -> None:
        state.logged.append(("info", message))

    @staticmethod
    def log_warn(message: str) -> None:
        state.logged.append(("warn", message))

    @staticmethod
    def log_error(message: str) -> None:
        state.logged.append(("error", message))

    @staticmethod
    def log_verbose(message: str) -> None:
        state.logged.append(("verbose", message))


class FakeState:
    """Fake-only: what one test's backend did, and how the fake server is configured."""

    def __init__(self) -> None:
        self.metrics_enabled = True
        self.families: dict[str, MetricFamily] = {}
        self.logged: list[tuple[str, str]] = []


state = FakeState()


def installed() -> Iterator[Any]:
    """Register this module as `triton_python_backend_utils` with a fresh state, for one test."""
    global state
    state = FakeState()
    module = sys.modules[__name__]
    sys.modules["triton_python_backend_utils"] = module
    try:
        yield module
    finally:
        state = FakeState()
        sys.modules.pop("triton_python_backend_utils", None)
