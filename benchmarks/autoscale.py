"""A simulated day of traffic on a cluster: one real pod measured on this machine (the shipped
repository served as the container serves it, both models at once at open-loop rates from 10% to
130% of what the pod answers: its CPU against the request, each model's queue-to-compute ratio and
the share of requests over the model's planned latency budget; and the time from start to ready),
then Kubernetes' HPA replayed over that pod (benchmarks/common/hpa.py) for a day-shaped trace (night,
a x10 ramp, a plateau with two spikes, a ramp down). The HPA that `tidepool deploy-manifests`
renders (CPU and each model's ratio, behavior from the pod's start) beside the previous one (the
summed ratio alone, Kubernetes' default behavior). Prints the measured pod, the settings it
suggests, per policy the replicas over the day, direction changes per phase, the share of requests
over budget and pod-hours against the ideal, and plots replicas and load over the day.

    .venv/bin/python -m benchmarks.autoscale [--window-s 8] [--plot autoscale-day.png]
"""

from __future__ import annotations

import argparse
import asyncio
import math
import random
import re
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import psutil

from benchmarks.common.hpa import SYNC_S, TOLERANCE, Day, Replay, direction_changes, replay_day
from tidepool.clients.aio_workers import Outcome, Worker
from tidepool.clients.connection import Connection
from tidepool.clients.metrics import scrape
from tidepool.clients.sweep import Sweep, SweepSettings, open_loop
from tidepool.deploy.manifests import DeploySettings, Renderer
from tidepool.deploy.scaling import SIGNAL, queue_to_compute_ratio
from tidepool.deploy.sizing import pod_needs
from tidepool.extras import pyplot
from tidepool.inputs import random_inputs
from tidepool.launcher.server import ServerConfig, TritonServer
from tidepool.testing import MODEL_REPOSITORY, linked_repository

LEVELS = (0.1, 0.25, 0.4, 0.55, 0.7, 0.85, 1.0, 1.15, 1.3)  # shares of the pod's capacity
# Beyond the measured pod: scheduling, the container's start and the readiness probe's period.
CLUSTER_START_EXTRA_S = 15
_LATENCY_BUDGET = re.compile(r"^# Budgets: .*?latency ([\d.]+) ms", re.MULTILINE)


@dataclass
class Point:
    """The pod at one offered load."""

    load: float
    cpu_percent: float
    ratios: dict[str, float]  # per model, and "" for every model summed
    p99_ms: dict[str, float]
    late_share: float  # of all requests: over their model's budget, or never sent


@dataclass
class Pod:
    start_s: float
    capacity: dict[str, float]  # requests/s each model answers alone at saturation
    budgets_ms: dict[str, float]
    points: list[Point]

    def signals(self, load: float) -> dict[str, float]:
        keys = ["cpu", *self.points[0].ratios]
        values = {"cpu": [p.cpu_percent for p in self.points]}
        values.update({key: [p.ratios[key] for p in self.points] for key in keys[1:]})
        return {key: self._at(load, values[key], grows=key != "cpu") for key in keys}

    def late(self, load: float) -> float:
        if load > self.points[-1].load:
            return 1.0  # past anything measured: assume every request late
        return self._at(load, [p.late_share for p in self.points], grows=False)

    def _at(self, load: float, values: list[float], grows: bool) -> float:
        loads = [p.load for p in self.points]
        if load > loads[-1] and grows:  # a queue past saturation keeps growing with the load
            return values[-1] * load / loads[-1]
        return float(np.interp(load, loads, values))

    def comfortable_load(self, late_limit: float = 0.01) -> float:
        """The highest measured load with under `late_limit` of requests late."""
        return max((p.load for p in self.points if p.late_share < late_limit), default=self.points[0].load)


def latency_budget_ms(model: str) -> float:
    """The latency budget the model was planned for (its config's header)."""
    found = _LATENCY_BUDGET.search((MODEL_REPOSITORY / model / "config.pbtxt").read_text())
    if found is None:
        raise SystemExit(f"{model}: its config names no latency budget; plan it first")
    return float(found[1])


def cpu_seconds(process: psutil.Process) -> float:
    total = 0.0
    for each in [process, *process.children(recursive=True)]:
        try:
            times = each.cpu_times()
            total += times.user + times.system
        except psutil.NoSuchProcess:
            pass
    return total


async def offered(
    url: str, rates: dict[str, float], inputs: dict, specs: dict, seconds: float, warmup_s: float
):
    workers = {m: [Worker("grpc", url, m, specs[m], inputs[m]) for _ in range(min(128, max(8, int(rate))))]
               for m, rate in rates.items()}  # fmt: skip
    try:
        for window in (warmup_s, seconds):
            outcomes = {m: Outcome() for m in rates}
            deadline = time.perf_counter() + window
            await asyncio.gather(*(open_loop(rates[m], workers[m], deadline, outcomes[m]) for m in rates))
        return outcomes
    finally:
        for each in workers.values():
            for worker in each:
                await worker.close()


