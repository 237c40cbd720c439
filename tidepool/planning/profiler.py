"""`tidepool profile`: memory and latency of a model per batch size, measured through the
backend's own loader, instance and pool (so the process is set up as a served instance's is); and
the profiles `tidepool plan` takes, lower precisions screened against fp32 first."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from tidepool.configfile import read_config_dict
from tidepool.errors import TidepoolError
from tidepool.inputs import random_inputs
from tidepool.machine import describe_machine
from tidepool.planning.memory_tracker import TensorMemoryTracker
from tidepool.planning.profile import (
    PROFILE_BATCH_SIZES,
    SECONDS_PER_POINT,
    BatchPoint,
    Profile,
    max_abs_difference,
)
from tidepool.runtime.graph import GraphError, weight_tensors
from tidepool.runtime.instance import ModelInstance, Result


class ProfileError(TidepoolError):
    """The model could not be measured; says at which batch size and why."""


def _instance(
    model_dir: Path,
    batch_sizes: Sequence[int],
    device: str,
    precision: str,
    torch_threads: int | None = None,
    graph: str = "eager",
) -> ModelInstance:
    config = read_config_dict(model_dir / "config.pbtxt")  # a fresh dict: ours to change
    config["max_batch_size"] = max(int(config.get("max_batch_size", 0)), max(batch_sizes))
    parameters = config.setdefault("parameters", {})
    parameters.update(
        DEVICE={"string_value": device},
        PRECISION={"string_value": precision},
        GRAPH={"string_value": graph},
        POOL={"string_value": "on"},
        POOL_WARMUP_BATCH_SIZES={"string_value": "1"},
    )
    if torch_threads is not None:
        parameters["TORCH_NUM_THREADS"] = {"string_value": str(torch_threads)}
    for key in ("POOL_LIMIT_BYTES", "POOL_INITIAL_BYTES"):  # measure, do not cap
        parameters.pop(key, None)
    return ModelInstance.load(config, model_dir)


def _static_bytes(module: torch.nn.Module) -> int:
    """Bytes of the weights and buffers (quantized packed weights and a frozen graph's constants
    included), shared ones once."""
    seen, total = set(), 0
    for tensor in weight_tensors(module):
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
    instance.execute(requests).release()  # warm-up at this size
    assert instance.pool is not None
    instance.pool.reset_peak()
    tracker = TensorMemoryTracker()
    if instance.device.type == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
    with tracker, instance.execute(requests) as execution:
        failure = next((r for r in execution.results if isinstance(r, Exception)), None)
    if failure is not None:
        raise ProfileError(f"batch {batch} failed: {failure}")
    tensor_bytes = tracker.peak_bytes
    if instance.device.type == "cuda":
        torch.cuda.synchronize()
        tensor_bytes = torch.cuda.max_memory_allocated() - base
    io_bytes = instance.pool.stats().peak_allocated_bytes
    if len(requests) == 1 and instance.device.type == "cpu":
        # One request runs in place, not gathered into the pool; its input still takes memory.
        io_bytes += sum(array.nbytes for array in requests[0].values())
    latencies: list[float] = []
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


def _compare(ours_all: Sequence[Result], reference_all: Sequence[Result], what: str) -> dict[str, float]:
    """Per output, the largest absolute and relative (L2) difference of `ours_all` from `reference_all`."""
    differences: dict[str, float] = {}
    for a, b in zip(ours_all, reference_all, strict=True):
        if isinstance(a, Exception) or isinstance(b, Exception):
            raise ProfileError(f"{what}: a request failed: {a if isinstance(a, Exception) else b}")
        for name in b:
            ours, reference = np.asarray(a[name], dtype=np.float64), np.asarray(b[name], dtype=np.float64)
            differences[f"{name}_max_abs"] = max(
                differences.get(f"{name}_max_abs", 0.0), float(np.abs(ours - reference).max())
            )
            scale = float(np.linalg.norm(reference)) or 1.0
            differences[f"{name}_rel_l2"] = max(
                differences.get(f"{name}_rel_l2", 0.0), float(np.linalg.norm(ours - reference)) / scale
            )
    return differences


def _differences(low: ModelInstance, full: ModelInstance, what: str, batch: int) -> dict[str, float]:
    """How far `low`'s outputs are from `full`'s on the same `batch` requests of one row."""
    requests = _rows(full, batch, seed=7)
    return _compare(low.execute(requests).results, full.execute(requests).results, what)


def _batching_difference(instance: ModelInstance, batch: int) -> float:
    """How far batching alone moves a request's outputs: `batch` requests run together against each
    run alone, in the same instance (the largest absolute difference)."""
    requests = _rows(instance, batch, seed=7)

    def kept(result: Result) -> Result:  # a copy: the next execute reuses the pool's blocks
        return result if isinstance(result, Exception) else {k: np.array(v) for k, v in result.items()}

    together = [kept(r) for r in instance.execute(requests).results]
    alone = [kept(instance.execute([request]).results[0]) for request in requests]
    return max_abs_difference(_compare(together, alone, "running requests alone and batched"))


def output_difference(
    model_dir: Path, device: str, precision: str, batch: int, torch_threads: int | None = None
) -> dict[str, float]:
    """How far `precision`'s outputs are from fp32's on the same inputs."""
    low = _instance(model_dir, [batch], device, precision, torch_threads)
    full = _instance(model_dir, [batch], device, "fp32", torch_threads)
    try:
        return _differences(low, full, f"comparing {precision} with fp32", batch)
    finally:
        low.close()
        full.close()


# A lower precision is profiled only when it is at least this much faster than fp32: otherwise it
# changes the numerics for nothing (bf16 on a CPU without bf16 instructions is slower than fp32).
SPEEDUP_TO_KEEP = 1.05


@dataclass
class PrecisionScreen:
    """Whether a lower precision is worth profiling, from two cheap measurements against fp32."""

    precision: str
    output_difference: dict[str, float]
    speedup: float  # its samples/s over fp32's at `batch`, same threads (0: not timed)
    batch: int
    kept: bool
    reason: str

    @property
    def output_error(self) -> float:
        return max_abs_difference(self.output_difference)


def _samples_per_s(instance: ModelInstance, requests: list[dict[str, np.ndarray]], seconds: float) -> float:
    passes, began = 0, time.perf_counter()
    while passes < 3 or time.perf_counter() - began < seconds:
        instance.execute(requests)
        passes += 1
    return passes * len(requests) / (time.perf_counter() - began)


def _speedup(
    ours: ModelInstance, reference: ModelInstance, requests: list[dict[str, np.ndarray]], seconds: float
) -> float:
    """`ours`'s samples/s over `reference`'s on `requests`, timed in turn for three rounds (so that
    drift falls on both) over `seconds` in all."""
    rates: tuple[list[float], list[float]] = ([], [])
    for _ in range(3):
        for measured, instance in zip(rates, (ours, reference), strict=True):
            measured.append(_samples_per_s(instance, requests, seconds / 6))
    return float(np.median(rates[0]) / np.median(rates[1]))


def screen_precision(
    model_dir: Path,
    device: str,
    precision: str,
    max_output_error: float,
    batch: int = 8,
    torch_threads: int | None = None,
    seconds: float = 2.0,
) -> PrecisionScreen:
    """Its outputs against fp32's (over the budget: not kept), then its speed against fp32's at
    `batch`, the two timed in turn (three rounds, so that drift falls on both)."""
    low = _instance(model_dir, [batch], device, precision, torch_threads)
    full = _instance(model_dir, [batch], device, "fp32", torch_threads)
    try:
        difference = _differences(low, full, f"comparing {precision} with fp32", batch)
        error = max_abs_difference(difference)
        if error > max_output_error:
            reason = f"outputs differ from fp32 by {error:.3g} > --max-output-error {max_output_error}"
            return PrecisionScreen(precision, difference, 0.0, batch, False, reason)
        speedup = _speedup(low, full, _rows(full, batch, seed=batch), seconds)
        kept = speedup >= SPEEDUP_TO_KEEP
        reason = f"outputs within {error:.3g} of fp32, {speedup:.2f}x its speed at batch {batch}" + (
            "" if kept else f" (< {SPEEDUP_TO_KEEP}x: not worth changing the numerics)"
        )
        return PrecisionScreen(precision, difference, speedup, batch, kept, reason)
    finally:
        low.close()
        full.close()


# A frozen graph is profiled when it is at least this much faster than eager for a lone request
# and no slower for a batch (a lone request gains most: it pays the Python per operator alone).
GRAPH_SPEEDUP_TO_KEEP = 1.03
GRAPH_BATCH = 4  # the batch it must not be slower at


@dataclass
class GraphScreen:
    """Which graph the profiles use: frozen where it keeps the outputs and runs faster."""

    graph: str  # "frozen" or "eager"
    error: float  # frozen against eager, max abs (inf: it could not be frozen)
    batching_error: float  # what batching alone does to eager's outputs, max abs
    speedups: tuple[float, float]  # samples/s over eager's, a lone request and GRAPH_BATCH
    reason: str


def screen_graph(
    model_dir: Path,
    device: str,
    max_output_error: float,
    torch_threads: int | None = None,
    seconds: float = 2.0,
) -> GraphScreen:
    """Freeze the fp32 model (runtime/graph.py) and keep it where its outputs stay within the error
    budget or within what batching alone moves them by (a request's outputs already differ by
    that between a batch of one and a larger one), and it is faster (GRAPH_SPEEDUP_TO_KEEP)."""
    eager = _instance(model_dir, [GRAPH_BATCH], device, "fp32", torch_threads)
    try:
        try:
            frozen = _instance(model_dir, [GRAPH_BATCH], device, "fp32", torch_threads, graph="frozen")
        except GraphError as exc:
            return GraphScreen("eager", float("inf"), 0.0, (0.0, 0.0), f"eager: {exc}")
        try:
            error = max_abs_difference(
                _differences(frozen, eager, "comparing frozen with eager", GRAPH_BATCH)
            )
            batching = _batching_difference(eager, GRAPH_BATCH)
            allowed = max(max_output_error, batching)
            if error > allowed:
                reason = (f"eager: frozen outputs differ by {error:.3g}, more than batching alone "
                          f"({batching:.3g}) and --max-output-error {max_output_error}")  # fmt: skip
                return GraphScreen("eager", error, batching, (0.0, 0.0), reason)
            speedups = (
                _speedup(frozen, eager, _rows(eager, 1, seed=1), seconds / 2),
                _speedup(frozen, eager, _rows(eager, GRAPH_BATCH, seed=1), seconds / 2),
            )
        finally:
            frozen.close()
    finally:
        eager.close()
    kept = speedups[0] >= GRAPH_SPEEDUP_TO_KEEP and speedups[1] >= 1 / GRAPH_SPEEDUP_TO_KEEP
    figures = (
        f"outputs within {error:.3g} of eager (batching alone: {batching:.3g}), {speedups[0]:.2f}x its "
        f"speed for a lone request, {speedups[1]:.2f}x at batch {GRAPH_BATCH}"
    )
    if kept:
        return GraphScreen("frozen", error, batching, speedups, f"frozen: {figures}")
    return GraphScreen("eager", error, batching, speedups, f"eager: frozen is not clearly faster ({figures})")


def profile_model(
    model_dir: Path | str,
    batch_sizes: Sequence[int] = PROFILE_BATCH_SIZES,
    device: str = "cpu",
    precision: str = "fp32",
    torch_threads: int | None = None,
    graph: str = "eager",
    max_latency_ms: float | None = None,
    memory_limit_bytes: int | None = None,
    min_iterations: int = 10,
    max_seconds_per_point: float = SECONDS_PER_POINT,
    trace_path: Path | None = None,
    progress: Callable[[str], None] = lambda text: None,
    known_output_difference: dict[str, float] | None = None,
) -> Profile:
    """Every batch size in turn (stopping at the latency or memory limit); for a precision other
    than fp32, also its outputs against fp32's (`known_output_difference` spares measuring them again)."""
    model_dir = Path(model_dir)
    began = time.perf_counter()
    instance = _instance(model_dir, batch_sizes, device, precision, torch_threads, graph)
    profile = Profile(
        model=instance.model.name or model_dir.name,
        device=device,
        precision=precision,
        graph=graph,
        torch_threads=instance.process.torch_threads,
        machine=describe_machine(
            device, torch.cuda.get_device_name(instance.device) if device != "cpu" else None
        ),
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
        if known_output_difference is None:
            progress(f"comparing {precision} outputs with fp32")
            known_output_difference = output_difference(
                model_dir, device, precision, min(4, max(batch_sizes)), torch_threads
            )
        profile.output_difference = dict(known_output_difference)
    profile.seconds = time.perf_counter() - began
    return profile


def _trace(instance: ModelInstance, batch: int, path: Path) -> None:
    """A Chrome trace (chrome://tracing, Perfetto) of one batch."""
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if instance.device.type == "cuda" else [])
    requests = _rows(instance, batch, seed=1)
    with profile(activities=activities, record_shapes=True, profile_memory=True) as prof:
        instance.execute(requests).release()
    path.parent.mkdir(parents=True, exist_ok=True)
    prof.export_chrome_trace(str(path))


