"""`tidepool profile`: memory and latency of a model per batch size, measured through the
backend's own loader, instance and pool (so the process is set up as a served instance's is).
Which precisions and graphs are worth profiling is screens.py's."""

from __future__ import annotations

import time
import weakref
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import torch

from tidepool import parameters as param
from tidepool.configfile import read_config_dict
from tidepool.errors import TidepoolError
from tidepool.inputs import describe_generated, load_requests, random_inputs
from tidepool.machine import describe_machine
from tidepool.planning.memory_tracker import TensorMemoryTracker
from tidepool.planning.profile import (
    PROFILE_BATCH_SIZES,
    SECONDS_PER_POINT,
    BatchPoint,
    Profile,
)
from tidepool.planning.quality import row_measures
from tidepool.runtime.graph import weight_tensors
from tidepool.runtime.instance import ModelInstance, Result
from tidepool.runtime.lengths import probe
from tidepool.runtime.validation import RequestError
from tidepool.sequences import Sequences, at_length, model_at_length
from tidepool.spec import parse_model_config

Samples = list[dict[str, np.ndarray]]  # requests of one row each, from an --inputs file
# The samples an instance of the profiler measures with, where it was given some (else it
# generates valid random inputs from the config).
_samples: weakref.WeakKeyDictionary[ModelInstance, Samples] = weakref.WeakKeyDictionary()


class ProfileError(TidepoolError):
    """The model could not be measured; says at which batch size and why."""


def profiling_instance(
    model_dir: Path,
    batch_sizes: Sequence[int],
    device: str,
    precision: str,
    torch_threads: int | None = None,
    graph: str = "eager",
    samples: Samples | None = None,
    length: int | None = None,
) -> ModelInstance:
    """An instance as `tidepool serve` would load it, with the pool on and no cap, measuring with
    `samples` where given (`--inputs`), else with random inputs valid for its config (its sequence
    inputs at `length` where given). Requests of different lengths run each length as its own pass
    here (no ragged warm-up to wait for): lengths.py measures passes of one length at a time."""
    config = read_config_dict(model_dir / "config.pbtxt")  # a fresh dict: ours to change
    config["max_batch_size"] = max(int(config.get("max_batch_size", 0)), max(batch_sizes))
    for tensor in config.get("input", []):
        tensor["allow_ragged_batch"] = False
    parameters = config.setdefault("parameters", {})
    chosen: list[tuple[param.Parameter[Any], Any]] = [
        (param.DEVICE, device), (param.PRECISION, precision), (param.GRAPH, graph), (param.POOL, True),
        (param.POOL_WARMUP_BATCH_SIZES, (1,)),
    ]  # fmt: skip
    if torch_threads is not None:
        chosen.append((param.TORCH_NUM_THREADS, torch_threads))
    parameters.update({p.name: {"string_value": p.write(value)} for p, value in chosen})
    for measured in (param.POOL_LIMIT_BYTES, param.POOL_INITIAL_BYTES):  # measure, do not cap
        parameters.pop(measured.name, None)
    sequences = Sequences.of(parse_model_config(config))
    if length is not None and sequences is not None:
        for spec, axis in zip(sequences.inputs, sequences.axes, strict=True):
            parameters[f"shape.{spec.name}"] = {
                "string_value": ",".join(map(str, at_length(spec, axis, length).shape(None)))
            }
    instance = ModelInstance.load(config, model_dir)
    if samples:
        _samples[instance] = samples
    return instance


def read_samples(path: Path, model_dir: Path) -> Samples:
    """The rows of an --inputs file (.npz or .json; inputs.load_requests), each a request of one row."""
    spec = parse_model_config(read_config_dict(model_dir / "config.pbtxt"))
    samples: Samples = []
    for inputs in load_requests(path, spec):
        if not spec.batched:
            samples.append(inputs)
            continue
        rows = {array.shape[0] if array.ndim else 0 for array in inputs.values()}
        if len(rows) != 1 or 0 in rows:
            raise ProfileError(
                f"{path}: every input needs the same number of rows (one per sample), got {rows}"
            )
        samples += [{name: array[i : i + 1] for name, array in inputs.items()} for i in range(rows.pop())]
    return samples


def input_shapes(instance: ModelInstance) -> dict[str, list[int]]:
    """The shape of one row of each input the instance is measured with."""
    request = request_rows(instance, 1, seed=0)[0]
    cut = 1 if instance.model.batched else 0
    return {name: list(array.shape[cut:]) for name, array in request.items()}


def failure_hint(instance: ModelInstance, failure: Exception) -> str:
    """Where the model itself failed on inputs the profiler generated, what they were and how to
    make them meaningful; nothing for samples or for other failures."""
    if instance in _samples or not (isinstance(failure, RequestError) and failure.code == "INTERNAL"):
        return ""
    tables = [(name, m.num_embeddings) for name, m in instance.module.named_modules()
              if isinstance(m, torch.nn.Embedding)]  # fmt: skip
    embeddings = (
        " The model's nn.Embedding tables have "
        + ", ".join(f"{rows} rows ({name or 'the model'})" for name, rows in tables[:4])
        + ": an integer input that indexes one must stay in [0, rows - 1]."
        if tables
        else ""
    )
    return f". {describe_generated(instance.model)}.{embeddings}"


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


