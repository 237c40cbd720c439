"""Tidepool's figures as Triton custom metrics (next to Triton's own on /metrics): the pool's
gauges and counters, the node budget, page faults, the batches `execute` ran by size, Python's
garbage collections in the stub and their pause time, and for elastic instances the passes by
thread count and the time they waited for a core.

`execute` only notes its figures; a thread of the instance sends what changed every
TIDEPOOL_METRICS_INTERVAL_S seconds (tritonserver's environment; default 0.5). Each update is a
message from the stub to the server that waits for its answer: sent from `execute`, one to three
of them per execution held every response back by 0.12-0.25 ms (encoder on 2 cores, measured in
the stub: 2-4% of a lone request). So the figures are counters that add up (batches of each size,
not a histogram observed per pass), and /metrics lags the traffic by up to that interval."""

from __future__ import annotations

import os
import threading
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from tidepool.pool import MemoryPool, PoolStats
from tidepool.pool.ledger import NodeLedger
from tidepool.runtime.gc_watch import GENERATIONS, GcTotals, GcWatch
from tidepool.spec import ConfigError

INTERVAL_VARIABLE = "TIDEPOOL_METRICS_INTERVAL_S"
DEFAULT_INTERVAL_S = 0.5
CLOSE_WAIT_S = 5.0  # how long `close` waits for a send under way

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
# figures under its own labels (take the max across instances), read at each flush.
NODE_GAUGES = {
    "tidepool_node_budget_bytes": "The memory budget the server's pools share, per tier",
    "tidepool_node_reserved_bytes": "Bytes every pool of the server holds together, per tier",
}


PAGE_FAULTS = "tidepool_page_faults_total"  # reported with the pool on and off alike
PLAN_GENERATION = "tidepool_plan_generation"
BATCHES = "tidepool_batches_total"  # labelled batch_size: rows of the forward pass
BATCH_ROWS = "tidepool_batch_rows_total"
# Elastic threads only (runtime/cores.py): how the cores were shared, pass by pass.
ELASTIC_PASSES = "tidepool_elastic_passes_total"  # labelled threads
ELASTIC_WAIT = "tidepool_elastic_wait_us_total"
# Python's garbage collector in the instance's stub (runtime/gc_watch.py).
GC_COLLECTIONS = "tidepool_gc_collections_total"  # labelled generation
GC_PAUSE = "tidepool_gc_pause_us_total"
# Models with sequence inputs (runtime/lengths.py): positions sent, and positions padding added.
TOKENS = "tidepool_tokens_total"
PADDED_TOKENS = "tidepool_padded_tokens_total"


@dataclass(frozen=True)
class Family:
    """One metric family besides the pool's gauges and counters (GAUGES, COUNTERS)."""

    name: str
    kind: str  # GAUGE or COUNTER, as pb_utils.MetricFamily names them
    description: str
    label: str = ""  # one metric per value of this label, made as the value first turns up
    # "elastic": only for elastic instances; "gc": only where the GC is watched; "sequences": only
    # for models with sequence inputs
    only_with: str = ""


FAMILIES = (
    Family(BATCHES, "COUNTER", "Forward passes execute ran, by rows in the batch", label="batch_size"),
    Family(BATCH_ROWS, "COUNTER", "Rows of the batches execute ran through the model"),
    Family(PAGE_FAULTS, "COUNTER", "Minor page faults during execute: memory the instance touched afresh"),
    Family(PLAN_GENERATION, "GAUGE",
           "Which config the instance serves: 0 as written, N after the N-th live re-plan"),
    Family(ELASTIC_PASSES, "COUNTER", "Forward passes of an elastic instance, by torch threads",
           label="threads", only_with="elastic"),
    Family(ELASTIC_WAIT, "COUNTER",
           "Microseconds forward passes of an elastic instance waited for a free core", only_with="elastic"),
    Family(GC_COLLECTIONS, "COUNTER", "Python garbage collections in the instance's process, by generation",
           label="generation", only_with="gc"),
    Family(GC_PAUSE, "COUNTER",
           "Microseconds Python's garbage collector stopped the instance's process, execute included",
           only_with="gc"),
    Family(TOKENS, "COUNTER", "Sequence positions the requests sent (inputs that share the sequence axis)",
           only_with="sequences"),
    Family(PADDED_TOKENS, "COUNTER",
           "Positions the forward passes added as padding, to run requests of different lengths together",
           only_with="sequences"),
)  # fmt: skip

# Decimal places kept for ratios, so that a change in the 5th digit does not cost a message.
ROUNDING = {"reuse_ratio": 4, "fragmentation": 3}


