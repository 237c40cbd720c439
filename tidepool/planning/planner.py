"""`tidepool plan`: batcher settings from profiles and budgets. A pure function with one helper per
setting (each returns its value and the reason for it); one candidate plan per usable profile (a
thread count, a precision), ranked; and the config.pbtxt that carries the chosen one. Needs numpy
and protobuf, never torch."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from tidepool import parameters as param
from tidepool.configfile import ModelConfig, ModelQueuePolicy, read_config, set_instances, write_config
from tidepool.errors import TidepoolError
from tidepool.machine import planned_on_line, usable_cores
from tidepool.planning.profile import BatchPoint, Profile, max_abs_difference

MIB = 2**20
# A size is "clearly faster" when its throughput beats the next larger size's by this much.
PREFERRED_MARGIN = 1.10
POOL_HEADROOM = 1.25  # the pool reserves the measured dynamic peak plus this share
# Candidates whose predicted throughput is within this of the best are ranked by lone latency.
THROUGHPUT_TIE = 0.05


class PlanError(TidepoolError, ValueError):
    """The budgets cannot be met; the message says which and by how much."""


@dataclass(frozen=True)
class Budgets:
    memory_bytes: int
    latency_ms: float
    headroom: float = 0.8  # use at most this share of the memory budget
    cores: int = field(default_factory=usable_cores)  # the CPU affinity's, as the served instances see
    # Write the bounded queue into the config. Off by default: on tritonserver 2.51 any
    # default_queue_policy roughly halved this backend's throughput (see docs/planning.md).
    bounded_queue: bool = False
    # The largest output difference from fp32 (max absolute) a lower precision may have; 0: fp32 only.
    max_output_error: float = 0.0
    # CPU: also plan instances that share the cores among those busy (runtime/cores.py). On by
    # default since the hold follows each instance's gaps: for both example models its worst level
    # was the best of the three ways to split 2 cores (docs/planning.md).
    elastic_threads: bool = True

    @property
    def usable_bytes(self) -> float:
        return self.headroom * self.memory_bytes


@dataclass(frozen=True)
class Choice:
    """One setting of the plan and why it has that value."""

    value: int
    reason: str


@dataclass
class Plan:
    max_batch_size: int
    preferred_batch_sizes: list[int]
    max_queue_delay_us: int
    instance_count: int
    max_queue_size: int
    queue_timeout_us: int
    bounded_queue: bool
    pool_initial_bytes: int
    pool_limit_bytes: int
    reasons: dict[str, str]
    torch_threads: int = 1  # the most one forward pass uses
    # Elastic threads (CPU): each instance takes from min_threads (every instance busy) up to
    # torch_threads (running alone); 0: fixed at torch_threads.
    min_threads: int = 0
    runs_alone_as: Plan | None = field(default=None, repr=False)  # elastic: the plan with every core
    precision: str = "fp32"
    graph: str = "eager"  # or "frozen" (runtime/graph.py)
    predicted_throughput: float = 0.0  # samples/s with every instance busy at its best batch
    lone_latency_ms: float = 0.0  # what a request that arrives alone waits and runs (p50)
    profile: Profile | None = field(default=None, repr=False)  # what it was planned from

    @property
    def label(self) -> str:
        return config_label(
            self.instance_count,
            f"{self.min_threads}-{self.torch_threads}" if self.min_threads else self.torch_threads,
            self.precision,
            self.max_batch_size,
            self.max_queue_delay_us,
            self.graph,
        )

    def describe(self) -> str:
        return "\n".join(
            f"  {label:<30} {getattr(self, attr)!s:<12} {self.reasons.get(attr, '')}"
            for label, attr in PLAN_FIELDS
        )


def config_label(
    instances: int,
    threads: int | str,
    precision: str,
    max_batch_size: int,
    delay_us: int,
    graph: str = "eager",
) -> str:
    """A config's short name, the same for a plan and for what a server serves: '2x1 fp32 b8 d0ms'
    (instances x torch threads, precision, max batch size, queue delay; '2x1-2' for elastic threads,
    'fp32 frozen' for a frozen graph)."""
    runs_as = precision if graph == "eager" else f"{precision} {graph}"
    return f"{instances}x{threads} {runs_as} b{max_batch_size} d{delay_us / 1000:g}ms"


def served_threads(instances: int, threads: int, cores: int, elastic: bool) -> str:
    """A config's threads as its label shows them: with elastic threads (ELASTIC_THREADS true)
    instances that ask for more than the cores share them, '1-2'."""
    if elastic and instances * threads > cores:
        return f"{max(1, cores // instances)}-{threads}"
    return str(threads)


# (name in config.pbtxt, Plan attribute)
PLAN_FIELDS = [
    ("TORCH_NUM_THREADS", "torch_threads"),
    ("PRECISION", "precision"),
    ("GRAPH", "graph"),
    ("max_batch_size", "max_batch_size"),
    ("preferred_batch_size", "preferred_batch_sizes"),
    ("max_queue_delay_microseconds", "max_queue_delay_us"),
    ("instance_group count", "instance_count"),
    ("max_queue_size", "max_queue_size"),
    ("default_timeout_microseconds", "queue_timeout_us"),
    ("POOL_INITIAL_BYTES", "pool_initial_bytes"),
    ("POOL_LIMIT_BYTES", "pool_limit_bytes"),
]


def worst_latency_ms(point: BatchPoint) -> float:
    """A request can arrive just after a batch started: it waits for that batch (a typical one,
    p50) and then runs in its own (the tail, p99)."""
    return point.latency_p50_ms + point.latency_p99_ms


def check_feasible(profile: Profile, budgets: Budgets) -> None:
    if not profile.points:
        raise PlanError("the profile has no measured batch size")
    if profile.predict_bytes(1) > budgets.usable_bytes:
        raise PlanError(
            f"the model alone does not fit: batch 1 needs {profile.predict_bytes(1) / MIB:.1f} MiB "
            f"(weights {profile.static_bytes / MIB:.1f} MiB), {budgets.headroom:.0%} of the budget is "
            f"{budgets.usable_bytes / MIB:.1f} MiB"
        )
    first = min(profile.points, key=lambda p: p.batch)
    if worst_latency_ms(first) > budgets.latency_ms:
        raise PlanError(
            f"batch {first.batch} already takes {first.latency_p99_ms:.1f} ms at p99; a request may wait "
            f"for the batch before it (p50 {first.latency_p50_ms:.1f} ms) and then run its own, so the "
            f"latency budget must be at least {worst_latency_ms(first):.1f} ms "
            f"(it is {budgets.latency_ms} ms)"
        )


def fitting_points(profile: Profile, budgets: Budgets) -> list[BatchPoint]:
    """Profiled batch sizes that fit the memory budget and leave room in the latency budget."""
    return sorted(
        (
            p
            for p in profile.points
            if profile.predict_bytes(p.batch) <= budgets.usable_bytes
            and worst_latency_ms(p) <= budgets.latency_ms
        ),
        key=lambda p: p.batch,
    )


def choose_max_batch_size(profile: Profile, budgets: Budgets, fits: list[BatchPoint]) -> Choice:
    chosen = fits[-1]
    memory_limited = any(
        profile.predict_bytes(p.batch) > budgets.usable_bytes
        for p in profile.points
        if p.batch > chosen.batch
    )
    return Choice(
        chosen.batch,
        f"largest profiled batch with predicted peak {profile.predict_bytes(chosen.batch) / MIB:.1f} MiB "
        f"<= {budgets.usable_bytes / MIB:.1f} MiB and p50 + p99 {worst_latency_ms(chosen):.1f} ms <= "
        f"{budgets.latency_ms} ms" + (" (memory stops the next size)" if memory_limited else ""),
    )


def choose_preferred_sizes(fits: list[BatchPoint]) -> tuple[list[int], str]:
    preferred = [
        a.batch
        for a, b in zip(fits, fits[1:], strict=False)
        if a.throughput >= PREFERRED_MARGIN * b.throughput
    ]
    if preferred:
        return preferred, f"sizes at least {PREFERRED_MARGIN - 1:.0%} faster than the next larger"
    return [], "no size is clearly faster than a larger one"


def lone_point(profile: Profile) -> BatchPoint:
    """The smallest profiled batch: what a request that arrives alone runs in."""
    return min(profile.points, key=lambda p: p.batch)


def choose_queue_delay() -> Choice:
    """No delay. Waiting pays only while an instance is idle and more requests are on their way: a
    request that finds the instance busy waits in the queue anyway, and Triton batches what queued
    with no delay at all, so the delay decides only what light traffic pays. Measured on
    tritonserver 2.51 (encoder, 1 instance x 2 threads, 3 rounds): a 0.54 ms delay cost a lone
    request ~1.5 ms and a 1.08 ms delay ~2.9 ms (concurrency 1: 88.9 -> 78.2 -> 70.9 infer/s), while
    pairing requests at concurrency 2 gained 14-18%; with several instances a delay only holds a
    request that an idle instance could run."""
    return Choice(
        0,
        "none: a request that finds an instance idle runs at once, and while all are busy the queue "
        "forms batches with no delay (a delay cost a lone request ~2.7x its length on tritonserver 2.51)",
    )


def choose_instance_count(profile: Profile, budgets: Budgets, chosen: BatchPoint) -> Choice:
    per_instance = profile.predict_bytes(chosen.batch)
    by_memory = max(1, int(budgets.usable_bytes // per_instance))
    if profile.device == "cpu":
        by_compute = max(1, budgets.cores // max(1, profile.torch_threads))
        compute_reason = f"{budgets.cores} cores / {profile.torch_threads} torch threads = {by_compute}"
    else:
        by_compute = 2  # two instances overlap one's host work with the other's kernels
        compute_reason = "2 per GPU"
    return Choice(
        min(by_memory, by_compute),
        f"min(memory: {by_memory} instances of {per_instance / MIB:.1f} MiB fit, {compute_reason})",
    )


def choose_queue_size(chosen: BatchPoint, budgets: Budgets, instances: int) -> Choice:
    # Requests that the instances can finish inside the latency budget; more would only queue.
    batches_in_budget = max(1, math.floor(budgets.latency_ms / chosen.latency_p99_ms))
    reason = (
        f"{instances} instance(s) x {batches_in_budget} batch(es) of {chosen.batch} "
        f"fit in {budgets.latency_ms} ms"
    )
    if not budgets.bounded_queue:
        reason += UNWRITTEN_QUEUE_NOTE
    return Choice(max(chosen.batch, instances * batches_in_budget * chosen.batch), reason)


UNWRITTEN_QUEUE_NOTE = (
    " (not written: pass --bounded-queue; a queue policy halves throughput on tritonserver 2.51)"
)


def choose_pool_bytes(
    profile: Profile, budgets: Budgets, chosen: BatchPoint, instances: int
) -> tuple[Choice, Choice]:
    limit = int(budgets.memory_bytes / instances)
    dynamic_peak = profile.predict_bytes(chosen.batch) - profile.static_bytes
    initial = min(limit, int(POOL_HEADROOM * dynamic_peak))
    return (
        Choice(initial, f"dynamic peak at batch {chosen.batch} + {POOL_HEADROOM - 1:.0%}"),
        Choice(limit, f"the memory budget / {instances} instance(s)"),
    )


def capacity(profile: Profile, max_batch_size: int, instances: int, overhead_ms: float = 0.0) -> float:
    """Samples/s with every instance busy at its best profiled batch up to max_batch_size, each
    execution `overhead_ms` longer than measured in-process (what serving adds; 0 for a plan)."""
    per_instance = max(
        p.batch * 1000 / (p.batch * 1000 / p.throughput + overhead_ms)
        for p in profile.points
        if p.batch <= max_batch_size and p.throughput > 0
    )
    return instances * per_instance


def output_error(profile: Profile) -> float:
    """The largest absolute difference of the profile's outputs from fp32's (0 for fp32)."""
    return max_abs_difference(profile.output_difference)


def plan_for(profile: Profile, budgets: Budgets, batch_cap: int | None = None) -> Plan:
    """Settings from one profile: the largest batch that fits memory and leaves room in the
    latency budget (and is at most `batch_cap`); instances from memory and cores; a bounded queue
    that rejects overload."""
    check_feasible(profile, budgets)
    fits = [p for p in fitting_points(profile, budgets) if batch_cap is None or p.batch <= batch_cap]
    if not fits:
        raise PlanError(f"no profiled batch size that fits the budgets is at most {batch_cap}")
    batch = choose_max_batch_size(profile, budgets, fits)
    chosen = next(p for p in fits if p.batch == batch.value)
    preferred, preferred_reason = choose_preferred_sizes(fits)
    instances = choose_instance_count(profile, budgets, chosen)
    delay = choose_queue_delay()
    queue_size = choose_queue_size(chosen, budgets, instances.value)
    initial, limit = choose_pool_bytes(profile, budgets, chosen, instances.value)
    timeout_reason = "a request queued for the whole latency budget is rejected, not served late"
    return Plan(
        profile=profile,
        torch_threads=profile.torch_threads,
        precision=profile.precision,
        graph=profile.graph,
        predicted_throughput=capacity(profile, batch.value, instances.value),
        lone_latency_ms=lone_point(profile).latency_p50_ms + delay.value / 1000,
        max_batch_size=batch.value,
        preferred_batch_sizes=preferred,
        max_queue_delay_us=delay.value,
        instance_count=instances.value,
        max_queue_size=queue_size.value,
        queue_timeout_us=int(budgets.latency_ms * 1000),
        bounded_queue=budgets.bounded_queue,
        pool_initial_bytes=initial.value,
        pool_limit_bytes=limit.value,
        reasons={
            "max_batch_size": batch.reason,
            "preferred_batch_sizes": preferred_reason,
            "max_queue_delay_us": delay.reason,
            "instance_count": instances.reason,
            "max_queue_size": queue_size.reason,
            "queue_timeout_us": timeout_reason + ("" if budgets.bounded_queue else UNWRITTEN_QUEUE_NOTE),
            "pool_initial_bytes": initial.reason,
            "pool_limit_bytes": limit.reason,
            "torch_threads": f"as profiled on {profile.machine or 'this machine'}",
            "precision": "fp32" if profile.precision == "fp32"
            else f"outputs within {output_error(profile):.3g} of fp32 (max abs), <= --max-output-error",
            "graph": profile.graph_reason or f"{profile.graph}: as profiled",
        },
    )  # fmt: skip


def candidates(profiles: list[Profile], budgets: Budgets) -> tuple[list[Plan], list[str]]:
    """One plan per profile that may serve (a precision whose outputs stay within the error
    budget, budgets that can be met), best first: by predicted throughput and, within
    THROUGHPUT_TIE of the best, by the latency of a lone request. Also why the others were left out."""
    plans, left_out = [], []
    for profile in profiles:
        name = f"{profile.torch_threads} threads, {profile.precision}"
        error = output_error(profile)
        if profile.precision != "fp32" and (
            not profile.output_difference or error > budgets.max_output_error
        ):
            measured = f"{error:.3g}" if profile.output_difference else "not measured"
            left_out.append(
                f"{name}: output difference {measured} > --max-output-error {budgets.max_output_error}"
            )
            continue
        try:
            plans.append(plan_for(profile, budgets))
        except PlanError as exc:
            left_out.append(f"{name}: {exc}")
    if not plans:
        raise PlanError("no profile can serve within the budgets: " + "; ".join(left_out))
    best = max(p.predicted_throughput for p in plans)

    def rank(p: Plan) -> tuple[bool, float, float]:
        tied = p.predicted_throughput >= (1 - THROUGHPUT_TIE) * best
        return (not tied, 0.0 if tied else -p.predicted_throughput, p.lone_latency_ms)

    if budgets.elastic_threads:
        plans += elastic_plans(plans, budgets)
    return sorted(plans, key=rank), left_out


def elastic_plans(plans: Sequence[Plan], budgets: Budgets) -> list[Plan]:
    """CPU plans with several instances, made elastic: the instances of a split plan may each take
    every core while the others are idle, so a lone request runs as fast as on the plan with all
    cores in one instance, and under load they split the cores as the split plan does."""
    return [
        made_elastic(split, whole)
        for whole in plans
        if whole.profile is not None
        and whole.profile.device == "cpu"
        and whole.torch_threads == budgets.cores
        for split in plans
        if split.precision == whole.precision
        and split.torch_threads < whole.torch_threads
        and split.instance_count > 1
    ]


def made_elastic(split: Plan, whole: Plan) -> Plan:
    """`split`'s instances, each allowed `whole`'s threads while it runs alone."""
    elastic = replace(
        split,
        torch_threads=whole.torch_threads,
        min_threads=split.torch_threads,
        lone_latency_ms=whole.lone_latency_ms,
        runs_alone_as=whole,
        reasons=dict(split.reasons),
    )
    elastic.reasons["torch_threads"] = (
        f"elastic: up to {whole.torch_threads} while an instance runs alone (a lone request "
        f"takes {whole.lone_latency_ms:.1f} ms as on {whole.label}), {split.torch_threads} "
        f"each while all {split.instance_count} are busy (the throughput of {split.label})"
    )
    elastic.reasons["instance_count"] = (
        f"{split.reasons['instance_count']}; written as groups of one with rate-limiter "
        "priorities, so that a lone client stays on the first instance where tritonserver runs "
        "with --rate-limit=execution_count (tidepool serve); without it Triton hands requests to "
        "the instances in turn, and a lone one still runs on every core (its pass overlaps none)"
    )
    return elastic


def shared_batch_plan(full: Plan, budgets: Budgets) -> Plan | None:
    """`full` again with each instance's batch capped at its share of full's max_batch_size (the
    largest fitting profiled batch <= max_batch_size / instances); None where there is no smaller one.

    Why: with several instances and room for a big batch, the first instance to go idle takes every
    queued request while the others run one each, and a closed loop's requests then come back in
    waves. Measured on 2 cores (convnet, 2 instances x 1 thread, concurrency 8): max_batch_size 8
    packed 2.05 rows an execution and served 171-175 infer/s at p99 80-88 ms; 4 packed 2.45 and
    served 181-189 at p99 62-68 ms, and at concurrency 16 the cap cost nothing (196 against 191).
    A single-instance profile cannot see this (119 samples/s at batch 4, 8 and 16 alike), so the
    capped plan is served in verification beside the uncapped one rather than predicted."""
    share = full.max_batch_size // full.instance_count
    if full.profile is None or full.instance_count < 2 or share < 1:
        return None
    try:
        shared = plan_for(full.profile, budgets, batch_cap=share)
    except PlanError:
        return None
    if shared.max_batch_size >= full.max_batch_size or shared.instance_count != full.instance_count:
        return None
    shared.reasons["max_batch_size"] += (
        f"; at most {full.max_batch_size} / {full.instance_count} instances, so that under load each "
        "instance takes its share of the queue instead of one taking every queued request"
    )
    return made_elastic(shared, full.runs_alone_as) if full.runs_alone_as else shared


def to_verify(ranked: Sequence[Plan], count: int, budgets: Budgets) -> list[Plan]:
    """The `count` candidates worth serving: first the best of each way to split the cores under
    load (instances x threads; an elastic plan splits them as its fixed twin does), then the best
    plan of several instances with its batch shared among them (shared_batch_plan), then the next
    best by rank. Predictions that rank one split above another by a few percent are within a
    profile's noise, and how the cores are split is what decides each load level (one instance with
    every core serves a lone request best, one per core a crowd); the first `count` by rank alone
    could all split the cores one way. Elastic and fixed twins differ only for a lone request,
    where the elastic one is ranked first for its latency."""
    firsts: dict[tuple[int, int], Plan] = {}
    for plan in ranked:
        firsts.setdefault((plan.instance_count, plan.min_threads or plan.torch_threads), plan)
    several = next((plan for plan in ranked if plan.instance_count > 1), None)
    shared = shared_batch_plan(several, budgets) if several else None
    preferred = [*firsts.values(), *([shared] if shared else [])]
    preferred += [plan for plan in ranked if all(plan is not p for p in preferred)]
    return preferred[:count]


def thread_splits(cores: int) -> list[int]:
    """Torch threads per instance worth trying on `cores` cores: each divisor, most threads first."""
    return [t for t in range(cores, 0, -1) if cores % t == 0]


def precisions_to_try(device: str, max_output_error: float) -> list[str]:
    if max_output_error <= 0:
        return ["fp32"]  # numerics never change unless asked
    return ["fp32", "bf16", "int8"] if device == "cpu" else ["fp32", "bf16", "fp16"]


def plan(profiles: Profile | list[Profile], budgets: Budgets) -> Plan:
    """The best-ranked candidate (see `candidates`)."""
    return candidates([profiles] if isinstance(profiles, Profile) else profiles, budgets)[0][0]


def planned_config(existing: ModelConfig, result: Plan) -> ModelConfig:
    """A copy of `existing` (inputs, outputs, other parameters kept) with the plan's settings.
    Nothing written depends on max_batch_size staying as planned: warm-up sizes follow it at load."""
    config = ModelConfig()
    config.CopyFrom(existing)
    config.max_batch_size = result.max_batch_size
    batching = config.dynamic_batching
    del batching.preferred_batch_size[:]
    batching.preferred_batch_size.extend(result.preferred_batch_sizes)
    batching.max_queue_delay_microseconds = result.max_queue_delay_us
    batching.ClearField("default_queue_policy")
    if result.bounded_queue:
        policy = batching.default_queue_policy
        policy.max_queue_size = result.max_queue_size
        policy.timeout_action = ModelQueuePolicy.REJECT
        policy.default_timeout_microseconds = result.queue_timeout_us
        policy.allow_timeout_override = False
    # An elastic plan's instances prefer the first of them: a lone client's requests then all
    # run on one warm instance with every core instead of alternating (see set_instances).
    set_instances(config, result.instance_count, prefer_first=result.min_threads > 0)
    # Each planned setting, and whether it is written when it is the default (the precision and
    # the pool's sizes always are, so that a reader of the config sees them).
    planned: list[tuple[param.Parameter[Any], Any, bool]] = [
        (param.TORCH_NUM_THREADS, result.torch_threads, True),
        (param.ELASTIC_THREADS, result.min_threads > 0, False),
        (param.PRECISION, result.precision, True),
        (param.GRAPH, result.graph, False),
        (param.POOL_INITIAL_BYTES, result.pool_initial_bytes, True),
        (param.POOL_LIMIT_BYTES, result.pool_limit_bytes, True),
        (param.POOL_WARMUP_BATCH_SIZES, None, False),  # follows max_batch_size at load
    ]
    for parameter, value, always in planned:
        if value == parameter.default and not always:
            config.parameters.pop(parameter.name, None)
        else:
            config.parameters[parameter.name].string_value = parameter.write(value)
    return config


def plan_header(budgets: Budgets, result: Plan, notes: Sequence[str] = ()) -> list[str]:
    profile = result.profile
    assert profile is not None, "a plan made by plan_for knows its profile"
    point = profile.point(result.max_batch_size)
    return [
        "Generated by `tidepool plan`; edit the budgets and run it again rather than editing by hand.",
        planned_on_line(profile.machine or "an unrecorded machine"),
        f"Budgets: memory {budgets.memory_bytes / MIB:.0f} MiB x headroom {budgets.headroom}, "
        f"latency {budgets.latency_ms} ms, {budgets.cores} cores, output error {budgets.max_output_error}.",
        f"Profile: {profile.device}, {profile.precision}, {profile.graph} graph, {profile.torch_threads} "
        f"torch threads; static "
        f"{profile.static_bytes / MIB:.1f} MiB; memory(b) = static + "
        f"{profile.per_sample_bytes / MIB:.3f} MiB x b + {profile.workspace_bytes / MIB:.3f} MiB.",
        f"At batch {result.max_batch_size}: p50 {point.latency_p50_ms:.1f} ms, "
        f"p99 {point.latency_p99_ms:.1f} ms, {point.throughput:.0f} samples/s."
        if point
        else "",
        *(f"{key}: {reason}" for key, reason in result.reasons.items()),
        *notes,
    ]


def write_plan(model_dir: Path, budgets: Budgets, result: Plan, notes: Sequence[str] = ()) -> Path:
    path = model_dir / "config.pbtxt"
    config = planned_config(read_config(path), result)
    return write_config(path, config, plan_header(budgets, result, notes))
