"""How one model instance runs: the backend parameters of its config.pbtxt, checked once, and where
Triton placed it (the kind and device of its instance group)."""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from tidepool import parameters as param
from tidepool.machine import usable_cores
from tidepool.runtime.cores import oversubscribed
from tidepool.spec import ConfigError, ModelSpec


@dataclass(frozen=True)
class Placement:
    """Where Triton put this instance: `kind` is Triton's instance kind ("CPU", "GPU", "MODEL"),
    or None outside Triton (the profiler, tests); `device_id` is the GPU it was given. Inside a
    server its pools share the node's memory budget with the server's other instances (the ledger of
    `server_pid`); outside one (server_pid None) they keep to their own limits."""

    kind: str | None = None
    device_id: int = 0
    model_name: str = ""
    instance_name: str = ""
    server_pid: int | None = None

    @classmethod
    def from_triton_args(cls, args: dict[str, Any]) -> Placement:
        kind = args.get("model_instance_kind") or None
        return cls(
            kind=kind.upper() if kind else None,
            device_id=int(args.get("model_instance_device_id") or 0),
            model_name=str(args.get("model_name", "")),
            instance_name=str(args.get("model_instance_name", "")),
            server_pid=os.getppid(),  # a Python stub is a child of tritonserver
        )


def resolve_device(parameter: str, placement: Placement, cuda_available: Callable[[], bool]) -> str:
    """ "cpu" or "cuda:N" from the DEVICE parameter and Triton's placement. The instance group has
    the last word: a KIND_CPU instance never takes a GPU, a KIND_GPU one takes the GPU Triton gave."""
    kind = placement.kind
    if parameter == "cpu" and kind == "GPU":
        raise ConfigError(
            "parameter DEVICE is cpu, but the instance_group asks for KIND_GPU; make them agree"
        )
    if parameter == "cuda" and kind == "CPU":
        raise ConfigError(
            "parameter DEVICE is cuda, but the instance_group asks for KIND_CPU; make them agree"
        )
    if parameter == "cpu" or kind == "CPU":
        return "cpu"
    if parameter == "cuda" or kind == "GPU":
        if not cuda_available():
            raise ConfigError(
                "this instance is to run on CUDA (parameter DEVICE or instance_group KIND_GPU), "
                "but torch sees no CUDA device here"
            )
        return f"cuda:{placement.device_id}"
    return f"cuda:{placement.device_id}" if cuda_available() else "cpu"  # auto, outside KIND_CPU/GPU


def warmup_batch_sizes(model: ModelSpec) -> tuple[tuple[int, ...], list[str]]:
    """The warm-up batch sizes, and notes for the log. They follow the config's max_batch_size
    (1 and the maximum) unless POOL_WARMUP_BATCH_SIZES lists them; sizes above max_batch_size are
    clamped to it, so a tool that lowers max_batch_size never makes the config fail to load."""
    if not model.batched:
        return (1,), []
    asked = param.POOL_WARMUP_BATCH_SIZES.read(model.parameters)
    if not asked:
        return tuple(sorted({1, model.max_batch_size})), []
    sizes = tuple(sorted({min(size, model.max_batch_size) for size in asked}))
    notes = []
    if max(asked) > model.max_batch_size:
        notes.append(
            f"POOL_WARMUP_BATCH_SIZES {param.sizes_text(asked)} lists sizes above max_batch_size "
            f"{model.max_batch_size}: warming up {param.sizes_text(sizes)} instead"
        )
    return sizes, notes


