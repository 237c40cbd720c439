"""Tidepool's figures as Triton custom metrics (next to Triton's own on /metrics): the pool's
gauges and counters, the page faults of executions, a histogram of the batch sizes `execute`
really ran, and for elastic instances the threads of each pass and the time passes waited. The
pool's counters are read after every execution; its fragmentation, which walks its arenas, at most
once per FRAGMENTATION_INTERVAL_S."""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from tidepool.pool import MemoryPool, PoolStats
from tidepool.pool.ledger import NodeLedger

BATCH_SIZE_BUCKETS = [1, 2, 4, 8, 16, 32, 64, 128]

GAUGES = {
    "tidepool_pool_reserved_bytes": ("reserved_bytes", "Bytes the instance's pool holds from upstream"),
    "tidepool_pool_allocated_bytes": ("allocated_bytes", "Bytes of the pool's blocks in use"),
    "tidepool_pool_peak_bytes": ("peak_allocated_bytes", "Peak bytes in use since the instance started"),
    "tidepool_pool_reuse_ratio": (
        "reuse_ratio",
        "Allocations served from memory the pool held / allocations",
    ),
    "tidepool_pool_fragmentation": ("fragmentation", "1 - largest free block / free bytes of the pool"),
    "tidepool_pool_floor_bytes": ("floor_bytes", "Bytes the pool never lends to the node's other pools"),
}
COUNTERS = {
    "tidepool_pool_upstream_allocs_total": ("upstream_allocs", "Allocations the pool asked upstream for"),
    "tidepool_pool_ooms_total": ("num_ooms", "Allocations the pool refused at its limit"),
    "tidepool_budget_trims_total": ("budget_trims", "Trim requests of the node's other pools it answered"),
    "tidepool_budget_denials_total": ("budget_denials", "Reservations the node's memory budget refused it"),
}
# The node's budget and what its whole ledger holds, per tier: every instance reports the same
# figures under its own labels (take the max across instances), read after each execution.
NODE_GAUGES = {
    "tidepool_node_budget_bytes": "The memory budget the server's pools share, per tier",
    "tidepool_node_reserved_bytes": "Bytes every pool of the server holds together, per tier",
}


PAGE_FAULTS = "tidepool_page_faults_total"  # reported with the pool on and off alike
PLAN_GENERATION = "tidepool_plan_generation"
BATCH_SIZE = "tidepool_batch_size"
# Elastic threads only (runtime/cores.py): how the cores were shared, pass by pass.
ELASTIC_THREADS = "tidepool_elastic_threads"
ELASTIC_WAIT = "tidepool_elastic_wait_us_total"
THREAD_BUCKETS = [1, 2, 4, 8, 16, 32, 64, 128]


@dataclass(frozen=True)
class Family:
    """One metric family besides the pool's gauges and counters (GAUGES, COUNTERS)."""

    name: str
    kind: str  # GAUGE, COUNTER or HISTOGRAM, as pb_utils.MetricFamily names them
    description: str
    buckets: tuple[int, ...] = ()  # a histogram's
    elastic_only: bool = False  # created only for instances with elastic threads


FAMILIES = (
    Family(BATCH_SIZE, "HISTOGRAM", "Rows of the batches execute ran through the model",
           tuple(BATCH_SIZE_BUCKETS)),
    Family(PAGE_FAULTS, "COUNTER", "Minor page faults during execute: memory the instance touched afresh"),
    Family(PLAN_GENERATION, "GAUGE",
           "Which config the instance serves: 0 as written, N after the N-th live re-plan"),
    Family(ELASTIC_THREADS, "HISTOGRAM", "Torch threads of each forward pass of an elastic instance",
           tuple(THREAD_BUCKETS), elastic_only=True),
    Family(ELASTIC_WAIT, "COUNTER",
           "Microseconds forward passes of an elastic instance waited for a free core", elastic_only=True),
)  # fmt: skip

# Decimal places kept for ratios, so that a change in the 5th digit does not cost a message.
ROUNDING = {"reuse_ratio": 4, "fragmentation": 3}
# Fragmentation needs the largest free block, found by walking every arena under the pool's lock.
FRAGMENTATION_INTERVAL_S = 1.0


