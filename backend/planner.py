"""`tidepool plan`: turns a profile and budgets into batcher settings, a pure function, and
writes them into config.pbtxt as typed protobuf (parsed back and checked before writing)."""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from pathlib import Path

from google.protobuf import json_format, text_format
from tritonclient.grpc import model_config_pb2

from backend.profiler import Profile

MIB = 2**20
# A size is "clearly faster" when its throughput beats the next larger size's by this much.
PREFERRED_MARGIN = 1.10


class PlanError(ValueError):
    """The budgets cannot be met; the message says which and by how much."""


@dataclass(frozen=True)
class Budgets:
    memory_bytes: int
    latency_ms: float
    headroom: float = 0.8  # use at most this share of the memory budget
    cores: int = field(default_factory=lambda: os.cpu_count() or 1)
    # Write the bounded queue into the config. Off by default: on tritonserver 2.51 any
    # default_queue_policy roughly halved this backend's throughput (see README).
    bounded_queue: bool = False


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

    def describe(self) -> str:
        return "\n".join(
            f"  {label:<30} {getattr(self, attr)!s:<12} {self.reasons.get(attr, '')}"
            for label, attr in PLAN_FIELDS
        )


# (name in config.pbtxt, Plan attribute)
PLAN_FIELDS = [
    ("max_batch_size", "max_batch_size"),
    ("preferred_batch_size", "preferred_batch_sizes"),
    ("max_queue_delay_microseconds", "max_queue_delay_us"),
    ("instance_group count", "instance_count"),
    ("max_queue_size", "max_queue_size"),
    ("default_timeout_microseconds", "queue_timeout_us"),
    ("POOL_INITIAL_BYTES", "pool_initial_bytes"),
    ("POOL_LIMIT_BYTES", "pool_limit_bytes"),
]


def worst_latency_ms(point) -> float:
    """A request can arrive just after a batch started: it waits for that batch (a typical one,
    p50) and then runs in its own (the tail, p99)."""
    return point.latency_p50_ms + point.latency_p99_ms