@dataclass(frozen=True)
class InstanceSettings:
    """Backend parameters of config.pbtxt that shape how an instance runs (docs/ lists them)."""

    torch_threads: int  # the most a forward pass uses (see elastic_threads)
    # CPU instances that together ask for more threads than there are cores: share them among
    # the busy ones (runtime/cores.py).
    elastic_threads: bool
    allow_nonfinite: bool
    # Elastic threads: how long an instance still counts as busy after its forward pass (see
    # runtime/cores.py, DEFAULT_HOLD_US); ELASTIC_HOLD_US.
    elastic_hold_us: int
    device: str  # "cpu" or "cuda:N"
    gpu_outputs: str  # a GPU instance's outputs: "host" (pinned memory) or "device" (GPU_OUTPUTS)
    precision: str  # fp32, bf16, fp16 (GPU) or int8 (CPU, dynamic quantization)
    graph: str  # eager, or frozen (runtime/graph.py)
    pool_enabled: bool
    pool_kind: str
    pool_limit_bytes: int | None
    pool_initial_bytes: int
    pool_fragmentation_threshold: float
    pool_retain_heap: bool  # keep torch's own freed CPU memory for the next execution
    node_budget: bool  # count the pool against the server's shared budget (NODE_BUDGET)
    warmup_batch_sizes: tuple[int, ...]
    notes: tuple[str, ...] = ()  # what was adjusted at load, for the log
    # Set by `tidepool plan --from-server --apply` on each config it loads: which one, and why.
    plan_generation: int = 0
    plan_reason: str = ""

    @property
    def on_gpu(self) -> bool:
        return self.device.startswith("cuda")

    @property
    def device_index(self) -> int:
        return int(self.device.partition(":")[2] or 0) if self.on_gpu else 0

    @property
    def attention_fast_path_off(self) -> bool:
        """int8: quantized Linear has no float weights for torch's fused attention kernel."""
        return self.precision == "int8"

    @classmethod
    def from_spec(
        cls,
        model: ModelSpec,
        placement: Placement | None = None,
        cuda_available: Callable[[], bool] | None = None,
    ) -> InstanceSettings:
        if cuda_available is None:
            import torch

            cuda_available = torch.cuda.is_available
        given = model.parameters
        device = resolve_device(param.DEVICE.read(given), placement or Placement(), cuda_available)
        precision = param.PRECISION.read(given)
        if precision == "fp16" and device == "cpu":
            raise ConfigError("parameter PRECISION: fp16 is for GPU instances; use bf16 or int8 on the CPU")
        if precision == "int8" and device != "cpu":
            raise ConfigError("parameter PRECISION: int8 (dynamic quantization) runs on the CPU only")
        sizes, notes = warmup_batch_sizes(model)
        elastic = param.ELASTIC_THREADS.read(given)
        return cls(
            torch_threads=param.TORCH_NUM_THREADS.read(given) or usable_cores(),
            elastic_threads=elastic and device == "cpu" and oversubscribed(model, usable_cores()),
            elastic_hold_us=param.ELASTIC_HOLD_US.read(given),
            allow_nonfinite=param.ALLOW_NONFINITE.read(given),
            device=device,
            gpu_outputs=param.GPU_OUTPUTS.read(given),
            precision=precision,
            graph=param.GRAPH.read(given),
            pool_enabled=param.POOL.read(given),
            pool_kind=param.POOL_KIND.read(given),
            pool_limit_bytes=param.POOL_LIMIT_BYTES.read(given),
            pool_initial_bytes=param.POOL_INITIAL_BYTES.read(given),
            pool_fragmentation_threshold=param.POOL_FRAGMENTATION_THRESHOLD.read(given),
            pool_retain_heap=param.POOL_RETAIN_HEAP.read(given),
            node_budget=param.NODE_BUDGET.read(given),
            warmup_batch_sizes=sizes,
            notes=tuple(notes),
            plan_generation=param.PLAN_GENERATION.read(given),
            plan_reason=param.PLAN_REASON.read(given),
        )

    def why_heap_not_kept(self) -> str | None:
        """Why torch's freed CPU memory is not kept in the C heap for this instance (None: it is)."""
        if not self.pool_enabled:
            return "POOL=off"
        if not self.pool_retain_heap:
            return "POOL_RETAIN_HEAP=false"
        if self.on_gpu:
            return "a GPU instance (its activations live on the device, with torch's allocator)"
        return None