def measure_pod(window_s: float) -> Pod:
    needs = pod_needs(MODEL_REPOSITORY)
    models, cores = sorted(m.name for m in needs.models), needs.cores
    budgets = {m: latency_budget_ms(m) for m in models}
    with tempfile.TemporaryDirectory() as tmp:
        config = ServerConfig.on_free_ports(linked_repository(Path(tmp)))
        began = time.monotonic()
        with TritonServer(config) as server:
            start_s = time.monotonic() - began
            print(f"start to ready: {start_s:.1f} s")
            url = config.grpc_url
            capacity = {}
            for model in models:
                settings = SweepSettings(
                    model, url=url, concurrency=(8,), window_s=4, warmup_s=1, max_windows=2
                )
                [level] = Sweep(settings).run()
                capacity[model] = level.throughput
            print("alone at concurrency 8: " + ", ".join(f"{m} {r:.0f}/s" for m, r in capacity.items()))
            with Connection.open("grpc", url) as connection:
                specs = {m: connection.model_spec(m) for m in models}
            inputs = {m: random_inputs(specs[m], batch=1, seed=1) for m in models}
            process = psutil.Process(server.process.pid)  # type: ignore[union-attr]
            points = []
            for load in LEVELS:
                # The pod's capacity shared evenly: each model at half of what it answers alone.
                rates = {m: load * capacity[m] / len(models) for m in models}
                before, cpu_before, at = scrape(config.metrics_url), cpu_seconds(process), time.monotonic()
                outcomes = asyncio.run(offered(url, rates, inputs, specs, window_s, warmup_s=2))
                elapsed = time.monotonic() - at
                after, cpu_after = scrape(config.metrics_url), cpu_seconds(process)
                ratios = {m: queue_to_compute_ratio(before, after, elapsed, model=m) for m in models}
                ratios[""] = queue_to_compute_ratio(before, after, elapsed)
                late = sent = 0
                for m, outcome in outcomes.items():
                    late += sum(1 for ms in outcome.latencies_ms if ms > budgets[m]) + len(outcome.errors)
                    sent += len(outcome.latencies_ms) + len(outcome.errors)
                point = Point(
                    load,
                    cpu_percent=100 * (cpu_after - cpu_before) / elapsed / cores,
                    ratios=ratios,
                    p99_ms={
                        m: float(np.percentile(o.latencies_ms, 99)) if o.latencies_ms else math.inf
                        for m, o in outcomes.items()
                    },  # fmt: skip
                    late_share=late / sent if sent else 1.0,
                )
                points.append(point)
                print(describe_point(point, models), flush=True)
    return Pod(start_s, capacity, budgets, points)


def describe_point(point: Point, models: list[str]) -> str:
    p99 = ", ".join(f"{m} {point.p99_ms[m]:.0f}" for m in models)
    ratios = ", ".join(f"{m} {point.ratios[m]:.2f}" for m in models)
    return (f"| {point.load:.2f} | {point.cpu_percent:.0f}% | {ratios} | {point.ratios['']:.2f} | {p99} | "
            f"{100 * point.late_share:.1f}% |")  # fmt: skip


PHASES = [("night", 0, 6), ("ramp up", 6, 9), ("plateau and spikes", 9, 17), ("ramp down", 17, 21),
          ("evening", 21, 24)]  # fmt: skip


