"""Kubernetes' HorizontalPodAutoscaler (autoscaling/v2) replayed step by step over a pod whose
signals are a function of its load, for benchmarks/autoscale.py: the HPA object is read as
`tidepool deploy-manifests` renders it (metrics, min/max, behavior), and the controller's rules
are the documented ones: every sync, per metric ceil(ready pods x value / target) unless within the
tolerance; pods without a sample (starting, or just ready) read 0 when scaling out and the target
when scaling in; the largest proposal wins;
stabilization windows keep the highest recent proposal before scaling in and the lowest before
scaling out; rate policies limit the change per period from the count at the period's start."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

SYNC_S = 15  # the controller's --horizontal-pod-autoscaler-sync-period
TOLERANCE = 0.1  # --horizontal-pod-autoscaler-tolerance
# What autoscaling/v2 fills in where `behavior` says nothing.
DEFAULT_BEHAVIOR: dict[str, Any] = {
    "scaleUp": {
        "stabilizationWindowSeconds": 0,
        "selectPolicy": "Max",
        "policies": [
            {"type": "Percent", "value": 100, "periodSeconds": 15},
            {"type": "Pods", "value": 4, "periodSeconds": 15},
        ],
    },  # fmt: skip
    "scaleDown": {
        "stabilizationWindowSeconds": 300,
        "selectPolicy": "Max",
        "policies": [{"type": "Percent", "value": 100, "periodSeconds": 15}],
    },
}

# The signals one pod shows at a load (a share of one pod's capacity): metric key -> value, where
# the key is "cpu" (percent of the request) or a Pods metric's model label ("" for no selector).
PodSignals = Callable[[float], dict[str, float]]


@dataclass(frozen=True)
class Metric:
    key: str  # "cpu", or the model a Pods metric selects ("" for all models together)
    target: float  # percent for cpu, the AverageValue otherwise


def metrics_of(hpa: dict[str, Any]) -> list[Metric]:
    """The HPA's metrics as the replay reads them."""
    found = []
    for metric in hpa["spec"]["metrics"]:
        if metric["type"] == "Resource":
            found.append(Metric("cpu", float(metric["resource"]["target"]["averageUtilization"])))
        else:
            labels = metric["pods"]["metric"].get("selector", {}).get("matchLabels", {})
            value = str(metric["pods"]["target"]["averageValue"])
            target = float(value.removesuffix("m")) / 1000 if value.endswith("m") else float(value)
            found.append(Metric(labels.get("model", ""), target))
    return found


