"""One plan from one profile: a helper per setting, each returning its value and the reason for it
(batch size, preferred sizes, queue delay, instance count, queue size, pool sizes), and the
throughput a plan is predicted to serve."""

from __future__ import annotations

import math

from tidepool.planning.plan import MIB, Budgets, Choice, Plan, PlanError
from tidepool.planning.profile import BatchPoint, Profile, max_abs_difference
from tidepool.planning.quality import judge

# A size is "clearly faster" when its throughput beats the next larger size's by this much.
PREFERRED_MARGIN = 1.10
POOL_HEADROOM = 1.25  # the pool reserves the measured blocks of its largest batch plus this share


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
    # The pool holds an execution's gathered inputs and outputs; torch keeps the activations in its
    # own allocator. Sizing the floor by the whole dynamic peak gave the convnet 128 MiB floors
    # where its pool used ~10 MiB, memory that a node budget could never lend to another model.
    initial = min(limit, int(POOL_HEADROOM * chosen.io_bytes))
    return (
        Choice(
            initial,
            f"the pool's blocks at batch {chosen.batch} (gathered inputs and outputs; torch keeps the "
            f"activations) + {POOL_HEADROOM - 1:.0%}",
        ),
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
            else f"outputs against fp32: {judge(profile.output_difference, budgets.quality)[1]}",
            "graph": profile.graph_reason or f"{profile.graph}: as profiled",
        },
    )  # fmt: skip