def flush_interval_s() -> float:
    """How often an instance sends its metrics, from TIDEPOOL_METRICS_INTERVAL_S."""
    text = os.environ.get(INTERVAL_VARIABLE, "").strip()
    if not text:
        return DEFAULT_INTERVAL_S
    try:
        seconds = float(text)
    except ValueError:
        seconds = -1.0
    if not 0.01 <= seconds <= 60:
        raise ConfigError(f"{INTERVAL_VARIABLE} must be a number of seconds from 0.01 to 60, got {text!r}")
    return seconds


@dataclass
class Noted:
    """What executions noted since the last flush."""

    batches: Counter[int] = field(default_factory=Counter)  # rows -> passes
    page_faults: int = 0
    passes_by_threads: Counter[int] = field(default_factory=Counter)
    waited_ns: int = 0
    tokens: int = 0
    padded_tokens: int = 0


@dataclass(frozen=True)
class MetricSources:
    """What an instance's metrics read at each flush besides what `execute` notes: its pool, the
    node budget's ledgers and the garbage-collector watch; `elastic`: its passes share the cores
    (elastic threads), so the passes by threads and their waits are sent too."""

    pool: MemoryPool | None = None
    ledgers: Sequence[NodeLedger] = ()
    elastic: bool = False
    gc: GcWatch | None = None
    sequences: bool = False  # the model has sequence inputs: its tokens are counted

    def offer(self, only_with: str) -> bool:
        """Whether a family created `only_with` this ("": every instance) applies here."""
        return {"": True, "elastic": self.elastic, "gc": self.gc is not None, "sequences": self.sequences}[
            only_with
        ]


