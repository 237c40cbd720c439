"""`tidepool plan --from-server`: what a live server saw over a window (arrival rate, the batches it
formed, queue and compute time per batch size, failures), a re-plan for that traffic from the
model's profiles and the serving overhead observed, and applying it through Triton's repository
API without failing a request.

The rule: serve with the lowest lone-request latency that still has capacity to spare for the
traffic observed; switch to more capacity when the traffic nears what the config serves or when
requests wait for a busy instance, and back only when it has fallen well below: two thresholds
apart, so steady traffic never flaps."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from tidepool import parameters as param
from tidepool.clients.connection import Connection, server_address
from tidepool.configfile import ModelConfig, as_dict, read_config
from tidepool.errors import TidepoolError
from tidepool.planning.candidates import candidates
from tidepool.planning.choose import capacity
from tidepool.planning.config_writer import planned_config, write_plan
from tidepool.planning.plan import Budgets, ConfigKey, Plan
from tidepool.planning.profile import Profile
from tidepool.planning.run import PROFILES_DIRECTORY, PROFILES_NOTE, PlanSettings, saved_profile_paths

# Switch to a config with more capacity when traffic passes this share of the current one's...
SCALE_UP_AT = 0.75
# ...to one with more spare capacity, whose capacity is at least traffic / this share...
TARGET_LOAD = 0.5
# ...and back to a lower-latency one only when traffic is below this share of its capacity.
SCALE_DOWN_BELOW = 0.4
# A plan with more capacity replaces the served one only when it serves at least this much more:
# capacities come from profiles that vary 10-15% between runs on a shared machine, and two plans
# within that of each other (1x2 and 2x1 of encoder: 102 and 98/s) would otherwise swap at every
# window, one chosen for its capacity and the other because requests waited for an instance.
CAPACITY_MARGIN = 1.15
# Requests that wait for an instance, on average, this share of an execution mean every instance is
# busy whatever the arrival rate suggests: few clients in a closed loop never fill the batches that
# the capacity counts on (2 clients on one instance form batches of 1 and each waits for the other).
WAITING_AT = 0.5


class LiveError(TidepoolError):
    """The live server could not be read or reconfigured."""


@dataclass
class Observation:
    """One model's traffic over a window, from Triton's statistics API."""

    model: str
    window_s: float
    inferences: int  # samples (rows) answered
    requests: int  # requests answered
    failures: int
    executions: int
    queue_ms: float  # mean per request
    compute_ms: float  # mean compute_infer per execution
    batches: dict[int, tuple[int, float]]  # batch size -> (executions, mean compute_infer ms)

    @property
    def rate(self) -> float:
        """Samples per second the server was asked for (answered and failed)."""
        return (self.inferences + self.failures) / self.window_s if self.window_s else 0.0

    @property
    def waiting(self) -> bool:
        """Whether requests waited for a busy instance (see WAITING_AT)."""
        return self.compute_ms > 0 and self.queue_ms >= WAITING_AT * self.compute_ms

    @property
    def avg_batch(self) -> float:
        return self.inferences / self.executions if self.executions else 0.0

    def describe(self) -> str:
        sizes = ", ".join(f"{b}x{n} ({ms:.1f} ms)" for b, (n, ms) in sorted(self.batches.items()))
        return (
            f"{self.rate:.1f} samples/s over {self.window_s:.1f} s, {self.failures} failed, mean batch "
            f"{self.avg_batch:.2f}, queue {self.queue_ms:.1f} ms, compute {self.compute_ms:.1f} ms; "
            f"batches: {sizes}"
        )


def _stats(connection: Connection, model: str) -> dict[str, Any]:
    try:
        entries = connection.statistics(model)["model_stats"]
    except Exception as exc:
        raise LiveError(f"cannot read the statistics of {model}: {exc}") from None
    return max(entries, key=lambda entry: int(entry.get("version", "0") or 0))


def _count_ns(source: dict[str, Any], key: str) -> tuple[int, int]:
    entry = source.get(key, {})
    return int(entry.get("count", 0)), int(entry.get("ns", 0))


def difference(before: dict[str, Any], after: dict[str, Any], window_s: float) -> Observation:
    """What happened between two statistics snapshots of one model."""
    stats_a, stats_b = before.get("inference_stats", {}), after.get("inference_stats", {})

    def delta(key: str) -> tuple[int, int]:
        (count_a, ns_a), (count_b, ns_b) = _count_ns(stats_a, key), _count_ns(stats_b, key)
        return count_b - count_a, ns_b - ns_a

    success, queue, fail = delta("success"), delta("queue"), delta("fail")
    earlier = {int(b["batch_size"]): _count_ns(b, "compute_infer") for b in before.get("batch_stats", [])}
    batches = {}
    for entry in after.get("batch_stats", []):
        size = int(entry["batch_size"])
        count, ns = _count_ns(entry, "compute_infer")
        count_a, ns_a = earlier.get(size, (0, 0))
        if count > count_a:
            batches[size] = (count - count_a, (ns - ns_a) / (count - count_a) / 1e6)
    executions = int(after.get("execution_count", 0)) - int(before.get("execution_count", 0))
    total_ms = sum(n * ms for n, ms in batches.values())
    return Observation(
        model=after.get("name", ""),
        window_s=window_s,
        inferences=int(after.get("inference_count", 0)) - int(before.get("inference_count", 0)),
        requests=success[0],
        failures=fail[0],
        executions=executions,
        queue_ms=queue[1] / queue[0] / 1e6 if queue[0] else 0.0,
        compute_ms=total_ms / sum(n for n, _ in batches.values()) if batches else 0.0,
        batches=batches,
    )


def observe(
    connection: Connection, model: str, window_s: float, sleep: Callable[[float], None] = time.sleep
) -> Observation:
    before, began = _stats(connection, model), time.monotonic()
    sleep(window_s)
    return difference(before, _stats(connection, model), time.monotonic() - began)


def serving_overhead_ms(observation: Observation, profile: Profile) -> float:
    """What serving adds to each execution over the profile's in-process p50 (the stub's IPC,
    validation, a load generator on the same cores), from the batch sizes the server ran,
    execution-weighted; 0 when nothing comparable was observed. It is added per execution, not
    scaled: it overlaps across instances, which is why two 1-thread instances can serve more than
    one 2-thread instance whose forward pass alone is as fast."""
    weighted, weights = 0.0, 0
    for size, (count, ms) in observation.batches.items():
        point = profile.point(size)
        if point is not None:
            weighted += count * (ms - point.latency_p50_ms)
            weights += count
    return max(0.0, weighted / weights) if weights else 0.0


def served_capacity(plan: Plan, overhead_ms: float) -> float:
    """The plan's capacity with each execution `overhead_ms` longer, as serving makes it."""
    assert plan.profile is not None
    return capacity(plan.profile, plan.max_batch_size, plan.instance_count, overhead_ms)