class InstanceMetrics:
    """One instance's metrics; `pb_utils` is passed in so this module imports without Triton."""

    @classmethod
    def create(
        cls, pb_utils: Any, model: str, instance: str, elastic: bool = False, tiers: Sequence[str] = ()
    ) -> tuple[InstanceMetrics | None, str]:
        """The instance's metrics, or None and why not (the server runs with metrics off, e.g.
        `--allow-metrics=false`, and then refuses to create metric families). `elastic`: also the
        torch threads of each forward pass and the time passes waited for a core. `tiers`: the node
        ledgers the instance's pools reserve from."""
        try:
            return cls(pb_utils, model, instance, elastic, tiers), "custom metrics on"
        except Exception as exc:  # the stub raises TritonModelException; its type is not importable
            return None, f"custom metrics off (the server refused them: {exc})"

    def __init__(
        self, pb_utils: Any, model: str, instance: str, elastic: bool = False, tiers: Sequence[str] = ()
    ) -> None:
        family = pb_utils.MetricFamily
        labels = {"model": model, "instance": instance}
        # Triton deletes a family's metrics with the family: keep every family alive here.
        self.families = {
            name: family(name=name, description=text, kind=kind)
            for kind, table in ((family.GAUGE, GAUGES), (family.COUNTER, COUNTERS))
            for name, (_, text) in table.items()
        }
        self.gauges = {
            field: self.families[name].Metric(labels=labels) for name, (field, _) in GAUGES.items()
        }
        self.counters = {
            field: self.families[name].Metric(labels=labels) for name, (field, _) in COUNTERS.items()
        }
        self.counted = dict.fromkeys(self.counters, 0)
        self.last: dict[str, float] = {}
        others: dict[str, Any] = {}
        for spec in FAMILIES:
            if spec.elastic_only and not elastic:
                continue
            made = family(name=spec.name, description=spec.description, kind=getattr(family, spec.kind))
            self.families[spec.name] = made
            buckets = {"buckets": list(spec.buckets)} if spec.buckets else {}
            others[spec.name] = made.Metric(labels=labels, **buckets)
        self.batch_size = others[BATCH_SIZE]
        self.page_faults = others[PAGE_FAULTS]
        self.plan_generation = others[PLAN_GENERATION]
        self.elastic_threads: Any = others.get(ELASTIC_THREADS)
        self.elastic_wait_us: Any = others.get(ELASTIC_WAIT)
        self.walked_at = -FRAGMENTATION_INTERVAL_S
        self.node: dict[str, list[Any]] = {}  # tier -> [budget gauge, reserved gauge]
        if tiers:
            for name, text in NODE_GAUGES.items():
                self.families[name] = family(name=name, description=text, kind=family.GAUGE)
            for tier in tiers:
                tier_labels = {**labels, "tier": tier}
                self.node[tier] = [self.families[name].Metric(labels=tier_labels) for name in NODE_GAUGES]

    def record(self, batches: Sequence[int], page_faults: int, pool: MemoryPool | None) -> None:
        """After an execution: its batch sizes, page faults and the pool's figures."""
        for rows in batches:
            self.record_batch(rows)
        self.record_page_faults(page_faults)
        if pool is not None:
            now = time.monotonic()
            walk = now - self.walked_at >= FRAGMENTATION_INTERVAL_S
            if walk:
                self.walked_at = now
            self.record_pool(pool.stats(walk_arenas=walk))

    def record_node(self, ledgers: Sequence[NodeLedger]) -> None:
        """The node budget and the whole ledger's reserved bytes of each tier, where they changed."""
        for ledger in ledgers:
            gauges = self.node.get(ledger.tier)
            if gauges is None:
                continue
            values = (ledger.budget, ledger.reserved_total())
            for name, gauge, value in zip(NODE_GAUGES, gauges, values, strict=True):
                key = f"{name} {ledger.tier}"
                if self.last.get(key) != value:
                    gauge.set(value)
                    self.last[key] = value

    def record_elastic(self, threads: int, waited_ns: int) -> None:
        """After an elastic instance's execution: the threads it ran with and how long it waited."""
        if self.elastic_threads is not None and threads > 0:
            self.elastic_threads.observe(threads)
            if waited_ns >= 1000:
                self.elastic_wait_us.increment(waited_ns // 1000)

    def record_page_faults(self, count: int) -> None:
        if count > 0:
            self.page_faults.increment(count)

    def record_batch(self, rows: int) -> None:
        if rows > 0:
            self.batch_size.observe(rows)

    def record_pool(self, stats: PoolStats) -> None:
        """Send only what changed: each set() is a message from the stub to the server, and this
        runs after every execution."""
        for field, gauge in self.gauges.items():
            value = getattr(stats, field)
            if value is None:
                continue  # not read this time (fragmentation between walks)
            current = round(float(value), ROUNDING.get(field, 0))
            if self.last.get(field) != current:
                gauge.set(current)
                self.last[field] = current
        for field, counter in self.counters.items():
            grown = int(getattr(stats, field)) - self.counted[field]
            if grown > 0:
                counter.increment(grown)
                self.counted[field] += grown
