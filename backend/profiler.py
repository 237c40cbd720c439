"""`tidepool profile`: memory and latency of a model per batch size, measured through the
backend's own loader, instance and pool; a fit memory(b) = static + per_sample * b + workspace
with each point's error; JSON, a short report and plots."""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import torch

from backend.config import read_config_pbtxt
from backend.instance import ModelInstance
from backend.memory_tracker import TensorMemoryTracker
from clients.inputs import random_inputs


@dataclass
class BatchPoint:
    batch: int
    io_bytes: int  # the execution's pool blocks: gathered inputs and outputs
    tensor_bytes: int  # peak of torch's own tensors during the forward pass
    latency_p50_ms: float
    latency_p99_ms: float
    throughput: float  # samples per second
    predicted_bytes: int = 0  # from the fit, static included
    fit_error: float = 0.0  # (predicted - measured) / measured, static included

    @property
    def dynamic_bytes(self) -> int:
        return self.io_bytes + self.tensor_bytes


@dataclass
class Profile:
    model: str
    device: str
    precision: str
    torch_threads: int
    static_bytes: int  # parameters and buffers
    points: list[BatchPoint]
    per_sample_bytes: float = 0.0
    workspace_bytes: float = 0.0
    stopped_because: str = "every batch size asked for was measured"
    output_difference: dict[str, float] = field(default_factory=dict)  # against fp32
    seconds: float = 0.0

    def predict_bytes(self, batch: int) -> int:
        return int(self.static_bytes + self.per_sample_bytes * batch + self.workspace_bytes)

    def point(self, batch: int) -> BatchPoint | None:
        return next((p for p in self.points if p.batch == batch), None)

    def fit(self) -> None:
        """Least squares on dynamic bytes = per_sample * b + workspace (workspace >= 0)."""
        batches = np.array([p.batch for p in self.points], dtype=float)
        dynamic = np.array([p.dynamic_bytes for p in self.points], dtype=float)
        if len(batches) >= 2:
            slope, intercept = np.polyfit(batches, dynamic, 1)
        else:
            slope, intercept = dynamic[0] / batches[0], 0.0
        if intercept < 0:
            slope, intercept = float((batches @ dynamic) / (batches @ batches)), 0.0
        self.per_sample_bytes, self.workspace_bytes = float(slope), float(intercept)
        for p in self.points:
            p.predicted_bytes = self.predict_bytes(p.batch)
            measured = self.static_bytes + p.dynamic_bytes
            p.fit_error = (p.predicted_bytes - measured) / measured

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2)

    @classmethod
    def from_json(cls, text: str) -> Profile:
        data = json.loads(text)
        data["points"] = [BatchPoint(**p) for p in data["points"]]
        return cls(**data)


def _instance(model_dir: Path, batch_sizes: Sequence[int], device: str, precision: str) -> ModelInstance:
    config = read_config_pbtxt(model_dir / "config.pbtxt")  # a fresh dict: ours to change
    config["max_batch_size"] = max(int(config.get("max_batch_size", 0)), max(batch_sizes))
    parameters = config.setdefault("parameters", {})
    parameters.update(
        DEVICE={"string_value": device},
        PRECISION={"string_value": precision},
        POOL={"string_value": "on"},
        POOL_WARMUP_BATCH_SIZES={"string_value": "1"},
    )
    for key in ("POOL_LIMIT_BYTES", "POOL_INITIAL_BYTES"):  # measure, do not cap
        parameters.pop(key, None)
    return ModelInstance.load(config, model_dir)


def _static_bytes(module: torch.nn.Module) -> int:
    """Bytes of the weights and buffers (quantized packed weights included), shared ones once."""
    from torch.utils._pytree import tree_flatten

    seen, total = set(), 0
    for tensor in tree_flatten(dict(module.state_dict()))[0]:
        if not isinstance(tensor, torch.Tensor):
            continue
        key = id(tensor) if tensor.is_quantized else tensor.untyped_storage().data_ptr()
        if key not in seen:
            seen.add(key)
            total += tensor.numel() * tensor.element_size()
    return total


def _rows(instance: ModelInstance, batch: int, seed: int) -> list[dict[str, np.ndarray]]:
    """`batch` requests of one row each, as the dynamic batcher would hand them over."""
    return [random_inputs(instance.model, batch=1, seed=seed + i) for i in range(batch)]