@dataclass
class Decision:
    plan: Plan
    change: bool
    reason: str


def served_key(config: dict[str, Any], cores: int) -> ConfigKey:
    """The key (as Plan.key) of a config as the server reports it. Elastic instances that ask for
    more threads than there are cores share them: from cores / instances up to their threads."""
    given = param.string_parameters(config)
    instances = sum(int(group.get("count", 1)) for group in config.get("instance_group", [])) or 1
    threads = param.TORCH_NUM_THREADS.read(given) or cores
    elastic = param.ELASTIC_THREADS.read(given) and instances * threads > cores
    return ConfigKey(
        instances=instances,
        threads=threads,
        min_threads=max(1, cores // instances) if elastic else 0,
        precision=param.PRECISION.read(given),
        graph=param.GRAPH.read(given),
        max_batch_size=int(config.get("max_batch_size", 0)),
        delay_us=int(config.get("dynamic_batching", {}).get("max_queue_delay_microseconds", 0)),
    )


def served_label(config: dict[str, Any], cores: int) -> str:
    return served_key(config, cores).label


def decide(
    served: ConfigKey, profiles: list[Profile], budgets: Budgets, observation: Observation
) -> Decision:
    """The plan for the traffic observed, and whether it is worth a reload (see the module doc)."""
    ranked, _ = candidates(profiles, budgets)
    current = next((p for p in ranked if p.key == served), None)
    served_profile = current.profile if current is not None and current.profile else ranked[0].profile
    assert served_profile is not None
    overhead = serving_overhead_ms(observation, served_profile)
    full_batches = {p.label: served_capacity(p, overhead) for p in ranked}
    rate = observation.rate
    answered_ms = observation.queue_ms + observation.compute_ms

    def expected_rate(plan: Plan) -> float:
        """Clients in a closed loop (a load test; callers that wait for each answer) send faster
        when answered sooner: the observed rate scaled by how much sooner `plan` answers a lone
        request, never scaled down (traffic that does not wait for answers does not slow)."""
        answers_in_ms = plan.lone_latency_ms + overhead
        return rate * max(1.0, answered_ms / answers_in_ms) if answers_in_ms > 0 else rate

    def for_traffic(plans: list[Plan]) -> Plan:
        """The lowest lone latency with capacity to spare, else the most capacity."""
        roomy = [
            p
            for p in sorted(plans, key=lambda p: p.lone_latency_ms)
            if expected_rate(p) <= TARGET_LOAD * full_batches[p.label]
        ]
        return roomy[0] if roomy else max(plans, key=lambda p: full_batches[p.label])

    note = f"traffic {rate:.1f} samples/s; serving adds {overhead:.1f} ms an execution to the profile"
    wider = [p for p in ranked if p.instance_count > served.instances]
    if observation.waiting and wider:
        wanted = for_traffic(wider)
        return Decision(
            wanted, True,
            f"{note}; requests waited {observation.queue_ms:.1f} ms for an instance (compute "
            f"{observation.compute_ms:.1f} ms): {wanted.label} runs {wanted.instance_count} at once",
        )  # fmt: skip
    wanted = for_traffic(ranked)
    if current is None:
        return Decision(wanted, True, f"{note}; the served config ({served.label}) is not a planned one")
    load = rate / full_batches[current.label] if full_batches[current.label] else float("inf")
    if load > SCALE_UP_AT and full_batches[wanted.label] >= CAPACITY_MARGIN * full_batches[current.label]:
        return Decision(
            wanted, True,
            f"{note}: {load:.0%} of {current.label}'s capacity ({full_batches[current.label]:.0f}/s) > "
            f"{SCALE_UP_AT:.0%}; {wanted.label} serves {full_batches[wanted.label]:.0f}/s",
        )  # fmt: skip
    # Back down only where requests would not wait even one at a time: below 40% of what a plan
    # serves in batches of 1, a queue of random arrivals waits a third of an execution on average
    # (M/D/1: load / (2 (1 - load))), under WAITING_AT, so the next window does not scale up again;
    # the rate is the one its clients would send there (expected_rate), as for any candidate.
    one_at_a_time = {p.label: capacity(p.profile, 1, p.instance_count, overhead) for p in ranked if p.profile}
    by_latency = sorted(ranked, key=lambda p: p.lone_latency_ms)
    lighter = next(
        (p for p in by_latency if expected_rate(p) < SCALE_DOWN_BELOW * one_at_a_time.get(p.label, 0.0)), None
    )
    if (
        lighter is not None
        and lighter.lone_latency_ms < current.lone_latency_ms
        and lighter.label != current.label
    ):
        return Decision(
            lighter, True,
            f"{note}: below {SCALE_DOWN_BELOW:.0%} of {lighter.label}'s capacity; a lone request takes "
            f"{lighter.lone_latency_ms:.1f} ms there, {current.lone_latency_ms:.1f} ms now",
        )  # fmt: skip
    return Decision(current, False, f"{note}: {load:.0%} of {current.label}'s capacity; no change")


def apply(
    connection: Connection, base: ModelConfig, plan: Plan, model: str, generation: int, reason: str
) -> dict[str, Any]:
    """Load the plan's config into the running server (explicit model control): Triton loads the
    new instances, then moves traffic; requests in flight and queued finish on the old ones."""
    config = planned_config(base, plan)
    config.name = model
    config.parameters[param.PLAN_GENERATION.name].string_value = param.PLAN_GENERATION.write(generation)
    config.parameters[param.PLAN_REASON.name].string_value = f"{plan.label}: {reason}"
    as_json = as_dict(config)
    try:
        connection.client.load_model(model, config=json.dumps(as_json))
    except Exception as exc:
        raise LiveError(
            f"could not load the new config of {model} ({exc}); is the server in explicit model control "
            "(tidepool serve --model-control explicit)?"
        ) from None
    return as_json


def served_config(connection: Connection, model: str) -> dict[str, Any]:
    try:
        if connection.protocol == "http":
            config: dict[str, Any] = connection.client.get_model_config(model)
        else:
            config = connection.client.get_model_config(model, as_json=True)["config"]
    except Exception as exc:
        raise LiveError(f"cannot read the config of {model}: {exc}") from None
    return config


@dataclass(frozen=True)
class LiveSettings:
    """`tidepool plan --from-server`: the server (HOST:PORT of its HTTP endpoint, or
    http://HOST:PORT, or grpc://HOST:PORT), the model's name there, the window of traffic per
    observation, and what to do with a changed plan."""

    server: str
    model: str
    window_s: float = 60.0
    apply: bool = False  # load it into the server (explicit model control)
    watch: bool = False  # observe and re-plan every window until stopped


# What to try when an address does not speak the protocol it was taken for.
_OTHER_PORT = {
    "http": "if it is Triton's gRPC port (8001 by default), pass grpc://{address}; its HTTP port is 8000 "
    "by default",
    "grpc": "if it is Triton's HTTP port (8000 by default), pass http://{address}; its gRPC port is 8001 "
    "by default",
}


def connect(server: str) -> Connection:
    """A connection to a live server that answered; LiveError, in one line, where it did not."""
    protocol, address = server_address(server)
    connection = Connection.open(protocol, address)
    try:
        if protocol == "grpc":
            connection.client.is_server_live(client_timeout=10)
        else:
            connection.client.is_server_live()
    except Exception as exc:
        connection.close()
        reason = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise LiveError(
            f"{address} did not answer Triton's {protocol.upper()} API ({reason}): "
            + _OTHER_PORT[protocol].format(address=address)
        ) from None
    return connection


def serving_rate(server: str, model: str, seconds: float = 2.0) -> float:
    """Samples per second the server answers `model` now (to warn before profiling beside it)."""
    with connect(server) as connection:
        return observe(connection, model, seconds).rate


def profiles_for_live(
    settings: PlanSettings, live: LiveSettings, say: Callable[[str], None], warn: Callable[[str], None]
) -> PlanSettings:
    """A re-plan of a live server plans from the profiles `tidepool plan --write` saved beside the
    config; only where there are none it profiles here, saying so, and warns when the server is busy."""
    saved = saved_profile_paths(settings.model_dir)
    if saved:
        say(f"planning from the {len(saved)} profiles `tidepool plan --write` saved in "
            f"{settings.model_dir / PROFILES_DIRECTORY}")  # fmt: skip
        return replace(settings, saved_profiles=saved)
    warn(f"no saved profiles in {settings.model_dir / PROFILES_DIRECTORY} and no --profile: profiling "
         "now, on this machine")  # fmt: skip
    rate = serving_rate(live.server, live.model)
    if rate > 0:
        warn(f"warning: the server answers {rate:.0f} samples/s of {live.model} now; a profile taken "
             "beside it measures that load too (plan once on an idle machine with --write, which "
             "saves the profiles)")  # fmt: skip
    return settings


def replan_from_server(
    settings: PlanSettings, live: LiveSettings, profiles: list[Profile], say: Callable[[str], None]
) -> int:
    """Observe, re-plan, write (where settings.write) and apply (where live.apply) a changed plan;
    once, or every window with live.watch."""
    model, model_dir, budgets = live.model, settings.model_dir, settings.budgets
    base = read_config(model_dir / "config.pbtxt")
    planned = {plan.key for plan in candidates(profiles, budgets)[0]}
    reloads = 0
    notes = [PROFILES_NOTE] if saved_profile_paths(model_dir) else []
    with connect(live.server) as connection:
        while True:
            served = served_config(connection, model)
            generation = param.PLAN_GENERATION.read(param.string_parameters(served))
            key = served_key(served, budgets.cores)
            label = key.label
            if key not in planned:
                say(f"{model}: the served config ({label}) is none of the plans for these budgets; "
                    f"observing {live.window_s:g} s of its traffic, then re-planning")  # fmt: skip
            observation = observe(connection, model, live.window_s)
            decision = decide(key, profiles, budgets, observation)
            stamp = time.strftime("%H:%M:%S")
            say(f"[{stamp}] {model}: {observation.describe()}")
            say(f"[{stamp}] {model}: served {label}; planned {decision.plan.label}: {decision.reason}")
            if decision.change and settings.write:
                write_plan(
                    model_dir, budgets, decision.plan,
                    [f"Re-planned from the live server: {decision.reason}", *notes],
                )  # fmt: skip
            if decision.change and live.apply:
                apply(connection, base, decision.plan, model, generation + 1, decision.reason)
                reloads += 1
                say(f"[{time.strftime('%H:%M:%S')}] tidepool: {model}: config changed from {label} to "
                    f"{decision.plan.label} (generation {generation + 1}, reload {reloads})")  # fmt: skip
            if not live.watch:
                return 0
