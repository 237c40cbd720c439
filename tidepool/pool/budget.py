"""The node's memory budget per tier (`host`, `cuda:N`): parsed from `--memory-budget` or
TIDEPOOL_MEMORY_BUDGET ("host=2GiB,cuda:0=10GiB"), else sized from the machine less headroom."""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from tidepool.machine import CGROUP_ROOT
from tidepool.pool.errors import PoolError
from tidepool.spec import parse_bytes

BUDGET_VARIABLE = "TIDEPOOL_MEMORY_BUDGET"
# Share of the machine's memory (or the device's) the pools of a server may reserve together by
# default: the rest is for the weights, torch's own allocations, the stubs and the server.
DEFAULT_SHARE = 0.8
# cgroup v1 reports "no limit" as a huge number rather than "max".
_NO_CGROUP_LIMIT = 1 << 60


def tier_of(kind: str, device: int | None) -> str:
    """The ledger a pool reserves from: device memory per device, pinned and pageable host memory
    together (both come out of the machine's RAM)."""
    return f"cuda:{device or 0}" if kind == "cuda" else "host"


def _check_tier(tier: str, where: str) -> str:
    if tier == "host" or (tier.startswith("cuda:") and tier[5:].isdigit()):
        return tier
    raise PoolError(f"{where}: a tier is `host` or `cuda:N`, got {tier!r} (e.g. host=2GiB,cuda:0=10GiB)")


def parse_budget(text: str, where: str = BUDGET_VARIABLE) -> dict[str, int]:
    """'host=2GiB,cuda:0=10GiB' -> {'host': 2147483648, 'cuda:0': 10737418240}. A bare size is
    the host tier's."""
    budget: dict[str, int] = {}
    for part in (p.strip() for p in text.split(",")):
        if not part:
            continue
        tier, sep, size = part.rpartition("=")
        tier = _check_tier(tier.strip() if sep else "host", where)
        try:
            nbytes = parse_bytes(size, f"{where} ({tier})")
        except Exception as exc:
            raise PoolError(str(exc)) from None
        if nbytes <= 0:
            raise PoolError(f"{where}: the {tier} budget must be above 0, got {size!r}")
        budget[tier] = nbytes
    if not budget:
        raise PoolError(f"{where}: expected e.g. host=2GiB,cuda:0=10GiB, got {text!r}")
    return budget


def format_budget(budget: dict[str, int]) -> str:
    return ",".join(f"{tier}={nbytes / 2**20:.0f}MiB" for tier, nbytes in budget.items())


def cgroup_memory_limit(root: Path = CGROUP_ROOT) -> int | None:
    """This process's cgroup memory limit (a container's, Kubernetes' memory limit), or None."""
    for path in (root / "memory.max", root / "memory" / "memory.limit_in_bytes"):
        try:
            text = path.read_text().strip()
        except OSError:
            continue
        if text == "max":
            return None
        try:
            value = int(text)
        except ValueError:
            continue
        return value if value < _NO_CGROUP_LIMIT else None
    return None


def total_memory(meminfo: Path = Path("/proc/meminfo")) -> int:
    for line in meminfo.read_text().splitlines():
        if line.startswith("MemTotal:"):
            return int(line.split()[1]) * 1024
    raise PoolError(f"no MemTotal in {meminfo}")


@dataclass(frozen=True)
class TierBudget:
    tier: str
    nbytes: int
    why: str  # where the figure came from, for the log and `tidepool status`


def budget_for(
    tier: str,
    environ: dict[str, str] | None = None,
    device_total: Callable[[int], int] | None = None,
) -> TierBudget:
    """The tier's budget: TIDEPOOL_MEMORY_BUDGET where it names the tier, else DEFAULT_SHARE of the
    cgroup's memory limit (else the machine's memory), or of the device's memory."""
    environ = dict(os.environ) if environ is None else environ
    given = environ.get(BUDGET_VARIABLE, "").strip()
    if given:
        budget = parse_budget(given)
        if tier in budget:
            return TierBudget(tier, budget[tier], f"{BUDGET_VARIABLE}={given}")
    share = f"{DEFAULT_SHARE:.0%}"
    if tier == "host":
        limit = cgroup_memory_limit()
        whole, source = (limit, "the cgroup's memory limit") if limit else (total_memory(), "total memory")
    else:
        from tidepool.pool.resources.driver import device_total_bytes

        whole, source = (device_total or device_total_bytes)(int(tier[5:])), f"{tier}'s memory"
    return TierBudget(
        tier,
        int(whole * DEFAULT_SHARE),
        f"default: {share} of {source} ({whole / 2**30:.1f} GiB); set {BUDGET_VARIABLE} to change it",
    )