def request_rows(instance: ModelInstance, batch: int, seed: int) -> list[dict[str, np.ndarray]]:
    """`batch` requests of one row each, as the dynamic batcher would hand them over: the
    instance's samples in turn, else random ones."""
    samples = _samples.get(instance)
    if samples:
        return [samples[(seed + i) % len(samples)] for i in range(batch)]
    return [random_inputs(instance.model, batch=1, seed=seed + i) for i in range(batch)]


def measure_point(
    instance: ModelInstance,
    batch: int,
    min_iterations: int,
    max_seconds: float,
    requests: list[dict[str, np.ndarray]] | None = None,
) -> BatchPoint:
    """Memory and latency of `batch` requests of one row (`requests`, else request_rows')."""
    requests = requests or request_rows(instance, batch, seed=batch)
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
        raise ProfileError(f"batch {batch} failed: {failure}{failure_hint(instance, failure)}")
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


def compare_outputs(
    ours_all: Sequence[Result], reference_all: Sequence[Result], what: str
) -> dict[str, float]:
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
            for measure, value in row_measures(ours, reference).items():
                differences[f"{name}_{measure}"] = min(differences.get(f"{name}_{measure}", 1.0), value)
    return differences


def differences(low: ModelInstance, full: ModelInstance, what: str, batch: int) -> dict[str, float]:
    """How far `low`'s outputs are from `full`'s on the same `batch` requests of one row."""
    requests = request_rows(full, batch, seed=7)
    return compare_outputs(low.execute(requests).results, full.execute(requests).results, what)


def output_difference(
    model_dir: Path,
    device: str,
    precision: str,
    batch: int,
    torch_threads: int | None = None,
    samples: Samples | None = None,
) -> dict[str, float]:
    """How far `precision`'s outputs are from fp32's on the same inputs."""
    low = profiling_instance(model_dir, [batch], device, precision, torch_threads, samples=samples)
    full = profiling_instance(model_dir, [batch], device, "fp32", torch_threads, samples=samples)
    try:
        return differences(low, full, f"comparing {precision} with fp32", batch)
    finally:
        low.close()
        full.close()


# A lower precision is profiled only when it is at least this much faster than fp32: otherwise it
# changes the numerics for nothing (bf16 on a CPU without bf16 instructions is slower than fp32).


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
    samples: Samples | None = None,
    length: int | None = None,
) -> Profile:
    """Every batch size in turn (stopping at the latency or memory limit); for a precision other
    than fp32, also its outputs against fp32's (`known_output_difference` spares measuring them
    again). With `samples` (--inputs) it measures on them, at their lengths; else a model's sequence
    inputs at `length` where given (else its shape.<INPUT>)."""
    model_dir = Path(model_dir)
    began = time.perf_counter()
    instance = profiling_instance(
        model_dir, batch_sizes, device, precision, torch_threads, graph, samples, length
    )
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
        input_shapes=input_shapes(instance),
        inputs_from="samples" if samples else "generated",
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
                model_dir, device, precision, min(4, max(batch_sizes)), torch_threads, samples
            )
        profile.output_difference = dict(known_output_difference)
    profile.seconds = time.perf_counter() - began
    return profile


def _trace(instance: ModelInstance, batch: int, path: Path) -> None:
    """A Chrome trace (chrome://tracing, Perfetto) of one batch."""
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if instance.device.type == "cuda" else [])
    requests = request_rows(instance, batch, seed=1)
    with profile(activities=activities, record_shapes=True, profile_memory=True) as prof:
        instance.execute(requests).release()
    path.parent.mkdir(parents=True, exist_ok=True)
    prof.export_chrome_trace(str(path))


MOST_LENGTH_ROWS = 64  # rows a length profile doubles up to


def profile_lengths(
    model_dir: Path,
    profile: Profile,
    lengths: Sequence[int],
    max_latency_ms: float,
    max_seconds_per_point: float = SECONDS_PER_POINT,
    progress: Callable[[str], None] = lambda text: None,
) -> Profile:
    """`profile` with points over rows x length (rows doubled at each length until the latency
    limit or MOST_PROFILED_TOKENS), measured as it was (device, precision, threads, graph); and,
    where padding changes the model's outputs or an output's length does not follow the input's,
    why requests of different lengths cannot share a pass (runtime/lengths.probe)."""
    from tidepool.planning.lengths import MOST_PROFILED_TOKENS

    instance = profiling_instance(
        model_dir, [MOST_LENGTH_ROWS], profile.device, profile.precision, profile.torch_threads, profile.graph
    )
    sequences = instance.sequences
    if sequences is None:
        raise ProfileError(f"{model_dir.name} has no sequence inputs to profile over lengths")
    ragged = replace(
        instance.model, inputs=tuple(replace(s, allow_ragged=True) for s in instance.model.inputs)
    )
    checked = probe(instance.forward, ragged, replace(sequences, grouping="auto"))
    points = []
    seconds = max_seconds_per_point / 2  # many points: each a little shorter
    for length in lengths:
        at = model_at_length(instance.model, sequences, length)
        rows = 1
        while rows <= MOST_LENGTH_ROWS and rows * length <= max(MOST_PROFILED_TOKENS, length):
            progress(f"lengths: {rows} x {length}: measuring")
            requests = [random_inputs(at, batch=1, seed=i) for i in range(rows)]
            point = replace(measure_point(instance, rows, 5, seconds, requests), length=length)
            points.append(point)
            if point.latency_p99_ms > max_latency_ms:
                break
            rows *= 2
    instance.close()
    because = "" if checked.pad else "; ".join(checked.notes) or "padding is off for this model"
    return replace(profile, length_points=points, unpadded_because=because)
