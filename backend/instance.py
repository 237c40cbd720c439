"""One model instance, free of Triton: validates the requests of an execution, runs the valid
ones as one batch through the torch model, and returns per request its outputs or its error."""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from backend.batching import gather, split
from backend.config import ModelSpec, parse_model_config
from backend.loader import load_model
from backend.validation import RequestError, validate_request

Outputs = dict[str, np.ndarray]
Result = Outputs | RequestError

_NUMPY_TO_TORCH = {
    np.dtype(np.bool_): torch.bool,
    np.dtype(np.uint8): torch.uint8,
    np.dtype(np.int8): torch.int8,
    np.dtype(np.int16): torch.int16,
    np.dtype(np.int32): torch.int32,
    np.dtype(np.int64): torch.int64,
    np.dtype(np.float16): torch.float16,
    np.dtype(np.float32): torch.float32,
    np.dtype(np.float64): torch.float64,
}


@dataclass(frozen=True)
class InstanceSettings:
    """Backend parameters of config.pbtxt that shape how an instance runs."""

    torch_threads: int
    allow_nonfinite: bool

    @classmethod
    def from_spec(cls, model: ModelSpec) -> InstanceSettings:
        return cls(
            torch_threads=model.int_param("TORCH_NUM_THREADS", os.cpu_count() or 1, minimum=1),
            allow_nonfinite=(model.param("ALLOW_NONFINITE", "false") or "").lower() == "true",
        )


class ModelInstance:
    def __init__(self, model: ModelSpec, module: torch.nn.Module, settings: InstanceSettings):
        self.model = model
        self.module = module
        self.settings = settings

    @classmethod
    def load(cls, model_config: dict[str, Any] | str, model_dir: Path | str) -> ModelInstance:
        model = parse_model_config(model_config)
        settings = InstanceSettings.from_spec(model)
        torch.set_num_threads(settings.torch_threads)
        return cls(model, load_model(model_dir, model), settings)

    def execute(self, requests: Sequence[dict[str, np.ndarray]]) -> list[Result]:
        """Answer every request, in order: its outputs, or the RequestError that it alone gets."""
        results: list[Result | None] = [None] * len(requests)
        valid: list[int] = []
        batch_sizes: list[int] = []
        for index, inputs in enumerate(requests):
            try:
                batch_sizes.append(validate_request(inputs, self.model, self.settings.allow_nonfinite))
                valid.append(index)
            except RequestError as error:
                results[index] = error
        if not valid:
            return results  # type: ignore[return-value]
        if self.model.batched:
            self._run_batch([requests[i] for i in valid], batch_sizes, valid, results)
        else:
            for index in valid:
                results[index] = self._run_guarded(lambda i=index: self.forward(requests[i]))
        return results  # type: ignore[return-value]

    def _run_batch(self, requests, batch_sizes, indices, results) -> None:
        def run() -> list[Outputs]:
            batch = gather(requests, batch_sizes, self.model)
            return split(self.forward(batch, sum(batch_sizes)), batch_sizes)

        outcome = self._run_guarded(run)
        for position, index in enumerate(indices):
            results[index] = outcome if isinstance(outcome, RequestError) else outcome[position]

    @staticmethod
    def _run_guarded(run):
        """Turn a failure of the model itself into an error for the requests it carried."""
        try:
            return run()
        except RequestError as error:
            return error
        except Exception as exc:  # the model's own failure must not take the instance down
            return RequestError(f"the model failed: {type(exc).__name__}: {exc}", code="INTERNAL")

    def forward(self, batch: dict[str, np.ndarray], rows: int | None = None) -> Outputs:
        """One forward pass on numpy inputs; outputs checked against the config."""
        tensors = [torch.from_numpy(batch[spec.name]) for spec in self.model.inputs]
        with torch.inference_mode():
            raw = self.module(*tensors)
            produced = self._name_outputs(raw)
            outputs: Outputs = {}
            for spec in self.model.outputs:
                tensor = produced[spec.name].to(_NUMPY_TO_TORCH[spec.dtype]).contiguous()
                outputs[spec.name] = self._checked(spec, tensor.numpy(), rows)
        return outputs

    def _name_outputs(self, raw: Any) -> dict[str, torch.Tensor]:
        names = [spec.name for spec in self.model.outputs]
        if isinstance(raw, dict):
            missing = [name for name in names if name not in raw]
            if missing:
                raise RuntimeError(f"the model's output dict lacks {', '.join(missing)}")
            return raw
        values = [raw] if isinstance(raw, torch.Tensor) else list(raw)
        if len(values) != len(names):
            raise RuntimeError(
                f"the model returned {len(values)} outputs, the config declares "
                f"{len(names)} ({', '.join(names)})"
            )
        return dict(zip(names, values, strict=True))

    def _checked(self, spec, array: np.ndarray, rows: int | None) -> np.ndarray:
        expected = ((rows,) if rows is not None else ()) + spec.dims
        if len(array.shape) != len(expected) or any(
            want != -1 and got != want for got, want in zip(array.shape, expected, strict=True)
        ):
            raise RuntimeError(
                f"output {spec.name} has shape {list(array.shape)}, the config declares {list(expected)}"
            )
        return array
