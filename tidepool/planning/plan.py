"""The plan and what it is planned against: budgets, one setting's choice with its reason, the
plan itself, and its label (the same for a plan and for what a server serves, '2x1 fp32 b8 d0ms').
Like the rest of the planner it never imports torch."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from tidepool import parameters as param
from tidepool.errors import TidepoolError
from tidepool.machine import usable_cores
from tidepool.planning.profile import Profile
from tidepool.planning.quality import QualityBudget

if TYPE_CHECKING:
    from tidepool.planning.lengths import LengthPlan

MIB = 2**20
# What `tidepool plan --verify` serves each candidate at: closed-loop levels, seconds per window.
VERIFY_LEVELS = (1, 2, 4, 8, 16)
VERIFY_WINDOW_S = 1.0  # one window per candidate and level, a second where the order is close


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
    # What a lower precision must keep of fp32's outputs (quality.py); the default: fp32 only.
    quality: QualityBudget = field(default_factory=QualityBudget)
    # CPU: also plan instances that share the cores among those busy (runtime/cores.py). On by
    # default since the hold follows each instance's gaps: for both example models its worst level
    # was the best of the three ways to split 2 cores (docs/planning.md).
    elastic_threads: bool = True

    @property
    def max_output_error(self) -> float:
        return self.quality.max_abs

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
    lengths: LengthPlan | None = field(default=None, repr=False)  # requests of different lengths together

    @property
    def key(self) -> ConfigKey:
        return ConfigKey(
            self.instance_count,
            self.torch_threads,
            self.min_threads,
            self.precision,
            self.graph,
            self.max_batch_size,
            self.max_queue_delay_us,
        )

    @property
    def label(self) -> str:
        return self.key.label

    def describe(self) -> str:
        rows = [(label, getattr(self, attr), self.reasons.get(attr, "")) for label, attr in PLAN_FIELDS]
        if self.lengths is not None:
            rows += [(p.name, p.write(value), self.lengths.reasons.get(p.name, ""))
                     for p, value in self.lengths.settings()]  # fmt: skip
        return "\n".join(f"  {label:<30} {value!s:<12} {reason}" for label, value, reason in rows)


@dataclass(frozen=True)
class ConfigKey:
    """What tells configs apart, the same for a plan and for what a server serves (live.served_key):
    instances x torch threads (from `min_threads` up to `threads` with elastic threads; 0: fixed),
    precision, graph, max batch size and queue delay."""

    instances: int
    threads: int
    min_threads: int
    precision: str
    graph: str
    max_batch_size: int
    delay_us: int

    @property
    def label(self) -> str:
        """Its short name: '2x1 fp32 b8 d0ms', '2x1-2 fp32 frozen b4 d0ms'."""
        threads = f"{self.min_threads}-{self.threads}" if self.min_threads else str(self.threads)
        runs_as = self.precision if self.graph == "eager" else f"{self.precision} {self.graph}"
        return f"{self.instances}x{threads} {runs_as} b{self.max_batch_size} d{self.delay_us / 1000:g}ms"


# (name in config.pbtxt, Plan attribute)
PLAN_FIELDS = [
    (param.TORCH_NUM_THREADS.name, "torch_threads"),
    (param.PRECISION.name, "precision"),
    (param.GRAPH.name, "graph"),
    ("max_batch_size", "max_batch_size"),
    ("preferred_batch_size", "preferred_batch_sizes"),
    ("max_queue_delay_microseconds", "max_queue_delay_us"),
    ("instance_group count", "instance_count"),
    ("max_queue_size", "max_queue_size"),
    ("default_timeout_microseconds", "queue_timeout_us"),
    (param.POOL_INITIAL_BYTES.name, "pool_initial_bytes"),
    (param.POOL_LIMIT_BYTES.name, "pool_limit_bytes"),
]
