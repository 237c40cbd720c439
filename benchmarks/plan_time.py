"""How long `tidepool plan --verify` takes against the grid it replaces, and whether both pick the
same config. For each model, in one run:

1. `tidepool plan MODEL --verify --write` as a user runs it (profile, rank, adaptive verification
   of the top candidates), timed, on a copy of the model without saved profiles;
2. the grid: every candidate the planner considered (each ranked plan and the shared-batch twin),
   all served at once and measured at every level the old, fixed way (a 1 s warm-up, then two 2 s
   windows each), timed from the profiles step 1 saved; its winner by the same rule (most levels
   within the p99 budget, then the best worst level);
3. plan time / grid time, plan time / Model Analyzer 1.58's brute search of the encoder on this
   machine (208 s, as measured when issue 34 was filed), whether the winners agree, and, since
   configs that differ only in max_batch_size are often within the noise of each other, both
   winners' worst level in the grid's own figures (throughput / the best there).

    .venv/bin/python -m benchmarks.plan_time [--models encoder,convnet] [--latency-budget-ms 100]
"""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from tidepool.clients.sweep import Sweep, SweepSettings
from tidepool.configfile import copy_model, read_config
from tidepool.launcher.server import ServerConfig, TritonServer
from tidepool.planning.candidates import candidates, shared_batch_plan
from tidepool.planning.config_writer import planned_config
from tidepool.planning.plan import VERIFY_LEVELS, Budgets, Plan
from tidepool.planning.profile import Profile
from tidepool.planning.run import saved_profile_paths
from tidepool.planning.verify import VERIFY_RATE_LIMIT, LevelFigures, choose
from tidepool.testing import MODEL_REPOSITORY

MODEL_ANALYZER_S = 208.0  # Model Analyzer 1.58, brute search of the encoder (issue 34)
LATENCY_BUDGETS_MS = {"encoder": 100.0, "convnet": 250.0}
MEMORY_BUDGET = "1GiB"


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


def main() -> None:
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


if __name__ == "__main__":
    main()
