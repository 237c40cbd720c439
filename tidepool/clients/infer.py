"""`tidepool infer`: one valid random request to a model; prints shape, checksum and latency."""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

from tidepool.clients.connection import Connection
from tidepool.inputs import load_inputs, random_inputs


@dataclass(frozen=True)
class InferResult:
    model: str
    protocol: str
    url: str
    outputs: dict[str, np.ndarray]
    latency_ms: float

    def describe(self) -> str:
        lines = [f"{self.model} via {self.protocol}://{self.url}: {self.latency_ms:.2f} ms"]
        for name, array in self.outputs.items():
            checksum = float(np.abs(np.asarray(array, dtype=np.float64)).sum())
            lines.append(
                f"  {name}: shape {list(array.shape)} {array.dtype} checksum (sum |x|) {checksum:.6f}"
            )
        return "\n".join(lines)


def infer_once(
    model: str,
    protocol: str = "http",
    url: str | None = None,
    seed: int = 0,
    batch: int = 1,
    inputs: str | None = None,
) -> InferResult:
    """One request: the rows of an `inputs` file, else `batch` rows generated from the config."""
    with Connection.open(protocol, url) as connection:
        spec = connection.model_spec(model)
        sent = load_inputs(inputs, spec) if inputs else random_inputs(spec, batch=batch, seed=seed)
        started = time.perf_counter()
        outputs = connection.infer(model, sent, spec)
        latency_ms = (time.perf_counter() - started) * 1e3
    return InferResult(model, protocol, connection.url, outputs, latency_ms)
