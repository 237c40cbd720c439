"""A repository's models planned together: which models a directory holds, each one's even share
of the node memory budget, the budget of the tier a plan is for, and floors capped to a share."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from tidepool.planning.plan import Plan, PlanError
from tidepool.pool import MemoryPool
from tidepool.pool.budget import format_budget, parse_budget


def tier_budget(text: str, device: str) -> tuple[int, str]:
    """--memory-budget as a size ('2GiB') or per tier as the node budget is written
    ('host=2GiB,cuda:0=10GiB'): the bytes of the tier the model runs on, and how to say it."""
    budget = parse_budget(text, "--memory-budget")
    tier = "host" if device == "cpu" else "cuda:0"
    if tier not in budget:
        raise PlanError(
            f"--memory-budget {text!r} names no {tier} budget, the tier --device {device} plans for"
        )
    return budget[tier], format_budget({tier: budget[tier]})


@dataclass(frozen=True)
class NodeShare:
    """This model's part of a node memory budget that the models of one repository share: its
    budgets' memory, and the floors (POOL_INITIAL_BYTES, which its pools never lend) fit in it."""

    share_bytes: int
    note: str  # for the config's header: the budget, who shares it, and why this share


def repository_models(directory: Path) -> list[Path]:
    """The model to plan: `directory` itself where it holds a config.pbtxt, else every model
    directory in it (a repository, planned together)."""
    if (directory / "config.pbtxt").is_file():
        return [directory]
    if not directory.is_dir():
        raise PlanError(f"{directory} is not a directory")
    models = sorted(p for p in directory.iterdir() if (p / "config.pbtxt").is_file())
    if not models:
        raise PlanError(f"{directory} is neither a model directory nor a repository (no config.pbtxt)")
    return models


def node_shares(models: Sequence[Path], budget_bytes: int, budget_text: str) -> dict[Path, NodeShare]:
    """An even split of the node budget among the models of a repository: each is planned with its
    share, so that whatever each plan holds at its floor, all fit beside each other."""
    share = budget_bytes // len(models)
    names = ", ".join(model.name for model in models)
    return {
        model: NodeShare(
            share,
            f"Node budget: {budget_text} for {len(models)} models planned together ({names}); this one's "
            f"share {share / 2**20:.0f} MiB, an even split, holds its floors (POOL_INITIAL_BYTES, "
            "never lent) and its memory budget above.",
        )
        for model in models
    }


def fit_floors(plan: Plan, share_bytes: int) -> None:
    """Cap POOL_INITIAL_BYTES where the instances' floors (each the power of two a pool reserves
    at start) would pass the model's share of the node budget; the pools borrow the rest."""
    if plan.instance_count * MemoryPool.initial_arena_bytes(plan.pool_initial_bytes) <= share_bytes:
        return
    per_instance = share_bytes // plan.instance_count
    capped = 1 << (per_instance.bit_length() - 1) if per_instance > 0 else 0
    plan.pool_initial_bytes = capped
    plan.reasons["pool_initial_bytes"] = (
        plan.reasons.get("pool_initial_bytes", "")
        + f"; capped at {capped / 2**20:.0f} MiB so that {plan.instance_count} floors fit this model's "
        "share of the node budget (above it the pools borrow what others lend)"
    )