@dataclass
class Replay:
    """One HPA driving one Deployment; `step` advances SYNC_S seconds."""

    hpa: dict[str, Any]
    pod_start_s: float  # from a pod's creation to its readiness
    initial: int = 0  # ready pods at the start (default: minReplicas)
    now: float = 0.0
    pods: list[float] = field(default_factory=list)  # each pod's ready-at time
    events: list[tuple[float, int]] = field(default_factory=list)  # (time, replicas added/removed)
    proposals: list[tuple[float, int]] = field(default_factory=list)  # (time, stabilized input)

    def __post_init__(self) -> None:
        spec = self.hpa["spec"]
        self.min, self.max = spec.get("minReplicas", 1), spec["maxReplicas"]
        self.metrics = metrics_of(self.hpa)
        self.behavior = {**DEFAULT_BEHAVIOR, **spec.get("behavior", {})}
        self.pods = [-math.inf] * (self.initial or self.min)
        # The controller opens its record with the count it found (no scale-in on its first sync).
        self.proposals = [(self.now, self.replicas)]

    @property
    def replicas(self) -> int:
        return len(self.pods)

    def ready(self, at: float | None = None) -> int:
        at = self.now if at is None else at
        return sum(1 for ready_at in self.pods if ready_at <= at)

    def step(self, read: Callable[[float], dict[str, float] | None]) -> int:
        """One sync at `now`: `read(ready_at)` is what a ready pod's metrics say as the HPA reads
        them (scraped and rated, so late), None where it has no sample yet; returns the replicas it
        leaves, and moves on SYNC_S."""
        current = self.replicas
        readings = [read(ready_at) if ready_at <= self.now else None for ready_at in self.pods]
        proposal = max(
            self._proposal(m, [None if r is None else r.get(m.key, 0.0) for r in readings], current)
            for m in self.metrics
        )
        proposal = min(self.max, max(self.min, proposal))
        wanted = self._rate_limited(self._stabilized(proposal, current), current)
        if wanted > current:
            self.pods += [self.now + self.pod_start_s] * (wanted - current)
        elif wanted < current:
            self.pods = sorted(self.pods)[:wanted]  # the newest (and unready) pods go first
        if wanted != current:
            self.events.append((self.now, wanted - current))
        self.now += SYNC_S
        return wanted

    @staticmethod
    def _proposal(metric: Metric, readings: list[float | None], current: int) -> int:
        present = [value for value in readings if value is not None]
        missing = len(readings) - len(present)
        if not present:
            return current
        ratio = sum(present) / len(present) / metric.target
        if missing and abs(ratio - 1) > TOLERANCE:
            # Pods without a sample (starting, or just ready) read 0 when scaling out and the target
            # when scaling in; if that brings the ratio within the tolerance or reverses it, the HPA
            # waits for them.
            stand_in = 0.0 if ratio > 1 else metric.target
            redone = (sum(present) + missing * stand_in) / len(readings) / metric.target
            if abs(redone - 1) <= TOLERANCE or (redone > 1) != (ratio > 1):
                return current
            return math.ceil(redone * len(readings))
        if abs(ratio - 1) <= TOLERANCE:
            return current
        return math.ceil(ratio * len(present))

    def _stabilized(self, proposal: int, current: int) -> int:
        up_window = self.behavior["scaleUp"]["stabilizationWindowSeconds"]
        down_window = self.behavior["scaleDown"]["stabilizationWindowSeconds"]
        up, down = proposal, proposal
        for at, earlier in self.proposals:
            if at > self.now - up_window:
                up = min(up, earlier)
            if at > self.now - down_window:
                down = max(down, earlier)
        self.proposals = [(at, p) for at, p in self.proposals if at > self.now - max(up_window, down_window)]
        self.proposals.append((self.now, proposal))
        return min(max(current, up), down)

    def _changed_within(self, seconds: float, sign: int) -> int:
        return sum(abs(n) for at, n in self.events if at > self.now - seconds and n * sign > 0)

    def _rate_limited(self, wanted: int, current: int) -> int:
        if wanted > current:
            rules = self.behavior["scaleUp"]
            limits = []
            for policy in rules["policies"]:
                start = current - self._changed_within(policy["periodSeconds"], +1)
                grown = start + policy["value"] if policy["type"] == "Pods" else math.ceil(
                    start * (1 + policy["value"] / 100)
                )  # fmt: skip
                limits.append(grown)
            limit = min(limits) if rules.get("selectPolicy") == "Min" else max(limits)
            return min(wanted, max(limit, current))
        if wanted < current:
            rules = self.behavior["scaleDown"]
            limits = []
            for policy in rules["policies"]:
                start = current + self._changed_within(policy["periodSeconds"], -1)
                shrunk = start - policy["value"] if policy["type"] == "Pods" else math.floor(
                    start * (1 - policy["value"] / 100)
                )  # fmt: skip
                limits.append(shrunk)
            limit = max(limits) if rules.get("selectPolicy") == "Min" else min(limits)
            return max(wanted, min(limit, current))
        return wanted


def direction_changes(replicas: Sequence[int]) -> int:
    """How often the replica count turns from rising to falling or back."""
    turns, last = 0, 0
    for before, after in zip(replicas, replicas[1:], strict=False):
        sign = (after > before) - (after < before)
        if sign and last and sign != last:
            turns += 1
        last = sign or last
    return turns


@dataclass
class Day:
    """What one replay over a load trace gives, one entry per sync."""

    times_s: list[float]
    loads: list[float]  # in pods' worth of capacity
    replicas: list[int]  # pods that exist (and cost), starting ones included
    ready: list[int]
    late_share: list[float]  # share of that sync's requests over the p99 budget

    def late_percent(self) -> float:
        """Of every request of the day: the share over its budget."""
        total = sum(self.loads)
        return 100 * sum(load * late for load, late in zip(self.loads, self.late_share, strict=True)) / total

    def pod_hours(self) -> float:
        return sum(self.replicas) * SYNC_S / 3600


def replay_day(
    replay: Replay,
    loads: Sequence[float],
    signals: PodSignals,
    late_share: Callable[[float], float],
    scrape_delay_s: float = SYNC_S,
    rate_window_s: float = 60.0,
) -> Day:
    """`loads[i]` (pods' worth) offered during sync i, spread evenly over the ready pods (a
    request-level balancer); each sync the HPA reads the signals averaged over the rate window,
    `scrape_delay_s` late."""
    day = Day([], [], [], [], [])
    history: list[tuple[float, dict[str, float]]] = []  # (time, what each ready pod showed then)

    def read(ready_at: float) -> dict[str, float] | None:
        newest, oldest = replay.now - scrape_delay_s, replay.now - scrape_delay_s - rate_window_s
        window = [shown for at, shown in history if oldest <= at <= newest and at >= ready_at]
        if not window:
            return None
        return {key: sum(shown[key] for shown in window) / len(window) for key in window[0]}

    for load in loads:
        ready = replay.ready()
        per_pod = load / max(1, ready)
        history.append((replay.now, signals(per_pod)))
        while history[0][0] < replay.now - scrape_delay_s - rate_window_s:
            history.pop(0)
        day.times_s.append(replay.now)
        day.loads.append(load)
        day.replicas.append(replay.replicas)
        day.ready.append(ready)
        day.late_share.append(late_share(per_pod) if ready else 1.0)
        replay.step(read)
    return day
