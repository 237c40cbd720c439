"""The planner against the search it replaces, each in one run on real servers:

python -m benchmarks.planner grid --model encoder [--latency-budget-ms 100] [--levels 1,2,4,8,16]
    [--window-s 2] [--rounds 2] [--max-output-error 0.01] [--no-grid] [--no-elastic-threads]
    [--grid-batches 1,2,4,8,16,32] [--grid-delays-ms 0,1,2,5]
  1. `tidepool plan --verify --write` as a user runs it, timed;
  2. the planned config, Triton's `dynamic_batching {}` (no delay, same everything else) and a plain
     Python backend (same model, 2 ms delay, at each split of the cores) measured level by level in
     turn, for --rounds rounds (the spread is printed);
  3. the grid: max_batch_size x delay x instances/threads, each loaded once, at every level;
  4. per level: the planned throughput against the best grid point within the p99 budget and
     against both baselines; planning time against the grid's.

python -m benchmarks.planner time [--models encoder,convnet]
  How long `tidepool plan --verify` takes against measuring every candidate it considered at every
  level the fixed way (a 1 s warm-up, two 2 s windows), and whether both pick the same config; plan
  time against Model Analyzer 1.58's brute search of the encoder on this machine (208 s); both
  winners' worst level in the grid's own figures (throughput / the best there), since configs that
  differ only in max_batch_size are often within the noise of each other.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.common.in_turn import Target, in_turn, spread, sweep, throughputs
from benchmarks.common.plain_backend import PLAIN_DELAY_US, plain_model
from benchmarks.common.subcommands import run_subcommand
from tidepool.clients.connection import Connection
from tidepool.clients.sweep import LevelResult, Sweep, SweepSettings
from tidepool.configfile import ModelConfig, as_dict, copy_model, read_config, set_instances
from tidepool.launcher.server import ServerConfig, TritonServer
from tidepool.machine import usable_cores
from tidepool.planning.candidates import candidates, shared_batch_plan, thread_splits
from tidepool.planning.config_writer import planned_config
from tidepool.planning.live import served_label
from tidepool.planning.plan import VERIFY_LEVELS, Budgets, Plan
from tidepool.planning.profile import Profile
from tidepool.planning.run import saved_profile_paths
from tidepool.planning.verify import VERIFY_RATE_LIMIT, LevelFigures, choose
from tidepool.spec import positive_ints
from tidepool.testing import MODEL_REPOSITORY

LATENCY_BUDGETS_MS = {"encoder": 100.0, "convnet": 250.0}
MEMORY_BUDGET = "1GiB"
MODEL_ANALYZER_S = 208.0  # Model Analyzer 1.58, brute search of the encoder on this machine


def plan_model(model_dir: Path, args: argparse.Namespace) -> tuple[str, float]:
    """`tidepool plan --verify --write` as a user runs it (its own profile and verification
    defaults); the chosen config's label and the seconds planning took."""
    began = time.perf_counter()
    command = [
        sys.executable, "-m", "tidepool.cli", "plan", str(model_dir), "--verify", "--write",
        "--latency-budget-ms", str(args.latency_budget_ms), "--memory-budget", f"{args.memory_budget_mib}MiB",
        "--max-output-error", str(args.max_output_error), "--levels", args.levels,
        "--report-dir", str(model_dir.parent / "verification"),
        *([] if args.elastic_threads else ["--no-elastic-threads"]),
    ]  # fmt: skip
    done = subprocess.run(command, stdin=subprocess.DEVNULL, capture_output=True, text=True)
    print(done.stdout, flush=True)
    if done.returncode != 0:
        raise SystemExit(f"tidepool plan failed ({done.returncode}):\n{done.stderr}")
    seconds = time.perf_counter() - began
    label = served_label(as_dict(read_config(model_dir / "config.pbtxt")), usable_cores())
    return label, seconds


