"""The candidates: one plan per usable profile (a thread count, a precision), their elastic and
shared-batch variants, ranked, and the few worth serving side by side in verification."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from tidepool.planning.choose import plan_for
from tidepool.planning.plan import Budgets, Plan, PlanError
from tidepool.planning.profile import Profile
from tidepool.planning.quality import QualityBudget, judge

# Candidates whose predicted throughput is within this of the best are ranked by lone latency.
THROUGHPUT_TIE = 0.05


def candidates(profiles: list[Profile], budgets: Budgets) -> tuple[list[Plan], list[str]]:
    """One plan per profile that may serve (a precision whose outputs stay within the error
    budget, budgets that can be met), best first: by predicted throughput and, within
    THROUGHPUT_TIE of the best, by the latency of a lone request. Also why the others were left out."""
    plans, left_out = [], []
    for profile in profiles:
        name = f"{profile.torch_threads} threads, {profile.precision}"
        if profile.precision != "fp32":
            kept, measured = judge(profile.output_difference, budgets.quality)
            if not profile.output_difference or not kept:
                left_out.append(f"{name}: outputs against fp32 {measured or 'not measured'}: over the budget")
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


def precisions_to_try(device: str, quality: QualityBudget) -> list[str]:
    if not quality.allows_lower_precision:
        return ["fp32"]  # numerics never change unless asked
    return ["fp32", "bf16", "int8"] if device == "cpu" else ["fp32", "bf16", "fp16"]


def plan(profiles: Profile | list[Profile], budgets: Budgets) -> Plan:
    """The best-ranked candidate (see `candidates`)."""
    return candidates([profiles] if isinstance(profiles, Profile) else profiles, budgets)[0][0]