def day_trace(peak: float, seed: int = 0) -> list[float]:
    """Pods' worth of load per sync over 24 h: night at peak/10, a ramp x10 from 06:00 to 09:00, a
    plateau with spikes of +50% (11:00, 10 min) and +40% (14:30, 15 min) reached in 2 min, a ramp
    down from 17:00 to 21:00; +-5% noise per sync."""
    noise = random.Random(seed)
    low, loads = peak / 10, []
    for step in range(24 * 3600 // SYNC_S):
        hour = step * SYNC_S / 3600
        if hour < 6 or hour >= 21:
            load = low
        elif hour < 9:
            load = low + (peak - low) * (hour - 6) / 3
        elif hour < 17:
            load = peak
            for at, extra, minutes in ((11.0, 0.5, 10), (14.5, 0.4, 15)):
                into = (hour - at) * 60
                if 0 <= into < minutes:
                    load *= 1 + extra * min(1.0, into / 2, (minutes - into) / 2)
        else:
            load = peak - (peak - low) * (hour - 17) / 4
        loads.append(load * (1 + noise.uniform(-0.05, 0.05)))
    return loads


def previous_hpa(settings: DeploySettings) -> dict:
    """The HPA shipped before: the queue ratio summed over models, alone, with default behavior."""
    metric = {"type": "Pods", "pods": {"metric": {"name": SIGNAL}, "target": {"type": "AverageValue",
              "averageValue": "1000m"}}}  # fmt: skip
    return {"spec": {"minReplicas": settings.min_replicas, "maxReplicas": settings.max_replicas,
                     "metrics": [metric]}}  # fmt: skip


def report(name: str, day: Day, ideal: list[int]) -> None:
    hours = [t / 3600 for t in day.times_s]
    turns = []
    for phase, begin, end in PHASES:
        replicas = [r for h, r in zip(hours, day.replicas, strict=True) if begin <= h < end]
        turns.append(f"{phase} {direction_changes(replicas)}")
    ideal_hours = sum(ideal) * SYNC_S / 3600
    print(f"| {name} | {max(day.replicas)} | {direction_changes(day.replicas)} ({', '.join(turns)}) | "
          f"{day.late_percent():.2f}% | "
          f"{day.pod_hours():.1f} / {ideal_hours:.1f} = {day.pod_hours() / ideal_hours:.2f}x |")  # fmt: skip


def plot(path: Path, days: dict[str, Day], ideal: list[int], comfortable: float) -> None:
    """One panel per HPA: its pods over the day, on the load (in pods at the comfortable load)."""
    plt = pyplot()
    figure, axes = plt.subplots(len(days), 1, figsize=(10, 2.6 * len(days)), sharex=True, sharey=True)
    for axis, (name, day), color in zip(axes, days.items(), ("tab:blue", "tab:red"), strict=False):
        hours = [t / 3600 for t in day.times_s]
        axis.fill_between(hours, [load / comfortable for load in day.loads], color="0.85",
                          label="load, in pods at the comfortable load")  # fmt: skip
        axis.step(hours, ideal, where="post", color="0.3", linestyle=":", label="ideal pods")
        axis.step(hours, day.replicas, where="post", color=color, label="pods")
        axis.set_title(f"{name}: {day.late_percent():.2f}% of requests over budget", fontsize=10)
        axis.set_ylabel("pods")
        axis.legend(loc="upper left", fontsize=8)
    axes[-1].set_xlabel("hour of the day")
    axes[-1].set_xlim(0, 24)
    axes[-1].set_xticks(range(0, 25, 3))
    figure.tight_layout()
    figure.savefig(path, dpi=80)
    print(f"wrote {path}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--window-s", type=float, default=8.0, help="measured seconds per load level")
    parser.add_argument("--plot", type=Path, default=Path("autoscale-day.png"))
    parser.add_argument("--peak", type=float, default=4.0, help="the plateau, in pods' worth of load")
    parser.add_argument("--max-replicas", type=int, default=16)
    args = parser.parse_args()
    pod = measure_pod(args.window_s)
    models = sorted(pod.budgets_ms)
    budgets = ", ".join(f"{m} {b:g} ms" for m, b in pod.budgets_ms.items())
    print(f"\n| load | CPU of request | ratio {', '.join(models)} | ratio summed | p99 ms | over budget "
          f"({budgets}) |\n" + "| --- " * 6 + "|")  # fmt: skip
    for point in pod.points:
        print(describe_point(point, models))
    comfortable = pod.comfortable_load()
    cpu_there = pod.signals(comfortable)["cpu"]
    # The HPA acts only outside target +-10%: the band's top at the comfortable load's CPU.
    target = max(10, min(90, int(cpu_there / (1 + TOLERANCE))))
    start_s = math.ceil(pod.start_s + CLUSTER_START_EXTRA_S)
    # Room above the day's spikes, so that the ceiling does not decide the comparison.
    settings = DeploySettings(cpu_target_percent=target, pod_start_s=start_s, max_replicas=args.max_replicas)
    print(f"\ncomfortable load {comfortable:.2f} of capacity (under 1% late), CPU there {cpu_there:.0f}%; "
          f"pod start {pod.start_s:.0f} s + {CLUSTER_START_EXTRA_S} s in a cluster: "
          f"tidepool deploy-manifests --cpu-target-percent {target} --pod-start-s {start_s}")  # fmt: skip
    loads = day_trace(args.peak)
    ideal = [max(settings.min_replicas, math.ceil(load / comfortable)) for load in loads]
    needs = pod_needs(MODEL_REPOSITORY)
    shipped = DeploySettings(max_replicas=args.max_replicas)
    hpas = {
        "rendered (CPU + per-model ratio)": Renderer(needs, settings).autoscaler(),
        "previous (summed ratio alone)": previous_hpa(settings),
        f"rendered with the defaults ({shipped.cpu_target_percent}%, {shipped.pod_start_s} s)":
            Renderer(needs, shipped).autoscaler(),
    }  # fmt: skip
    days = {}
    # The day opens with minReplicas ready (no cold start to leave out of the late requests).
    print("\n| HPA | most pods | direction changes (per phase) | requests over budget | pod-hours / ideal |\n"
          + "| --- " * 5 + "|")  # fmt: skip
    for name, hpa in hpas.items():
        day = replay_day(Replay(hpa, pod_start_s=start_s), loads, pod.signals, pod.late)
        report(name, day, ideal)
        days[name] = day
    print("\nhour | load | " + " | ".join(days) + " | ideal")
    for step in range(0, len(loads), 3600 // SYNC_S):
        print(f"{step * SYNC_S // 3600:4d} | {loads[step]:.2f} | "
              + " | ".join(str(d.replicas[step]) for d in days.values()) + f" | {ideal[step]}")  # fmt: skip
    plot(args.plot, dict(list(days.items())[:2]), ideal, comfortable)


if __name__ == "__main__":
    main()
