"""The planner against a brute-force grid, measured on one real server in one run: every
max_batch_size in 1..32 (powers of 2) x a few queue delays, each loaded into the server and
swept at one concurrency; then the planned config. Prints throughput, p99, whether the latency
budget is met, and the wall time of planning next to the grid's.

    .venv/bin/python -m benchmarks.plan_vs_grid [--model encoder] [--latency-budget-ms 100]
"""

from __future__ import annotations

import argparse
import json
import shutil
import tempfile
import time
from pathlib import Path

import tritonclient.http as httpclient

from tidepool.clients.sweep import Sweep, SweepSettings
from tidepool.configfile import read_config_dict
from tidepool.launcher.server import ServerConfig, TritonServer
from tidepool.planning.planner import Budgets, plan, write_plan
from tidepool.planning.profiler import profile_model
from tidepool.testing import MODEL_REPOSITORY

DELAYS_US = (0, 2000, 10000)
BATCHES = (1, 2, 4, 8, 16, 32)


def measure(server: TritonServer, model: str, config: dict, concurrency: int, window_s: float):
    client = httpclient.InferenceServerClient(server.config.http_url)
    client.load_model(model, config=json.dumps(config))
    client.close()
    settings = SweepSettings(
        model,
        url=server.config.grpc_url,
        concurrency=(concurrency,),
        window_s=window_s,
        warmup_s=2,
        max_windows=3,
    )
    return Sweep(settings).run()[0]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="encoder")
    parser.add_argument("--latency-budget-ms", type=float, default=100.0)
    parser.add_argument("--memory-budget-mib", type=int, default=1024)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--window-s", type=float, default=4.0)
    args = parser.parse_args()
    budget = args.latency_budget_ms
    with tempfile.TemporaryDirectory() as tmp:
        repository = Path(tmp)
        model_dir = repository / args.model
        shutil.copytree(
            MODEL_REPOSITORY / args.model, model_dir, ignore=shutil.ignore_patterns("__pycache__")
        )

        began = time.perf_counter()
        profile = profile_model(model_dir, BATCHES, max_latency_ms=budget)
        budgets = Budgets(memory_bytes=args.memory_budget_mib * 2**20, latency_ms=budget)
        result = plan(profile, budgets)
        write_plan(model_dir, budgets, result)
        planning_s = time.perf_counter() - began
        planned = read_config_dict(model_dir / "config.pbtxt")

        config = ServerConfig.on_free_ports(
            repository, extra_args=["--model-control-mode=explicit", f"--load-model={args.model}"]
        )
        rows = []
        with TritonServer(config) as server:
            grid_began = time.perf_counter()
            for batch in BATCHES:
                for delay in DELAYS_US:
                    candidate = json.loads(json.dumps(planned))
                    candidate["max_batch_size"] = batch
                    candidate["dynamic_batching"] = {"max_queue_delay_microseconds": delay}
                    candidate["parameters"]["POOL_WARMUP_BATCH_SIZES"] = {"string_value": str(batch)}
                    level = measure(server, args.model, candidate, args.concurrency, args.window_s)
                    rows.append((f"grid b={batch} delay={delay}us", level))
                    print(
                        f"  {rows[-1][0]}: {level.throughput:.1f} infer/s, p99 {level.p99_ms:.1f} ms",
                        flush=True,
                    )
            grid_s = time.perf_counter() - grid_began
            planned_level = measure(server, args.model, planned, args.concurrency, args.window_s)
    meeting = [(name, r) for name, r in rows if r.p99_ms <= budget and r.errors == 0]
    best_name, best = max(meeting, key=lambda item: item[1].throughput) if meeting else ("none", None)
    print(
        f"\n{args.model}: latency budget {budget} ms, concurrency {args.concurrency}, {len(rows)} grid points"
    )
    print(f"{'config':<30}{'infer/s':>10}{'p99 ms':>9}{'errors':>8}{'meets':>7}")
    for name, r in [
        *rows,
        (f"planned b={result.max_batch_size} delay={result.max_queue_delay_us}us", planned_level),
    ]:
        print(f"{name:<30}{r.throughput:>10.1f}{r.p99_ms:>9.1f}{r.errors:>8d}{str(r.p99_ms <= budget):>7}")
    if best is not None:
        print(f"\nbest grid point meeting the budget: {best_name}, {best.throughput:.1f} infer/s")
        print(f"planned / best grid throughput: {planned_level.throughput / best.throughput:.3f}")
    print(f"planning took {planning_s:.1f} s, the grid {grid_s:.1f} s: {planning_s / grid_s:.1%}")


if __name__ == "__main__":
    main()
