"""Serving while the config changes, each in one run on this machine:

python -m benchmarks.live replan [--model encoder] [--step-seconds 30] [--window 8] [--repeats 2]
    [--no-elastic-threads] [--report-dir reports/live_replan]
  The closed loop against a static plan under the same Locust step load (1 -> 32 users):
  1. profile the model at each thread split (saved profiles, as `tidepool plan --profile` takes);
  2. static: `tidepool serve` with the config `tidepool plan` writes from those profiles;
  3. watch: `tidepool serve --model-control explicit` from a deliberately poor config, with
     `tidepool plan --from-server --watch --apply` re-planning every window;
  4. steady: the same watch under a constant load, to show it reloads once at most.
  Per step: throughput and p99 of the requests that finished in its last --tail seconds (from a log
  of every request), failures, reloads; with --repeats N, static and watch alternate N times and
  each step shows the median (min-max). Locust's CSVs, the request log and the watcher's lines are
  kept under --report-dir, a folder per run.

python -m benchmarks.live reload [--model encoder] [--levels 1,4] [--seconds 12] [--rounds 2]
    [--niceness 10,0]
  What one reload costs the requests served meanwhile, the new instances loading at nice 10
  (TIDEPOOL_LOADING_NICENESS) and at full priority: per round and niceness a fresh server (explicit
  model control, 2 instances x 1 thread); at each concurrency a closed loop for --seconds without a
  reload, then with one (a config override, as `tidepool plan --apply` sends) 2 s in. Requests
  served with / without the reload, p99 with it, and the reload's duration; median (min-max) over
  --rounds, the niceness values alternated.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from benchmarks.common.in_turn import spread
from benchmarks.common.subcommands import run_subcommand
from tidepool.clients.closed_loop import LoadResult, run_closed_loop
from tidepool.clients.connection import Connection
from tidepool.clients.locust_run import LoadSettings, LoadSummary, RequestLog, run_load
from tidepool.clients.metrics import scrape, value
from tidepool.configfile import as_dict, copy_model, read_config, set_instances, write_config
from tidepool.launcher.server import ServerConfig, TritonServer
from tidepool.planning.candidates import candidates, thread_splits
from tidepool.planning.config_writer import write_plan
from tidepool.planning.plan import Budgets
from tidepool.planning.profiler import profile_model
from tidepool.runtime.cores import NICENESS_VARIABLE
from tidepool.spec import positive_ints
from tidepool.testing import MODEL_REPOSITORY

RELOAD_AFTER_S = 2.0
STEPS = "1,2,4,8,16,32"  # the default: light to heavy


def poor_config(model_dir: Path) -> None:
    """One 2-thread instance, no batching at all, a 50 ms delay: what nobody should serve with."""
    config = read_config(model_dir / "config.pbtxt")
    config.max_batch_size = 1
    config.dynamic_batching.max_queue_delay_microseconds = 50_000
    set_instances(config, 1)
    config.parameters["TORCH_NUM_THREADS"].string_value = "2"
    write_config(model_dir / "config.pbtxt", config)


def step_ends(
    report_dir: Path, step_seconds: float, levels: list[int], tail_s: float
) -> list[tuple[int, float, float]]:
    """(users, requests/s, p99 ms) of the requests that finished in the last `tail_s` of each step,
    from the run's request log; the steps start at the first row of Locust's history."""
    with (report_dir / "locust_stats_history.csv").open() as handle:
        start = float(next(csv.DictReader(handle))["Timestamp"])
    log = RequestLog.read(report_dir)
    found = []
    for index, users in enumerate(levels):
        end = start + (index + 1) * step_seconds
        figures = log.window(end - tail_s, end)
        found.append((users, figures.requests_per_s, figures.p99_ms))
    return found


def served_run(repository: Path, model: str, steps: str, step_seconds: float, watch: list[str] | None,
               report_dir: Path) -> tuple[LoadSummary, list[str], float]:  # fmt: skip
    """Serve, load with Locust (and run the watcher beside it); the summary, the watcher's lines
    and the plan generation the server reports at the end."""
    config = ServerConfig.on_free_ports(repository, model_control="explicit")
    with TritonServer(config):
        watcher = None
        if watch is not None:
            command = [sys.executable, "-m", "tidepool.cli", "plan", str(repository / model),
                       "--from-server", config.http_url, "--watch", "--apply", *watch]  # fmt: skip
            watcher = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        levels = [int(u) for u in steps.split(",")]
        settings = LoadSettings(
            model, users=max(levels), spawn_rate=64, duration=f"{int(len(levels) * step_seconds)}s",
            url=config.grpc_url, report_dir=report_dir, step_users=steps, step_seconds=step_seconds,
            request_log=True,
        )  # fmt: skip
        summary = run_load(settings)
        generation = value(scrape(config.metrics_url), "tidepool_plan_generation", model=model)
        lines: list[str] = []
        if watcher is not None:
            watcher.terminate()
            lines = watcher.communicate(timeout=30)[0].splitlines()
        return summary, lines, generation


def main_replan() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="encoder")
    parser.add_argument("--latency-budget-ms", type=float, default=100.0)
    parser.add_argument("--step-seconds", type=float, default=30.0)
    parser.add_argument("--window", type=float, default=8.0)
    parser.add_argument(
        "--steps", default=STEPS, help="users at each step, e.g. 1,1,16,16,1,1 (light, heavy, light)"
    )
    parser.add_argument(
        "--tail", type=float, default=10.0, help="seconds at the end of each step that its figures cover"
    )
    parser.add_argument("--repeats", type=int, default=1, help="static and watch runs, alternated")
    parser.add_argument(
        "--elastic-threads",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="plan elastic candidates too (default: on, as tidepool plan)",
    )
    parser.add_argument(
        "--report-dir",
        type=Path,
        default=Path("reports") / time.strftime("live_replan-%Y%m%d-%H%M%S"),
        help="where each run's Locust CSVs and watcher lines are kept",
    )
    args = parser.parse_args()
    budgets = Budgets(
        memory_bytes=1024 * 2**20, latency_ms=args.latency_budget_ms, elastic_threads=args.elastic_threads
    )
    levels = [int(u) for u in args.steps.split(",")]
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        profiles = []
        for threads in thread_splits(budgets.cores):
            profile = profile_model(MODEL_REPOSITORY / args.model, (1, 2, 4, 8, 16), torch_threads=threads,
                                    max_seconds_per_point=1.5)  # fmt: skip
            path = root / f"profile-{threads}.json"
            path.write_text(profile.to_json())
            profiles.append(profile)
        results: dict[str, list] = {"static": [], "watch": [], "steady": []}
        order = [*(["static", "watch"] * args.repeats), "steady"]
        for index, run in enumerate(order):
            repository = root / f"{run}-{index}"
            model_dir = repository / args.model
            copy_model(MODEL_REPOSITORY / args.model, model_dir)
            watch = None
            steps = args.steps
            if run == "static":
                ranked, _ = candidates(profiles, budgets)
                write_plan(model_dir, budgets, ranked[0])
                print(
                    f"static plan: {ranked[0].label} (candidates: "
                    + ", ".join(f"{p.label} {p.predicted_throughput:.0f}/s" for p in ranked)
                    + ")",
                    flush=True,
                )
            else:
                poor_config(model_dir)
                profile_args = [
                    arg for p in sorted(root.glob("profile-*.json")) for arg in ("--profile", str(p))
                ]
                watch = ["--window", str(args.window), "--memory-budget", "1GiB",
                         *([] if args.elastic_threads else ["--no-elastic-threads"]),
                         "--latency-budget-ms", str(args.latency_budget_ms), *profile_args]  # fmt: skip
                if run == "steady":
                    steps = ",".join(["8"] * len(levels))
            began = time.perf_counter()
            report_dir = args.report_dir / f"{index:02d}-{run}"
            summary, lines, generation = served_run(
                repository, args.model, steps, args.step_seconds, watch, report_dir
            )
            (report_dir / "watcher.log").write_text("".join(f"{line}\n" for line in lines))
            per_step = step_ends(report_dir, args.step_seconds, [int(u) for u in steps.split(",")], args.tail)
            results[run].append((summary, lines, generation, per_step, time.perf_counter() - began))
            print(f"{run}: {summary.requests} answered, {summary.failures} failed, "
                  f"plan generation {generation:.0f}", flush=True)  # fmt: skip
            for line in lines:
                if "config changed" in line or "planned" in line:
                    print(f"    {line}", flush=True)

    print(
        f"\n{args.model}: Locust step load {args.steps} users, {args.step_seconds:.0f} s a step; requests "
        f"that finished in each step's last {args.tail:g} s; median (min-max) of {args.repeats} "
        "alternated run(s)"
    )
    print(f"{'users':>6}{'static req/s':>24}{'static p99':>20}{'watch req/s':>24}{'watch p99':>20}"
          f"{'watch/static':>14}")  # fmt: skip
    for step, users in enumerate(levels):
        columns = {}
        for run in ("static", "watch"):
            columns[run] = (
                [per_step[step][1] for *_, per_step, _ in results[run]],
                [per_step[step][2] for *_, per_step, _ in results[run]],
            )
        ratio = statistics.median(columns["watch"][0]) / max(1e-9, statistics.median(columns["static"][0]))
        (static_rps, static_p99), (watch_rps, watch_p99) = columns["static"], columns["watch"]
        print(f"{users:>6}{spread(static_rps, 1):>24}{spread(static_p99, 0):>20}"
              f"{spread(watch_rps, 1):>24}{spread(watch_p99, 0):>20}{ratio:>14.2f}")  # fmt: skip
    print(f"Locust CSVs and watcher lines: {args.report_dir}/")
    for run in ("static", "watch", "steady"):
        for summary, lines, generation, _, seconds in results[run]:
            reloads = sum("config changed" in line for line in lines)
            print(f"{run}: {summary.requests} requests, {summary.failures} failed, {reloads} reloads, "
                  f"final plan generation {generation:.0f}, p99 {summary.p99_ms:.0f} ms overall "
                  f"({seconds:.0f} s)")  # fmt: skip


def two_by_one(model_dir: Path) -> dict:
    config = as_dict(read_config(model_dir / "config.pbtxt"))
    config["instance_group"] = [{"count": 2, "kind": "KIND_CPU"}]
    config["parameters"]["TORCH_NUM_THREADS"] = {"string_value": "1"}
    return config


def with_reload(server: TritonServer, model: str, config: dict, level: int, seconds: float, generation: int):
    """A closed loop with one reload RELOAD_AFTER_S in; (load result, seconds the reload took)."""
    took: list[float] = []

    def reload() -> None:
        time.sleep(RELOAD_AFTER_S)
        override = json.loads(json.dumps(config))
        override["parameters"]["TIDEPOOL_PLAN_GENERATION"] = {"string_value": str(generation)}
        with Connection.open("http", server.config.http_url) as http:
            began = time.perf_counter()
            http.client.load_model(model, config=json.dumps(override))
            took.append(time.perf_counter() - began)

    reloader = threading.Thread(target=reload)
    reloader.start()
    result = run_closed_loop(model, server.config.grpc_url, concurrency=level, duration_s=seconds)
    reloader.join()
    return result, took[0]


def main_reload() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="encoder")
    parser.add_argument("--levels", default="1,4")
    parser.add_argument("--seconds", type=float, default=12.0)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--niceness", default="10,0", help="TIDEPOOL_LOADING_NICENESS values, alternated")
    args = parser.parse_args()
    levels = positive_ints(args.levels, "--levels")
    # (niceness, level) -> [(served with reload / without, p99 with reload ms, reload s)]
    figures: dict[tuple[int, int], list[tuple[float, float, float]]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        repository = Path(tmp)
        model_dir = repository / args.model
        copy_model(MODEL_REPOSITORY / args.model, model_dir)
        config = two_by_one(model_dir)
        for round_number in range(args.rounds):
            for niceness in [int(n) for n in args.niceness.split(",")]:
                os.environ[NICENESS_VARIABLE] = str(niceness)
                server_config = ServerConfig.on_free_ports(repository, model_control="explicit")
                with (
                    TritonServer(server_config) as server,
                    Connection.open("http", server_config.http_url) as http,
                ):
                    http.client.load_model(args.model, config=json.dumps(config))
                    for index, level in enumerate(levels):
                        steady: LoadResult = run_closed_loop(
                            args.model, server_config.grpc_url, concurrency=level, duration_s=args.seconds
                        )
                        reloaded, took = with_reload(
                            server, args.model, config, level, args.seconds, index + 1
                        )
                        ratio = len(reloaded.latencies_ms) / max(1, len(steady.latencies_ms))
                        figures.setdefault((niceness, level), []).append(
                            (ratio, reloaded.percentile_ms(99), took)
                        )
                        print(
                            f"round {round_number + 1} niceness {niceness} c={level}: "
                            f"{steady.requests_per_s:.1f}/s steady (p99 {steady.percentile_ms(99):.0f} ms), "
                            f"{reloaded.requests_per_s:.1f}/s with a reload (p99 "
                            f"{reloaded.percentile_ms(99):.0f} ms, {len(reloaded.errors)} errors); "
                            f"the reload took {took:.1f} s",
                            flush=True,
                        )

    print(f"\n{args.model}, 2x1, one reload {RELOAD_AFTER_S:.0f} s into {args.seconds:.0f} s of closed loop; "
          f"median (min-max) of {args.rounds} rounds")  # fmt: skip
    print(f"{'niceness':>9}{'c':>4}{'served with / without reload':>32}{'p99 with reload ms':>24}"
          f"{'reload s':>20}")  # fmt: skip
    for (niceness, level), rows in sorted(figures.items()):
        ratios, p99s, took = zip(*rows, strict=True)
        print(f"{niceness:>9}{level:>4}{spread(list(ratios), 2):>32}{spread(list(p99s), 0):>24}"
              f"{spread(list(took), 1):>20}")  # fmt: skip


def main() -> None:
    run_subcommand({"replan": main_replan, "reload": main_reload}, __doc__ or "")


if __name__ == "__main__":
    main()
