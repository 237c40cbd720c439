"""What one tritonserver pod needs to serve a model repository, read from its planned configs: cores,
memory (request and limit), /dev/shm and GPUs, each with the reason, so that a manifest's resources
follow the plan instead of a hand-typed number."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from pathlib import Path

from tidepool import parameters as param
from tidepool.configfile import ModelInstanceGroup, as_dict, read_config
from tidepool.errors import TidepoolError
from tidepool.spec import ModelSpec, parse_model_config

MIB = 2**20
# Measured here (2026-12-06, torch 2.13 CPU): an idle stub with torch imported and the encoder
# loaded is 307-329 MiB resident, ~33 MiB of which are its weights; tritonserver itself 43 MiB.
STUB_BYTES = 300 * MIB
# A stub on a GPU instance also holds the CUDA build's host side (its libraries and the context's
# host memory: ~120 MiB is reported for a context with lazy module loading); not yet measured here,
# so counted twice over. A CPU plan's image installs torch's CPU build, the one STUB_BYTES measured.
CUDA_HOST_BYTES = 256 * MIB
SERVER_BYTES = 256 * MIB  # the server, its HTTP/gRPC buffers, and room for a CUDA image's libraries
# The Python backend gives each stub a 1 MiB shared-memory region and grows it by 1 MiB as tensors
# need; requests and responses in flight, twice over for the growth. Kubernetes' default /dev/shm
# is 64 MB (Triton then fails with "Failed to increase the shared memory pool size"); a
# memory-backed emptyDir is only charged for what is written, so the floor costs nothing idle.
SHM_PER_STUB_BYTES = 1 * MIB
SHM_FLOOR_BYTES = 256 * MIB

_CORES = re.compile(r"^# Budgets: .*?, (\d+) cores,", re.MULTILINE)
_STATIC = re.compile(r"^# Profile: .*?; static ([\d.]+) MiB;", re.MULTILINE)
# The plan's fit of an execution's memory beyond the weights: the pool's blocks and torch's activations.
_DYNAMIC = re.compile(r"memory\(b\) = static \+ ([\d.]+) MiB x b \+ ([\d.]+) MiB")


class DeployError(TidepoolError):
    """A model repository or a setting that manifests cannot be rendered from; says what to change."""


@dataclass(frozen=True)
class ModelNeeds:
    """One model's share of the pod, and where each figure came from."""

    name: str
    instances: int
    gpu_instances: int
    cores: int
    static_bytes: int
    pool_initial_bytes: int
    pool_limit_bytes: int
    shm_bytes: int
    # One execution at max_batch_size beyond the weights (pool blocks and activations), from the
    # plan's memory fit; the pool's floor holds only the blocks.
    execution_bytes: int = 0
    notes: tuple[str, ...] = ()

    @property
    def request_bytes(self) -> int:
        working = max(self.pool_initial_bytes, self.execution_bytes)
        return self.instances * (STUB_BYTES + self.static_bytes + working) + self.cuda_host_bytes

    @property
    def limit_bytes(self) -> int:
        return (
            self.instances * (STUB_BYTES + self.static_bytes + self.pool_limit_bytes) + self.cuda_host_bytes
        )

    @property
    def cuda_host_bytes(self) -> int:
        return self.gpu_instances * CUDA_HOST_BYTES