def plan(profile: Profile, budgets: Budgets) -> Plan:
    """Settings from measurements: the largest batch that fits memory and leaves room in the
    latency budget; instances from memory and cores; a bounded queue that rejects overload."""
    if not profile.points:
        raise PlanError("the profile has no measured batch size")
    usable = budgets.headroom * budgets.memory_bytes
    if profile.predict_bytes(1) > usable:
        raise PlanError(
            f"the model alone does not fit: batch 1 needs {profile.predict_bytes(1) / MIB:.1f} MiB "
            f"(weights {profile.static_bytes / MIB:.1f} MiB), {budgets.headroom:.0%} of the budget is "
            f"{usable / MIB:.1f} MiB"
        )
    points = sorted(profile.points, key=lambda p: p.batch)
    first = points[0]
    if worst_latency_ms(first) > budgets.latency_ms:
        raise PlanError(
            f"batch 1 already takes {first.latency_p99_ms:.1f} ms at p99; a request may wait for the batch "
            f"before it (p50 {first.latency_p50_ms:.1f} ms) and then run its own, so the latency budget must "
            f"be at least {worst_latency_ms(first):.1f} ms (it is {budgets.latency_ms} ms)"
        )
    fits = [
        p for p in points
        if profile.predict_bytes(p.batch) <= usable and worst_latency_ms(p) <= budgets.latency_ms
    ]  # fmt: skip
    chosen = max(fits, key=lambda p: p.batch)
    memory_limited = any(profile.predict_bytes(p.batch) > usable for p in points if p.batch > chosen.batch)
    reasons = {
        "max_batch_size": (
            f"largest profiled batch with predicted peak {profile.predict_bytes(chosen.batch) / MIB:.1f} MiB "
            f"<= {usable / MIB:.1f} MiB and p50 + p99 {worst_latency_ms(chosen):.1f} ms <= "
            f"{budgets.latency_ms} ms" + (" (memory stops the next size)" if memory_limited else "")
        )
    }

    preferred = [
        a.batch
        for a, b in zip(fits, fits[1:], strict=False)
        if a.throughput >= PREFERRED_MARGIN * b.throughput
    ]
    reasons["preferred_batch_sizes"] = (
        f"sizes at least {PREFERRED_MARGIN - 1:.0%} faster than the next larger" if preferred
        else "no size is clearly faster than a larger one"
    )  # fmt: skip

    slack_ms = budgets.latency_ms - worst_latency_ms(chosen)
    # Waiting longer than one batch's compute time only adds latency: it does not fill batches faster.
    delay_ms = max(0.0, min(slack_ms, chosen.latency_p50_ms))
    reasons["max_queue_delay_us"] = (
        f"min(latency left {slack_ms:.1f} ms, one batch's p50 {chosen.latency_p50_ms:.1f} ms)"
    )

    per_instance = profile.predict_bytes(chosen.batch)
    by_memory = max(1, int(usable // per_instance))
    if profile.device == "cpu":
        by_compute = max(1, budgets.cores // max(1, profile.torch_threads))
        compute_reason = f"{budgets.cores} cores / {profile.torch_threads} torch threads = {by_compute}"
    else:
        by_compute = 2  # two instances overlap one's host work with the other's kernels
        compute_reason = "2 per GPU"
    instances = min(by_memory, by_compute)
    reasons["instance_count"] = (
        f"min(memory: {by_memory} instances of {per_instance / MIB:.1f} MiB fit, {compute_reason})"
    )

    # Requests that the instances can finish inside the latency budget; more would only queue.
    batches_in_budget = max(1, math.floor(budgets.latency_ms / chosen.latency_p99_ms))
    queue_size = max(chosen.batch, instances * batches_in_budget * chosen.batch)
    reasons["max_queue_size"] = (
        f"{instances} instance(s) x {batches_in_budget} batch(es) of {chosen.batch} "
        f"fit in {budgets.latency_ms} ms"
    )
    reasons["queue_timeout_us"] = "a request queued for the whole latency budget is rejected, not served late"
    if not budgets.bounded_queue:
        note = " (not written: pass --bounded-queue; a queue policy halves throughput on tritonserver 2.51)"
        reasons["max_queue_size"] += note
        reasons["queue_timeout_us"] += note

    limit = int(budgets.memory_bytes / instances)
    initial = min(limit, int(1.25 * (per_instance - profile.static_bytes)))
    reasons["pool_initial_bytes"] = f"dynamic peak at batch {chosen.batch} + 25%"
    reasons["pool_limit_bytes"] = f"the memory budget / {instances} instance(s)"
    return Plan(
        max_batch_size=chosen.batch,
        preferred_batch_sizes=preferred,
        max_queue_delay_us=int(delay_ms * 1000),
        instance_count=instances,
        max_queue_size=queue_size,
        queue_timeout_us=int(budgets.latency_ms * 1000),
        bounded_queue=budgets.bounded_queue,
        pool_initial_bytes=initial,
        pool_limit_bytes=limit,
        reasons=reasons,
    )


def planned_config(existing: model_config_pb2.ModelConfig, result: Plan) -> model_config_pb2.ModelConfig:
    """A copy of `existing` (inputs, outputs, parameters kept) with the plan's settings."""
    config = model_config_pb2.ModelConfig()
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
        policy.timeout_action = model_config_pb2.ModelQueuePolicy.REJECT
        policy.default_timeout_microseconds = result.queue_timeout_us
        policy.allow_timeout_override = False
    if not config.instance_group:
        config.instance_group.add()
    for group in config.instance_group:
        group.count = result.instance_count
    parameters = {
        "POOL_INITIAL_BYTES": str(result.pool_initial_bytes),
        "POOL_LIMIT_BYTES": str(result.pool_limit_bytes),
        "POOL_WARMUP_BATCH_SIZES": ",".join(
            str(b) for b in sorted({1, *result.preferred_batch_sizes, result.max_batch_size})
        ),
    }
    for key, value in parameters.items():
        config.parameters[key].string_value = value
    return config


def config_text(config: model_config_pb2.ModelConfig, header: list[str]) -> str:
    body = text_format.MessageToString(config)
    if "max_batch_size" not in body:  # proto3 drops zero; Triton must see it explicitly
        body = body.replace("\n", f"\nmax_batch_size: {config.max_batch_size}\n", 1)
    return "".join(f"# {line}\n" for line in header) + body


def check_written(text: str, expected: model_config_pb2.ModelConfig) -> None:
    parsed = text_format.Parse(text, model_config_pb2.ModelConfig())
    if json_format.MessageToDict(parsed) != json_format.MessageToDict(expected):
        raise PlanError("the written config does not parse back to the planned settings")


def write_plan(model_dir: Path, profile: Profile, budgets: Budgets, result: Plan) -> Path:
    path = model_dir / "config.pbtxt"
    existing = text_format.Parse(path.read_text(), model_config_pb2.ModelConfig())
    config = planned_config(existing, result)
    p = profile.point(result.max_batch_size)
    header = [
        "Generated by `tidepool plan`; edit the budgets and run it again rather than editing by hand.",
        f"Budgets: memory {budgets.memory_bytes / MIB:.0f} MiB x headroom {budgets.headroom}, "
        f"latency {budgets.latency_ms} ms, {budgets.cores} cores.",
        f"Profile: {profile.device}, {profile.precision}, {profile.torch_threads} torch threads; static "
        f"{profile.static_bytes / MIB:.1f} MiB; "
        f"memory(b) = static + {profile.per_sample_bytes / MIB:.3f} MiB x b "
        f"+ {profile.workspace_bytes / MIB:.3f} MiB.",
        f"At batch {result.max_batch_size}: p50 {p.latency_p50_ms:.1f} ms, p99 {p.latency_p99_ms:.1f} ms, "
        f"{p.throughput:.0f} samples/s."
        if p
        else "",
        *(f"{key}: {reason}" for key, reason in result.reasons.items()),
    ]
    text = config_text(config, [line for line in header if line])
    check_written(text, config)
    temporary = path.with_suffix(".pbtxt.tmp")
    temporary.write_text(text)
    temporary.replace(path)
    return path