def baseline_dirs(
    repository: Path, planned_dir: Path, cores: int, plain_delay_us: int = PLAIN_DELAY_US
) -> tuple[str, list[str]]:
    """`dynb`: the planned config with `dynamic_batching {}`; `plainIxT`: Triton's Python backend
    with a delay (2 ms by default), one per split of the cores (I instances x T torch threads), as
    a plan may be elastic (no fixed split) and the baseline should be the best a user would find by
    hand."""
    config = read_config(planned_dir / "config.pbtxt")
    config.dynamic_batching.Clear()
    config.dynamic_batching.SetInParent()
    copy_model(planned_dir, repository / "dynb", config)

    plains = []
    for threads in thread_splits(cores):
        name = f"plain{cores // threads}x{threads}"
        plain_model(repository / name, planned_dir, cores // threads, threads, plain_delay_us)
        plains.append(name)
    return "dynb", plains


def grid_point(base: ModelConfig, instances: int, threads: int, batch: int, delay_us: int) -> ModelConfig:
    """`base` as one point of the grid: its instances x threads, max_batch_size and delay, with no
    preferred sizes, pool sizes, elastic threads or priorities."""
    config = ModelConfig()
    config.CopyFrom(base)
    config.max_batch_size = batch
    config.dynamic_batching.Clear()
    config.dynamic_batching.SetInParent()
    config.dynamic_batching.max_queue_delay_microseconds = delay_us
    set_instances(config, instances)
    config.parameters["TORCH_NUM_THREADS"].string_value = str(threads)
    for key in ("POOL_LIMIT_BYTES", "POOL_INITIAL_BYTES", "ELASTIC_THREADS"):
        config.parameters.pop(key, None)
    return config


def grid_configs(planned_dir: Path, cores: int, batches: list[int], delays_us: list[int]):
    """(label, config as a dict) of each grid point: the planned config at each split of the cores,
    max_batch_size and delay, with no preferred sizes, pool sizes, elastic threads or priorities."""
    base = read_config(planned_dir / "config.pbtxt")
    for threads in thread_splits(cores):
        for batch in batches:
            for delay in delays_us:
                config = grid_point(base, cores // threads, threads, batch, delay)
                config.name = "grid"
                yield f"{cores // threads}x{threads} b{batch} d{delay / 1000:g}ms", as_dict(config)


def best_meeting(grid: dict[str, list[LevelResult]], index: int, budget: float) -> str | None:
    meeting = [(label, results[index]) for label, results in grid.items()]
    meeting = [(label, r) for label, r in meeting if r.errors == 0 and r.p99_ms <= budget]
    return max(meeting, key=lambda item: item[1].throughput)[0] if meeting else None


def confirm_best(server, http, planned_dir, args, levels, grid, configs, planned_name):
    """level -> (planned throughputs, best grid point's throughputs), measured in turn, --rounds rounds."""
    labels = {level: best_meeting(grid, i, args.latency_budget_ms) for i, level in enumerate(levels)}
    names = {label: f"best{i}" for i, label in enumerate(sorted({x for x in labels.values() if x}))}
    http.client.load_model(planned_name)
    for label, name in names.items():
        config = dict(configs[label], name=name)
        copy_model(planned_dir, planned_dir.parent / name)
        http.client.load_model(name, config=json.dumps(config))
    confirmed = {}
    for level, best_label in labels.items():
        if best_label is None:
            continue
        url = server.config.grpc_url
        pair = {"planned": Target(url, planned_name), best_label: Target(url, names[best_label])}
        both = in_turn(pair, [level], args.rounds, args.window_s)
        ours, best = throughputs(both["planned"][level]), throughputs(both[best_label][level])
        confirmed[level] = (ours, best)
        print(f"  confirmed c={level}: planned {ours}, best grid {best_label} {best}", flush=True)
    return confirmed


def main_grid() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="encoder")
    parser.add_argument("--latency-budget-ms", type=float, default=100.0)
    parser.add_argument("--memory-budget-mib", type=int, default=1024)
    parser.add_argument("--levels", default="1,2,4,8,16")
    parser.add_argument("--window-s", type=float, default=2.0)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--max-output-error", type=float, default=0.0)
    parser.add_argument("--no-grid", action="store_true", help="only the plan and the two baselines")
    parser.add_argument(
        "--elastic-threads",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="plan elastic candidates too (default: on, as tidepool plan)",
    )
    parser.add_argument("--grid-batches", default="1,2,4,8", help="the grid's max_batch_size values")
    parser.add_argument("--grid-delays-ms", default="0,2", help="the grid's queue delays")
    args = parser.parse_args()
    levels = [int(level) for level in args.levels.split(",")]
    grid_batches = positive_ints(args.grid_batches, "--grid-batches")
    grid_delays_us = [round(float(ms) * 1000) for ms in args.grid_delays_ms.split(",")]
    cores = usable_cores()
    with tempfile.TemporaryDirectory() as tmp:
        repository = Path(tmp)
        planned_dir = repository / args.model
        copy_model(MODEL_REPOSITORY / args.model, planned_dir)
        chosen, planning_s = plan_model(planned_dir, args)
        print(f"planned {chosen} in {planning_s:.0f} s", flush=True)
        dynb, plains = baseline_dirs(repository, planned_dir, cores)
        side_names = (args.model, dynb, *plains)
        copy_model(planned_dir, repository / "grid")

        server_config = ServerConfig.on_free_ports(repository, extra_args=["--model-control-mode=explicit"])
        with TritonServer(server_config) as server, Connection.open("http", server_config.http_url) as http:
            for name in side_names:
                http.client.load_model(name)
            by_name = {name: Target(server_config.grpc_url, name) for name in side_names}
            side_by_side = in_turn(by_name, levels, args.rounds, args.window_s)
            for name in side_names:
                http.client.unload_model(name)

            grid: dict[str, list[LevelResult]] = {}
            grid_began = time.perf_counter()
            if not args.no_grid:
                for label, config in grid_configs(planned_dir, cores, grid_batches, grid_delays_us):
                    http.client.load_model("grid", config=json.dumps(config))
                    grid[label] = sweep(Target(server_config.grpc_url, "grid"), levels, args.window_s, 2)
                    figures = ", ".join(f"c={r.level:g} {r.throughput:.0f}/s" for r in grid[label])
                    print(f"  grid {label}: {figures}", flush=True)
                http.client.unload_model("grid")
            grid_s = time.perf_counter() - grid_began
            # The best of many noisy measurements is biased high: the best grid point of each level
            # is measured again, in turn with the planned config, as many rounds as the baselines.
            configs = dict(grid_configs(planned_dir, cores, grid_batches, grid_delays_us))
            confirmed = (
                confirm_best(server, http, planned_dir, args, levels, grid, configs, args.model)
                if grid
                else {}
            )

    budget = args.latency_budget_ms
    print(f"\n{args.model}: planned {chosen}; latency budget {budget} ms; "
          f"median (min-max) of {args.rounds} rounds, infer/s")  # fmt: skip
    print(f"{'c':>4}{'planned':>22}{'dynamic_batching {}':>22}{'best plain python 2ms':>34}"
          f"{'best grid (meets p99)':>36}{'planned/grid':>14}{'planned/dynb':>14}"
          f"{'planned/plain':>15}")  # fmt: skip
    for level in levels:
        ours, dyn = throughputs(side_by_side[args.model][level]), throughputs(side_by_side[dynb][level])
        by_plain = {name: throughputs(side_by_side[name][level]) for name in plains}
        plain = max(plains, key=lambda name: statistics.median(by_plain[name]))
        pln, plain_text = by_plain[plain], f"{spread(by_plain[plain])} {plain.removeprefix('plain')}"
        found = best_meeting(grid, levels.index(level), budget)
        best_label, best = (found, grid[found][levels.index(level)]) if found else ("-", None)
        best_text = f"{best.throughput:.1f} {best_label}" if best else "-"
        ratio = f"{statistics.median(ours) / best.throughput:.3f}" if best else "-"
        if level in confirmed:
            again_ours, again_best = confirmed[level]
            ratio = f"{statistics.median(again_ours) / statistics.median(again_best):.3f}"
            best_text = f"{spread(again_best)} {best_label}"
        print(f"{level:>4}{spread(ours):>22}{spread(dyn):>22}{plain_text:>34}{best_text:>36}{ratio:>14}"
              f"{statistics.median(ours) / statistics.median(dyn):>14.3f}"
              f"{statistics.median(ours) / statistics.median(pln):>15.3f}")  # fmt: skip
    p99 = {name: [statistics.median(r.p99_ms for r in side_by_side[name][level]) for level in levels]
           for name in side_names}  # fmt: skip
    print(
        "p99 ms per level: "
        + "; ".join(f"{name} {[round(v, 1) for v in values]}" for name, values in p99.items())
    )
    if grid:
        print(f"planning (profiles + verification) took {planning_s:.0f} s, the grid {grid_s:.0f} s "
              f"({len(grid)} configs): {planning_s / grid_s:.1%}")  # fmt: skip


def plan(model_dir: Path, latency_ms: float) -> tuple[str, float]:
    """`tidepool plan --verify --write`: the chosen label and the wall time of the command."""
    began = time.perf_counter()
    command = [
        sys.executable, "-m", "tidepool.cli", "plan", str(model_dir), "--verify", "--write",
        "--latency-budget-ms", str(latency_ms), "--memory-budget", MEMORY_BUDGET,
        "--report-dir", str(model_dir.parent / "verification"),
    ]  # fmt: skip
    done = subprocess.run(command, stdin=subprocess.DEVNULL, capture_output=True, text=True)
    seconds = time.perf_counter() - began
    if done.returncode != 0:
        raise SystemExit(f"tidepool plan failed ({done.returncode}):\n{done.stderr}")
    table = done.stdout[done.stdout.find("candidate ") :].split("\nwrote", 1)[0]
    print(table, flush=True)
    found = re.search(r"^plan for \S+ \((.+)\), planned in", done.stdout, re.MULTILINE)
    assert found, done.stdout[-2000:]
    return found.group(1), seconds


def grid_of(model_dir: Path, budgets: Budgets) -> list[Plan]:
    """Every candidate the planner considered, from the profiles `plan --write` saved."""
    profiles = [Profile.read(path) for path in saved_profile_paths(model_dir)]
    ranked, _ = candidates(profiles, budgets)
    several = next((p for p in ranked if p.instance_count > 1), None)
    shared = shared_batch_plan(several, budgets) if several else None
    return ranked + ([shared] if shared and all(shared.label != p.label for p in ranked) else [])


def worst_level(label: str, figures: list[LevelFigures]) -> float:
    """A config's throughput at its worst level relative to the best there (the rule's second key)."""
    best: dict[int, float] = {}
    for f in figures:
        best[f.concurrency] = max(best.get(f.concurrency, 0.0), f.throughput)
    return min(f.throughput / best[f.concurrency] for f in figures if f.candidate == label)


Grid = tuple[str, float, list[LevelFigures]]  # the winner, the seconds it took, the figures


def measure_grid(model_dir: Path, grid: list[Plan], budgets: Budgets) -> Grid:
    """Every config at every level, two 2 s windows after a 1 s warm-up: the winner, the time, the
    figures."""
    began = time.perf_counter()
    base = read_config(model_dir / "config.pbtxt")
    figures: list[LevelFigures] = []
    with tempfile.TemporaryDirectory(prefix="tidepool-grid-") as tmp:
        names = [f"g{i}" for i in range(len(grid))]
        for name, config in zip(names, grid, strict=True):
            copy_model(model_dir, Path(tmp) / name, planned_config(base, config))
        server_config = ServerConfig.on_free_ports(
            Path(tmp), model_control="explicit", rate_limit=VERIFY_RATE_LIMIT
        )
        with TritonServer(server_config):
            for level in VERIFY_LEVELS:
                for name, config in zip(names, grid, strict=True):
                    settings = SweepSettings(name, url=server_config.grpc_url, concurrency=(level,),
                                             window_s=2.0, warmup_s=1.0, max_windows=2)  # fmt: skip
                    [result] = Sweep(settings).run()
                    figures.append(LevelFigures(
                        config.label, level, result.throughput, result.p50_ms, result.p99_ms, result.errors,
                        result.avg_batch, result.errors == 0 and result.p99_ms <= budgets.latency_ms,
                    ))  # fmt: skip
                    print(f"  grid c={level} {config.label}: {result.throughput:.1f}/s, "
                          f"p99 {result.p99_ms:.1f} ms", flush=True)  # fmt: skip
    return grid[choose(grid, figures)].label, time.perf_counter() - began, figures


def main_time() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="encoder,convnet")
    args = parser.parse_args()
    rows = []
    for model in args.models.split(","):
        with tempfile.TemporaryDirectory() as tmp:
            model_dir = Path(tmp) / model
            shutil.copytree(MODEL_REPOSITORY / model, model_dir, ignore=shutil.ignore_patterns("profiles"))
            latency = LATENCY_BUDGETS_MS.get(model, 100.0)
            print(f"== {model}: tidepool plan --verify", flush=True)
            chosen, plan_s = plan(model_dir, latency)
            budgets = Budgets(memory_bytes=2**30, latency_ms=latency)
            grid = grid_of(model_dir, budgets)
            print(f"== {model}: the grid, {len(grid)} configs x {len(VERIFY_LEVELS)} levels", flush=True)
            winner, grid_s, figures = measure_grid(model_dir, grid, budgets)
            scores = f"{worst_level(chosen, figures):.2f} / {worst_level(winner, figures):.2f}"
            rows.append((model, plan_s, chosen, grid_s, len(grid), winner, scores))
    print("\n| model | plan --verify | grid (configs) | plan/grid | plan/MA 208 s | planned | grid's winner "
          "| same | worst level in the grid, planned / winner |")  # fmt: skip
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for model, plan_s, chosen, grid_s, size, winner, scores in rows:
        same = "yes" if chosen == winner else "no"
        print(f"| {model} | {plan_s:.0f} s | {grid_s:.0f} s ({size}) | {plan_s / grid_s:.2f} | "
              f"{plan_s / MODEL_ANALYZER_S:.2f} | {chosen} | {winner} | {same} | {scores} |")  # fmt: skip


def main() -> None:
    run_subcommand({"grid": main_grid, "time": main_time}, __doc__ or "")


if __name__ == "__main__":
    main()