@dataclass(frozen=True)
class PodNeeds:
    """The pod's resources: the sum over its models, cores shared."""

    models: tuple[ModelNeeds, ...]
    notes: tuple[str, ...] = field(default=())

    @property
    def cores(self) -> int:
        # Every model was planned for the cores of the whole machine, and they share them.
        return max(model.cores for model in self.models)

    @property
    def gpus(self) -> int:
        return 1 if any(model.gpu_instances for model in self.models) else 0

    @property
    def shm_bytes(self) -> int:
        return max(SHM_FLOOR_BYTES, _round_mib(2 * sum(model.shm_bytes for model in self.models)))

    @property
    def memory_request_bytes(self) -> int:
        used_shm = sum(model.shm_bytes for model in self.models)
        return _round_mib(SERVER_BYTES + sum(model.request_bytes for model in self.models) + used_shm)

    @property
    def memory_limit_bytes(self) -> int:
        # A memory-backed /dev/shm counts against the container's limit.
        return _round_mib(SERVER_BYTES + sum(model.limit_bytes for model in self.models) + self.shm_bytes)

    def describe(self) -> list[str]:
        """One line per model and one for the pod, for the manifests' comments and the CLI."""
        lines = [
            f"{m.name}: {m.instances} instance(s)"
            f"{f' ({m.gpu_instances} on GPU)' if m.gpu_instances else ''}, "
            f"planned for {m.cores} cores; per instance {STUB_BYTES // MIB} MiB stub + "
            f"{m.static_bytes / MIB:.0f} MiB weights + an execution {m.execution_bytes / MIB:.0f} MiB (pool "
            f"{m.pool_initial_bytes / MIB:.0f} MiB at start), "
            f"{m.pool_limit_bytes / MIB:.0f} MiB at most"
            + (f"; CUDA's host side {CUDA_HOST_BYTES // MIB} MiB per GPU instance" if m.gpu_instances else "")
            + "".join(f"; {note}" for note in m.notes)
            for m in self.models
        ]
        lines.append(
            f"pod: {self.cores} cores, memory {self.memory_request_bytes // MIB} MiB requested, "
            f"{self.memory_limit_bytes // MIB} MiB limit (server {SERVER_BYTES // MIB} MiB + the instances' "
            f"limits + /dev/shm {self.shm_bytes // MIB} MiB), {self.gpus} GPU"
        )
        return lines


def _round_mib(size: int) -> int:
    return math.ceil(size / MIB) * MIB


def _sample_bytes(spec: ModelSpec) -> int:
    """Bytes of one sample's inputs and outputs (variable dimensions at shape.<NAME>, else 1)."""
    return sum(math.prod(t.shape(None)) * t.dtype.itemsize for t in (*spec.inputs, *spec.outputs))


def model_needs(model_dir: Path) -> ModelNeeds:
    path = model_dir / "config.pbtxt"
    text = path.read_text()
    config = read_config(path)
    spec = parse_model_config(as_dict(config))
    notes = []
    instances = sum(group.count or 1 for group in config.instance_group) or 1
    gpu_instances = sum(
        group.count or 1 for group in config.instance_group if group.kind == ModelInstanceGroup.KIND_GPU
    )
    planned_cores = _CORES.search(text)
    if planned_cores:
        cores = int(planned_cores.group(1))
    else:
        cores = (spec.cpu_instances or 1) * (param.TORCH_NUM_THREADS.read(spec.parameters) or 1)
        notes.append("not planned: cores from instances x TORCH_NUM_THREADS")
    static = _STATIC.search(text)
    if static is None:
        notes.append("not planned: weights not counted")
    initial = param.POOL_INITIAL_BYTES.read(spec.parameters)
    limit = param.POOL_LIMIT_BYTES.read(spec.parameters)
    if limit is None:
        raise DeployError(
            f"{path}: no POOL_LIMIT_BYTES, so nothing bounds what its pool may take and no memory limit "
            "can be derived; plan it (`tidepool plan ... --memory-budget SIZE --write`) or set the parameter"
        )
    dynamic = _DYNAMIC.search(text)
    execution = 0
    if dynamic is not None:
        per_row, workspace = float(dynamic.group(1)), float(dynamic.group(2))
        execution = round((per_row * max(1, spec.max_batch_size) + workspace) * MIB)
    in_flight = 4 * max(1, spec.max_batch_size) * _sample_bytes(spec)  # requests and responses, doubled
    return ModelNeeds(
        name=config.name or model_dir.name,
        instances=instances,
        gpu_instances=gpu_instances,
        cores=cores,
        static_bytes=round(float(static.group(1)) * MIB) if static else 0,
        pool_initial_bytes=initial,
        pool_limit_bytes=limit,
        shm_bytes=instances * (SHM_PER_STUB_BYTES + in_flight),
        execution_bytes=execution,
        notes=tuple(notes),
    )


def pod_needs(model_repository: Path) -> PodNeeds:
    """What one server of `model_repository` needs; DeployError where a model says too little."""
    if not model_repository.is_dir():
        raise DeployError(f"model repository {model_repository} is not a directory")
    model_dirs = sorted(p for p in model_repository.iterdir() if (p / "config.pbtxt").is_file())
    if not model_dirs:
        raise DeployError(f"model repository {model_repository} has no model (no */config.pbtxt)")
    return PodNeeds(tuple(model_needs(model_dir) for model_dir in model_dirs))
