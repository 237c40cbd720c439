"""One model instance, free of Triton: validates the requests of an execution, gathers the valid
ones into buffers from the instance's memory pool, runs one forward pass, and returns per
request its outputs or its error. The pool lives as long as the instance."""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from backend.batching import Allocate, dummy_inputs, gather, numpy_allocate, split
from backend.config import ConfigError, ModelSpec, dims_match, parse_model_config
from backend.loader import load_model
from backend.validation import RequestError, validate_request
from pool import MemoryPool, OutOfMemory
from pool.host_heap import HeapRetention, minor_page_faults, release_free_pages, retain_freed_memory

Outputs = dict[str, Any]  # numpy arrays on the host, torch tensors on a GPU
Result = Outputs | RequestError

WARMUP_MAX_ROUNDS = 10  # per warm-up batch size, while executions still touch fresh pages
STEADY_PAGE_FAULTS = 64  # an execution below this many minor faults allocated nothing fresh

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


def _batch_sizes_param(model: ModelSpec) -> tuple[int, ...]:
    text = model.param("POOL_WARMUP_BATCH_SIZES")
    if text is None:
        return (1, model.max_batch_size) if model.max_batch_size > 1 else (1,)
    try:
        sizes = tuple(int(part) for part in text.split(",") if part.strip())
    except ValueError:
        raise ConfigError(
            f"parameter POOL_WARMUP_BATCH_SIZES: expected e.g. '1,8,32', got {text!r}"
        ) from None
    if any(size < 1 or (model.batched and size > model.max_batch_size) for size in sizes):
        raise ConfigError(
            f"parameter POOL_WARMUP_BATCH_SIZES: sizes must be in 1..{model.max_batch_size}, got {text!r}"
        )
    return sizes


def apply_precision(module: torch.nn.Module, precision: str) -> torch.nn.Module:
    """The module in the precision it will run in (weights converted once, at load)."""
    if precision == "bf16":
        return module.to(torch.bfloat16)
    if precision == "fp16":
        return module.to(torch.float16)
    if precision == "int8":
        # The fused fast path of nn.Transformer* layers reads float weights; quantized Linear has none.
        torch.backends.mha.set_fastpath_enabled(False)
        return torch.ao.quantization.quantize_dynamic(module, {torch.nn.Linear}, dtype=torch.qint8)
    return module


@dataclass(frozen=True)
class InstanceSettings:
    """Backend parameters of config.pbtxt that shape how an instance runs (README lists them)."""

    torch_threads: int
    allow_nonfinite: bool
    device: str  # "cpu" or "cuda"
    precision: str  # fp32, bf16, fp16 (GPU) or int8 (CPU, dynamic quantization)
    pool_enabled: bool
    pool_kind: str
    pool_limit_bytes: int | None
    pool_initial_bytes: int
    pool_fragmentation_threshold: float
    pool_retain_heap: bool  # keep torch's own freed CPU memory for the next execution
    warmup_batch_sizes: tuple[int, ...]

    @classmethod
    def from_spec(cls, model: ModelSpec) -> InstanceSettings:
        device = model.choice_param("DEVICE", ("auto", "cpu", "cuda"), "auto")
        if device == "auto":
            device = "cuda" if torch.cuda.is_available() else "cpu"
        elif device == "cuda" and not torch.cuda.is_available():
            raise ConfigError("parameter DEVICE is cuda, but torch sees no CUDA device here")
        precision = model.choice_param("PRECISION", ("fp32", "bf16", "fp16", "int8"), "fp32")
        if precision == "fp16" and device == "cpu":
            raise ConfigError("parameter PRECISION: fp16 is for GPU instances; use bf16 or int8 on the CPU")
        if precision == "int8" and device == "cuda":
            raise ConfigError("parameter PRECISION: int8 (dynamic quantization) runs on the CPU only")
        threshold_text = model.param("POOL_FRAGMENTATION_THRESHOLD", "0.10")
        try:
            threshold = float(threshold_text)
        except ValueError:
            raise ConfigError(
                f"parameter POOL_FRAGMENTATION_THRESHOLD: not a number: {threshold_text!r}"
            ) from None
        return cls(
            torch_threads=model.int_param("TORCH_NUM_THREADS", os.cpu_count() or 1, minimum=1),
            allow_nonfinite=model.choice_param("ALLOW_NONFINITE", ("true", "false"), "false") == "true",
            device=device,
            precision=precision,
            pool_enabled=model.choice_param("POOL", ("on", "off"), "on") == "on",
            pool_kind=model.choice_param("POOL_KIND", ("auto", "host", "pinned", "cuda"), "auto"),
            pool_limit_bytes=model.bytes_param("POOL_LIMIT_BYTES"),
            pool_initial_bytes=model.bytes_param("POOL_INITIAL_BYTES") or 0,
            pool_fragmentation_threshold=threshold,
            pool_retain_heap=model.choice_param("POOL_RETAIN_HEAP", ("true", "false"), "true") == "true",
            warmup_batch_sizes=_batch_sizes_param(model),
        )