def profiles_to_plan(
    model_dir: Path,
    splits: Sequence[int],
    precisions: Sequence[str],
    max_output_error: float,
    measure: Callable[[str, int, dict[str, float] | None, str], Profile],
    device: str = "cpu",
    progress: Callable[[str], None] = lambda text: None,
) -> tuple[list[Profile], list[PrecisionScreen], GraphScreen]:
    """The profiles a plan chooses from: fp32 at every split (torch threads per instance), and each
    lower precision at every split only where its screen (outputs within the budget, faster than
    fp32; measured at the first split) keeps it; fp32 as a frozen graph where its screen keeps that.
    `measure(precision, threads, known output difference, graph)` takes one profile. Also the
    screens, to say why a precision or graph was left out."""
    progress(f"screening a frozen graph against eager ({splits[0]} threads)")
    graph = screen_graph(model_dir, device, max_output_error, torch_threads=splits[0])
    progress(f"graph: {graph.reason}")
    screens = []
    for precision in precisions:
        if precision == "fp32":
            continue
        progress(f"screening {precision} against fp32 ({splits[0]} threads)")
        screen = screen_precision(model_dir, device, precision, max_output_error, torch_threads=splits[0])
        progress(f"{precision}: {screen.reason}")
        screens.append(screen)
    kept = {s.precision: s.output_difference for s in screens if s.kept}
    profiles = []
    for threads in splits:
        for precision in precisions:
            if precision == "fp32":
                profile = measure(precision, threads, None, graph.graph)
                profile.graph_reason = graph.reason
                profiles.append(profile)
            elif precision in kept:
                profiles.append(measure(precision, threads, kept[precision], "eager"))
    return profiles, screens, graph