class InstanceMetrics:
    """One instance's metrics; `pb_utils` is passed in so this module imports without Triton."""

    @classmethod
    def create(
        cls, pb_utils: Any, model: str, instance: str, sources: MetricSources
    ) -> tuple[InstanceMetrics | None, str]:
        """The instance's metrics, or None and why not (the server runs with metrics off, e.g.
        `--allow-metrics=false`, and then refuses to create metric families)."""
        try:
            return cls(pb_utils, model, instance, sources), "custom metrics on"
        except Exception as exc:  # the stub raises TritonModelException; its type is not importable
            return None, f"custom metrics off (the server refused them: {exc})"

    def __init__(self, pb_utils: Any, model: str, instance: str, sources: MetricSources) -> None:
        family = pb_utils.MetricFamily
        self.labels = {"model": model, "instance": instance}
        self.sources = sources
        # Triton deletes a family's metrics with the family: keep every family alive here.
        self.families = {
            name: family(name=name, description=text, kind=kind)
            for kind, table in ((family.GAUGE, GAUGES), (family.COUNTER, COUNTERS))
            for name, (_, text) in table.items()
        }
        self.gauges = {stat: self._metric(name) for name, (stat, _) in GAUGES.items()}
        self.counters = {stat: self._metric(name) for name, (stat, _) in COUNTERS.items()}
        self.counted = dict.fromkeys(self.counters, 0)
        self.last: dict[str, float] = {}
        self.metrics: dict[str, Any] = {}  # families without a label
        self.labelled: dict[tuple[str, int], Any] = {}  # (family, label value) -> metric
        for spec in FAMILIES:
            if not sources.offer(spec.only_with):
                continue
            self.families[spec.name] = family(
                name=spec.name, description=spec.description, kind=getattr(family, spec.kind)
            )
            if not spec.label:
                self.metrics[spec.name] = self._metric(spec.name)
        self.node: dict[str, list[Any]] = {}  # tier -> [budget gauge, reserved gauge]
        if sources.ledgers:
            for name, text in NODE_GAUGES.items():
                self.families[name] = family(name=name, description=text, kind=family.GAUGE)
            for ledger in sources.ledgers:
                self.node[ledger.tier] = [self._metric(name, tier=ledger.tier) for name in NODE_GAUGES]
        self.sent_wait_us = 0
        self.waited_ns = 0
        # Where the watch is shared (several instances in one process), only what comes after.
        self.sent_gc = sources.gc.totals() if sources.gc is not None else GcTotals((0,) * GENERATIONS, 0)
        self._noted = Noted()
        self._noted_lock = threading.Lock()  # execute notes while the flush thread takes them
        self._send_lock = threading.Lock()  # one flush at a time
        self._stop = threading.Event()
        self._flusher: threading.Thread | None = None

    # -- from execute: no messages -----------------------------------------------------------

    def note(
        self,
        batches: Sequence[int],
        page_faults: int,
        threads: int = 0,
        waited_ns: int = 0,
        tokens: tuple[int, int] = (0, 0),
    ) -> None:
        """After an execution: its batch sizes and page faults; for an elastic instance, the
        threads its pass ran with and how long it waited for them; the tokens its requests sent and
        the padding its passes added. Sent at the next flush."""
        with self._noted_lock:
            noted = self._noted
            noted.batches.update(rows for rows in batches if rows > 0)
            noted.page_faults += max(0, page_faults)
            noted.tokens += tokens[0]
            noted.padded_tokens += tokens[1]
            if threads > 0:
                noted.passes_by_threads[threads] += 1
                noted.waited_ns += waited_ns

    # -- sending -------------------------------------------------------------------------------

    def start(self, interval_s: float) -> None:
        """Flush every `interval_s` from a daemon thread until `close`."""
        self.interval_s = interval_s
        self._flusher = threading.Thread(target=self._flush_every_interval, name="tidepool-metrics")
        self._flusher.daemon = True
        self._flusher.start()

    def close(self) -> None:
        """Stop the thread and send what is left (not where a send hangs: a server shutting down
        may no longer answer, and the instance must still end)."""
        self._stop.set()
        if self._flusher is not None:
            self._flusher.join(timeout=CLOSE_WAIT_S)
            if self._flusher.is_alive():
                return
        self.flush()

    def _flush_every_interval(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                self.flush()
            except Exception:  # noqa: S112 - a failed send must not end the thread; the next retries
                continue

    def flush(self) -> None:
        """Send what executions noted and what changed in the pool and the node budget."""
        with self._send_lock:
            with self._noted_lock:
                noted, self._noted = self._noted, Noted()
            for rows, passes in sorted(noted.batches.items()):
                self._labelled(BATCHES, "batch_size", rows).increment(passes)
            if noted.batches:
                self.metrics[BATCH_ROWS].increment(sum(rows * n for rows, n in noted.batches.items()))
            if noted.page_faults:
                self.metrics[PAGE_FAULTS].increment(noted.page_faults)
            for name, count in ((TOKENS, noted.tokens), (PADDED_TOKENS, noted.padded_tokens)):
                if count and name in self.metrics:
                    self.metrics[name].increment(count)
            if ELASTIC_WAIT in self.metrics:
                for threads, passes in sorted(noted.passes_by_threads.items()):
                    self._labelled(ELASTIC_PASSES, "threads", threads).increment(passes)
                self.waited_ns += noted.waited_ns
                waited_us = self.waited_ns // 1000
                if waited_us > self.sent_wait_us:
                    self.metrics[ELASTIC_WAIT].increment(waited_us - self.sent_wait_us)
                    self.sent_wait_us = waited_us
            if self.sources.gc is not None:
                self.record_gc(self.sources.gc.totals())
            if self.sources.pool is not None:
                self.record_pool(self.sources.pool.stats())
            self.record_node()

    def set_plan_generation(self, generation: int) -> None:
        self.metrics[PLAN_GENERATION].set(generation)

    def _metric(self, family: str, **labels: str) -> Any:
        return self.families[family].Metric(labels={**self.labels, **labels})

    def _labelled(self, family: str, label: str, value: int) -> Any:
        key = (family, value)
        if key not in self.labelled:
            self.labelled[key] = self._metric(family, **{label: str(value)})
        return self.labelled[key]

    def record_node(self) -> None:
        """The node budget and the whole ledger's reserved bytes of each tier, where they changed."""
        for ledger in self.sources.ledgers:
            values = (ledger.budget, ledger.reserved_total())
            for name, gauge, value in zip(NODE_GAUGES, self.node[ledger.tier], values, strict=True):
                self._set_if_changed(f"{name} {ledger.tier}", gauge, value)

    def record_gc(self, totals: GcTotals) -> None:
        """What the garbage collector did since the last flush: collections and whole microseconds."""
        sent = self.sent_gc
        for generation, (now, before) in enumerate(zip(totals.collections, sent.collections, strict=True)):
            if now > before:
                self._labelled(GC_COLLECTIONS, "generation", generation).increment(now - before)
        pause_us = totals.pause_ns // 1000 - sent.pause_ns // 1000
        if pause_us > 0:
            self.metrics[GC_PAUSE].increment(pause_us)
        self.sent_gc = totals

    def record_pool(self, stats: PoolStats) -> None:
        for stat, gauge in self.gauges.items():
            value = getattr(stats, stat)
            if value is not None:
                self._set_if_changed(stat, gauge, round(float(value), ROUNDING.get(stat, 0)))
        for stat, counter in self.counters.items():
            grown = int(getattr(stats, stat)) - self.counted[stat]
            if grown > 0:
                counter.increment(grown)
                self.counted[stat] += grown

    def _set_if_changed(self, key: str, gauge: Any, value: float) -> None:
        if self.last.get(key) != value:
            gauge.set(value)
            self.last[key] = value