def measure_point(instance: ModelInstance, batch: int, min_iterations: int, max_seconds: float) -> BatchPoint:
    requests = _rows(instance, batch, seed=batch)
    instance.execute(requests)  # warm-up at this size
    assert instance.pool is not None
    instance.pool.reset_peak()
    tracker = TensorMemoryTracker()
    if instance.device.type == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
    with tracker:
        results = instance.execute(requests)
    if any(isinstance(r, Exception) for r in results):
        raise RuntimeError(f"batch {batch} failed: {next(r for r in results if isinstance(r, Exception))}")
    tensor_bytes = tracker.peak_bytes
    if instance.device.type == "cuda":
        torch.cuda.synchronize()
        tensor_bytes = torch.cuda.max_memory_allocated() - base
    io_bytes = instance.pool.stats().peak_allocated_bytes
    if len(requests) == 1 and instance.device.type == "cpu":
        # One request runs in place, not gathered into the pool; its input still takes memory.
        io_bytes += sum(array.nbytes for array in requests[0].values())
    latencies = []
    began = time.perf_counter()
    while len(latencies) < min_iterations or (
        time.perf_counter() - began < max_seconds and len(latencies) < 200
    ):
        start = time.perf_counter()
        instance.execute(requests)
        if instance.device.type == "cuda":
            torch.cuda.synchronize()
        latencies.append((time.perf_counter() - start) * 1e3)
        if time.perf_counter() - began > max_seconds and len(latencies) >= 3:
            break
    return BatchPoint(
        batch=batch,
        io_bytes=io_bytes,
        tensor_bytes=tensor_bytes,
        latency_p50_ms=float(np.percentile(latencies, 50)),
        latency_p99_ms=float(np.percentile(latencies, 99)),
        throughput=batch * len(latencies) / (sum(latencies) / 1e3),
    )


def output_difference(model_dir: Path, device: str, precision: str, batch: int) -> dict[str, float]:
    """How far `precision`'s outputs are from fp32's on the same inputs."""
    low = _instance(model_dir, [batch], device, precision)
    full = _instance(model_dir, [batch], device, "fp32")
    requests = _rows(full, batch, seed=7)
    differences = {}
    for a, b in zip(low.execute(requests), full.execute(requests), strict=True):
        for name in b:
            ours, reference = np.asarray(a[name], dtype=np.float64), np.asarray(b[name], dtype=np.float64)
            differences[f"{name}_max_abs"] = max(
                differences.get(f"{name}_max_abs", 0.0), float(np.abs(ours - reference).max())
            )
            scale = float(np.linalg.norm(reference)) or 1.0
            differences[f"{name}_rel_l2"] = max(
                differences.get(f"{name}_rel_l2", 0.0), float(np.linalg.norm(ours - reference)) / scale
            )
    low.close()
    full.close()
    return differences


def profile_model(
    model_dir: Path | str,
    batch_sizes: Sequence[int] = (1, 2, 4, 8, 16, 32),
    device: str = "cpu",
    precision: str = "fp32",
    max_latency_ms: float | None = None,
    memory_limit_bytes: int | None = None,
    min_iterations: int = 10,
    max_seconds_per_point: float = 3.0,
    trace_path: Path | None = None,
    progress: Callable[[str], None] = lambda text: None,
) -> Profile:
    model_dir = Path(model_dir)
    began = time.perf_counter()
    instance = _instance(model_dir, batch_sizes, device, precision)
    profile = Profile(
        model=instance.model.name or model_dir.name,
        device=device,
        precision=precision,
        torch_threads=torch.get_num_threads(),
        static_bytes=_static_bytes(instance.module),
        points=[],
    )
    for index, batch in enumerate(sorted(batch_sizes)):
        progress(f"[{index + 1}/{len(batch_sizes)}] batch {batch}: measuring")
        point = measure_point(instance, batch, min_iterations, max_seconds_per_point)
        profile.points.append(point)
        progress(
            f"[{index + 1}/{len(batch_sizes)}] batch {batch}: p99 {point.latency_p99_ms:.1f} ms, "
            f"{point.throughput:.0f} samples/s, dynamic {point.dynamic_bytes / 2**20:.1f} MiB"
        )
        if max_latency_ms is not None and point.latency_p99_ms > max_latency_ms:
            profile.stopped_because = (
                f"p99 {point.latency_p99_ms:.1f} ms at batch {batch} > {max_latency_ms} ms"
            )
            break
        total = profile.static_bytes + point.dynamic_bytes
        if memory_limit_bytes is not None and total > memory_limit_bytes:
            profile.stopped_because = f"{total} bytes at batch {batch} > limit {memory_limit_bytes}"
            break
    profile.fit()
    if trace_path is not None:
        _trace(instance, profile.points[-1].batch, trace_path)
    instance.close()
    if precision != "fp32":
        progress(f"comparing {precision} outputs with fp32")
        profile.output_difference = output_difference(model_dir, device, precision, min(4, max(batch_sizes)))
    profile.seconds = time.perf_counter() - began
    return profile


