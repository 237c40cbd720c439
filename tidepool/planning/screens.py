"""Whether a lower precision or a frozen graph is worth profiling: its outputs against fp32's (or
eager's) within the error budget, or within what batching alone moves them by, and faster; and the
profiles `tidepool plan` takes, each candidate screened first."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from tidepool.planning.profile import Profile, max_abs_difference
from tidepool.planning.profiler import Samples, compare_outputs, differences, profiling_instance, request_rows
from tidepool.planning.quality import QualityBudget, judge
from tidepool.runtime.graph import GraphError
from tidepool.runtime.instance import ModelInstance, Result


def _batching_difference(instance: ModelInstance, batch: int) -> float:
    """How far batching alone moves a request's outputs: `batch` requests run together against each
    run alone, in the same instance (the largest absolute difference)."""
    requests = request_rows(instance, batch, seed=7)

    def kept(result: Result) -> Result:  # a copy: the next execute reuses the pool's blocks
        return result if isinstance(result, Exception) else {k: np.array(v) for k, v in result.items()}

    together = [kept(r) for r in instance.execute(requests).results]
    alone = [kept(instance.execute([request]).results[0]) for request in requests]
    return max_abs_difference(compare_outputs(together, alone, "running requests alone and batched"))


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


QUALITY_ROWS = 32  # rows of inputs the quality budget is measured over


def screen_precision(
    model_dir: Path,
    device: str,
    precision: str,
    quality: QualityBudget,
    batch: int = 8,
    torch_threads: int | None = None,
    seconds: float = 2.0,
    samples: Samples | None = None,
) -> PrecisionScreen:
    """Its outputs against fp32's over QUALITY_ROWS rows (over the budget: not kept), then its speed
    against fp32's at `batch`, the two timed in turn (three rounds, so that drift falls on both)."""
    low = profiling_instance(model_dir, [batch], device, precision, torch_threads, samples=samples)
    full = profiling_instance(model_dir, [batch], device, "fp32", torch_threads, samples=samples)
    try:
        difference = differences(low, full, f"comparing {precision} with fp32", QUALITY_ROWS)
        within, measured = judge(difference, quality)
        if not within:
            reason = f"outputs against fp32: {measured}: over the budget"
            return PrecisionScreen(precision, difference, 0.0, batch, False, reason)
        speedup = _speedup(low, full, request_rows(full, batch, seed=batch), seconds)
        kept = speedup >= SPEEDUP_TO_KEEP
        reason = f"outputs against fp32: {measured}; {speedup:.2f}x its speed at batch {batch}" + (
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
    samples: Samples | None = None,
) -> GraphScreen:
    """Freeze the fp32 model (runtime/graph.py) and keep it where its outputs stay within the error
    budget or within what batching alone moves them by (a request's outputs already differ by
    that between a batch of one and a larger one), and it is faster (GRAPH_SPEEDUP_TO_KEEP)."""
    eager = profiling_instance(model_dir, [GRAPH_BATCH], device, "fp32", torch_threads, samples=samples)
    try:
        try:
            frozen = profiling_instance(
                model_dir, [GRAPH_BATCH], device, "fp32", torch_threads, graph="frozen", samples=samples
            )
        except GraphError as exc:
            return GraphScreen("eager", float("inf"), 0.0, (0.0, 0.0), f"eager: {exc}")
        try:
            error = max_abs_difference(differences(frozen, eager, "comparing frozen with eager", GRAPH_BATCH))
            batching = _batching_difference(eager, GRAPH_BATCH)
            allowed = max(max_output_error, batching)
            if error > allowed:
                reason = (f"eager: frozen outputs differ by {error:.3g}, more than batching alone "
                          f"({batching:.3g}) and --max-output-error {max_output_error}")  # fmt: skip
                return GraphScreen("eager", error, batching, (0.0, 0.0), reason)
            speedups = (
                _speedup(frozen, eager, request_rows(eager, 1, seed=1), seconds / 2),
                _speedup(frozen, eager, request_rows(eager, GRAPH_BATCH, seed=1), seconds / 2),
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


def profiles_to_plan(
    model_dir: Path,
    splits: Sequence[int],
    precisions: Sequence[str],
    quality: QualityBudget,
    measure: Callable[[str, int, dict[str, float] | None, str], Profile],
    device: str = "cpu",
    progress: Callable[[str], None] = lambda text: None,
    samples: Samples | None = None,
) -> tuple[list[Profile], list[PrecisionScreen], GraphScreen]:
    """The profiles a plan chooses from: fp32 at every split (torch threads per instance), and each
    lower precision at every split only where its screen (outputs within the budget, faster than
    fp32; measured at the first split) keeps it; fp32 as a frozen graph where its screen keeps that.
    `measure(precision, threads, known output difference, graph)` takes one profile. Also the
    screens, to say why a precision or graph was left out."""
    progress(f"screening a frozen graph against eager ({splits[0]} threads)")
    graph = screen_graph(model_dir, device, quality.max_abs, torch_threads=splits[0], samples=samples)
    progress(f"graph: {graph.reason}")
    screens = []
    for precision in precisions:
        if precision == "fp32":
            continue
        progress(f"screening {precision} against fp32 ({splits[0]} threads)")
        screen = screen_precision(
            model_dir, device, precision, quality, torch_threads=splits[0], samples=samples
        )
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