def _why_heap_not_kept(settings: InstanceSettings) -> str | None:
    if not settings.pool_enabled:
        return "POOL=off"
    if not settings.pool_retain_heap:
        return "POOL_RETAIN_HEAP=false"
    if settings.device != "cpu":
        return "a GPU instance (torch's GPU memory comes from the CUDA pool)"
    return None


class ModelInstance:
    def __init__(self, model: ModelSpec, module: torch.nn.Module, settings: InstanceSettings):
        self.model = model
        self.settings = settings
        self.device = torch.device(settings.device)
        self.pool: MemoryPool | None = None
        self.staging: MemoryPool | None = None  # where batches are gathered (pinned on a GPU)
        self.pools: list[MemoryPool] = []  # each pool once, for scopes and closing
        if settings.pool_enabled:
            kind = settings.pool_kind
            if kind == "auto":
                kind = "cuda" if settings.device == "cuda" else "host"
            self.pool = MemoryPool(
                kind,
                limit_bytes=settings.pool_limit_bytes,
                initial_bytes=settings.pool_initial_bytes,
                fragmentation_threshold=settings.pool_fragmentation_threshold,
            )
            self.staging = self.pool
            if self.pool.kind == "cuda":
                self.staging = MemoryPool("pinned", limit_bytes=settings.pool_limit_bytes)
                if torch.cuda.get_allocator_backend() == "cudaMallocAsync":
                    self.pool.resource.set_as_device_default()  # torch's own allocations too
            self.pools = [self.pool] if self.staging is self.pool else [self.pool, self.staging]
        # torch's own CPU tensors cannot be drawn from the pool; the C heap can keep them instead.
        why_not = _why_heap_not_kept(settings)
        self.heap_retention = (
            retain_freed_memory()
            if why_not is None
            else HeapRetention(False, f"freed memory not kept: {why_not}")
        )
        self.compute_dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(settings.precision)
        self.module = apply_precision(module, settings.precision).to(self.device)
        self.batches_run: list[int] = []  # rows of each forward pass of the last execute
        self.page_faults = 0  # minor page faults during the last execute (memory touched afresh)
        self.warmup_rounds: dict[int, int] = {}  # batch size -> dummy executions warm-up ran

    @classmethod
    def load(cls, model_config: dict[str, Any] | str, model_dir: Path | str) -> ModelInstance:
        model = parse_model_config(model_config)
        settings = InstanceSettings.from_spec(model)
        torch.set_num_threads(settings.torch_threads)
        instance = cls(model, load_model(model_dir, model), settings)
        instance.warm_up()
        return instance

    def warm_up(self) -> None:
        """Dummy batches of each warm-up size, so the first real request is not the slow one: the
        pool reserves what those batches need, and where the C heap keeps freed memory a size is
        run again until its execution touches no fresh page (glibc 2.36 places a large aligned
        block anew a few times before it reuses one)."""
        sizes = self.settings.warmup_batch_sizes if self.model.batched else (1,)
        rounds = WARMUP_MAX_ROUNDS if self.heap_retention.applied else 1
        self.warmup_rounds = {}
        for size in sizes:
            inputs = dummy_inputs(self.model, size)
            for round_number in range(1, rounds + 1):
                [result] = self.execute([inputs])
                if isinstance(result, RequestError):
                    raise RuntimeError(f"warm-up at batch size {size} failed: {result}")
                self.warmup_rounds[size] = round_number
                if self.page_faults < STEADY_PAGE_FAULTS:
                    break
        if self.heap_retention.applied and sizes:
            release_free_pages()  # abandoned places stay free chunks but leave the resident set
            self.execute([dummy_inputs(self.model, max(sizes))])
        self.batches_run = []  # warm-up is not traffic
        self.page_faults = 0

    def close(self) -> None:
        for pool in self.pools:
            pool.close()

    # -- execution ---------------------------------------------------------------------------

    def execute(self, requests: Sequence[dict[str, np.ndarray]]) -> list[Result]:
        """Answer every request, in order: its outputs, or the RequestError that it alone gets."""
        faults_before = minor_page_faults()
        try:
            return self._execute(requests)
        finally:
            self.page_faults = minor_page_faults() - faults_before

    def _execute(self, requests: Sequence[dict[str, np.ndarray]]) -> list[Result]:
        self.batches_run = []
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
            outcomes = self._run_batch([requests[i] for i in valid], batch_sizes)
        else:
            outcomes = [self._run_batch([requests[i]], [0])[0] for i in valid]
        for index, outcome in zip(valid, outcomes, strict=True):
            results[index] = outcome
        return results  # type: ignore[return-value]

    def _run_batch(self, requests: list[dict[str, np.ndarray]], batch_sizes: list[int]) -> list[Result]:
        """One forward pass for these requests; a GPU out-of-memory retries them as two halves."""
        allocate = self._pool_allocate if self.pools else numpy_allocate
        try:
            with ExitStack() as scopes:
                for pool in self.pools:
                    scopes.enter_context(pool.execution())
                return self._forward_split(requests, batch_sizes, allocate)
        except OutOfMemory as error:
            return [self._pool_exhausted(error)] * len(requests)
        except torch.OutOfMemoryError as error:
            if len(requests) < 2:
                return [
                    RequestError(f"the device ran out of memory for this request: {error}", "UNAVAILABLE")
                ]
            half = len(requests) // 2
            return self._run_batch(requests[:half], batch_sizes[:half]) + self._run_batch(
                requests[half:], batch_sizes[half:]
            )
        except RequestError as error:
            return [error] * len(requests)
        except Exception as exc:  # the model's own failure must not take the instance down
            failure = RequestError(f"the model failed: {type(exc).__name__}: {exc}", code="INTERNAL")
            return [failure] * len(requests)

    def _forward_split(self, requests, batch_sizes, allocate: Allocate) -> list[Outputs]:
        if not self.model.batched:
            outputs = self.forward(requests[0], None, allocate)
            self.batches_run.append(1)
            return [outputs]
        rows = sum(batch_sizes)
        if len(requests) == 1 and self.device.type == "cpu":
            batch = requests[0]  # one request is already a batch: no copy at all
        else:
            batch = gather(requests, batch_sizes, self.model, allocate)
        outputs = split(self.forward(batch, rows, allocate), batch_sizes)
        self.batches_run.append(rows)
        return outputs

    def _pool_allocate(self, shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
        assert self.staging is not None
        block = self.staging.allocate(math.prod(shape) * dtype.itemsize)
        return block.as_numpy(dtype, shape)

    def _pool_exhausted(self, error: OutOfMemory) -> RequestError:
        return RequestError(
            f"the model instance's memory pool cannot hold this batch: asked {error.requested} bytes, "
            f"pool limit {error.limit} bytes ({error.reserved} reserved, {error.allocated} in use); "
            "send a smaller batch or raise POOL_LIMIT_BYTES",
            code="UNAVAILABLE",
        )

    def forward(
        self, batch: dict[str, np.ndarray], rows: int | None, allocate: Allocate = numpy_allocate
    ) -> Outputs:
        """One forward pass on numpy inputs; outputs checked against the config. On the host the
        outputs are copied into buffers from `allocate` (the pool's, when it is on)."""
        tensors = [torch.from_numpy(batch[spec.name]) for spec in self.model.inputs]
        if self.compute_dtype is not None:
            tensors = [t.to(self.compute_dtype) if t.is_floating_point() else t for t in tensors]
        if self.device.type == "cuda":
            # From pinned staging (or pageable memory when the pool is off) onto the device.
            tensors = [t.to(self.device, non_blocking=True) for t in tensors]
        with torch.inference_mode():
            produced = self._name_outputs(self.module(*tensors))
            outputs: Outputs = {}
            for spec in self.model.outputs:
                tensor = produced[spec.name].to(_NUMPY_TO_TORCH[spec.dtype])
                self._check_shape(spec, tuple(tensor.shape), rows)
                if self.device.type == "cuda":
                    outputs[spec.name] = tensor.contiguous()  # sent with from_dlpack
                elif allocate is numpy_allocate:
                    outputs[spec.name] = tensor.contiguous().numpy()
                else:
                    out = allocate(tuple(tensor.shape), spec.dtype)
                    torch.from_numpy(out).copy_(tensor)
                    outputs[spec.name] = out
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
                f"the model returned {len(values)} outputs, "
                f"the config declares {len(names)} ({', '.join(names)})"
            )
        return dict(zip(names, values, strict=True))

    @staticmethod
    def _check_shape(spec, shape: tuple[int, ...], rows: int | None) -> None:
        expected = ((rows,) if rows is not None else ()) + spec.dims
        if not dims_match(shape, expected):
            raise RuntimeError(
                f"output {spec.name} has shape {list(shape)}, the config declares {list(expected)}"
            )