def _trace(instance: ModelInstance, batch: int, path: Path) -> None:
    """A Chrome trace (chrome://tracing, Perfetto) of one batch."""
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if instance.device.type == "cuda" else [])
    requests = _rows(instance, batch, seed=1)
    with profile(activities=activities, record_shapes=True, profile_memory=True) as prof:
        instance.execute(requests)
    path.parent.mkdir(parents=True, exist_ok=True)
    prof.export_chrome_trace(str(path))


def write_report(profile: Profile, out_json: Path) -> list[Path]:
    """profile.json, a Markdown report and three plots beside it."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out_json.parent.mkdir(parents=True, exist_ok=True)
    out_json.write_text(profile.to_json())
    stem = out_json.with_suffix("")
    batches = [p.batch for p in profile.points]
    plots = {
        "memory": ("memory (MiB)", [(profile.static_bytes + p.dynamic_bytes) / 2**20 for p in profile.points],
                   [p.predicted_bytes / 2**20 for p in profile.points]),
        "latency": ("latency p50 / p99 (ms)", [p.latency_p50_ms for p in profile.points],
                    [p.latency_p99_ms for p in profile.points]),
        "throughput": ("throughput (samples/s)", [p.throughput for p in profile.points], None),
    }  # fmt: skip
    written = [out_json]
    for name, (label, first, second) in plots.items():
        figure, axes = plt.subplots(figsize=(5, 3.5))
        axes.plot(batches, first, marker="o", label="measured" if name == "memory" else "p50")
        if second is not None:
            axes.plot(batches, second, marker="x", linestyle="--", label="fit" if name == "memory" else "p99")
            axes.legend()
        axes.set_xscale("log", base=2)
        axes.set_xlabel("batch size")
        axes.set_ylabel(label)
        axes.set_title(f"{profile.model} ({profile.device}, {profile.precision})")
        axes.grid(alpha=0.3)
        figure.tight_layout()
        path = Path(f"{stem}_{name}.png")
        figure.savefig(path, dpi=100)
        plt.close(figure)
        written.append(path)
    report = Path(f"{stem}.md")
    report.write_text(format_report(profile))
    written.append(report)
    return written


def format_report(profile: Profile) -> str:
    mib = 2**20
    lines = [
        f"# Profile of {profile.model} ({profile.device}, {profile.precision}, "
        f"{profile.torch_threads} torch threads)",
        "",
        f"static (weights and buffers): {profile.static_bytes / mib:.2f} MiB; fit: memory(b) = static + "
        f"{profile.per_sample_bytes / mib:.3f} MiB x b + {profile.workspace_bytes / mib:.3f} MiB",
        f"stopped: {profile.stopped_because}; took {profile.seconds:.1f} s",
        "",
        "| batch | dynamic MiB | measured MiB | predicted MiB | error | p50 ms | p99 ms | samples/s |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for p in profile.points:
        measured = (profile.static_bytes + p.dynamic_bytes) / mib
        lines.append(
            f"| {p.batch} | {p.dynamic_bytes / mib:.2f} | {measured:.2f} | {p.predicted_bytes / mib:.2f} | "
            f"{p.fit_error:+.1%} | {p.latency_p50_ms:.1f} | {p.latency_p99_ms:.1f} | {p.throughput:.0f} |"
        )
    if profile.output_difference:
        lines += ["", "output difference against fp32: "
                  + ", ".join(f"{k} {v:.3g}" for k, v in profile.output_difference.items())]  # fmt: skip
    worst = max((abs(p.fit_error) for p in profile.points), default=math.nan)
    lines += ["", f"largest fit error: {worst:.1%}"]
    return "\n".join(lines) + "\n"
