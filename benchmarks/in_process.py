"""Served against in process: each model served by `tidepool serve` with its planned config, next
to the same model run in this process through the same loader, at the same precision and graph
(the limit: no server, no stub, no network). At concurrency 1 the in-process figure is one request
at a time with the threads a lone request gets served (every core where the plan is elastic); at
saturation, batches of max_batch_size with every core. Both example models and the two real ones
(a Hugging Face BERT and a ResNet-style classifier, planned here first, as a user would).

    .venv/bin/python -m benchmarks.in_process [--models encoder,convnet,bert,classifier]
        [--saturation 16] [--seconds 8]
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from tidepool.clients.sweep import Sweep, SweepSettings
from tidepool.configfile import read_config_dict
from tidepool.launcher.server import ServerConfig, TritonServer
from tidepool.machine import usable_cores
from tidepool.testing import MODEL_REPOSITORY, REPO_ROOT

REAL_MODELS = REPO_ROOT / "tests" / "real_models"
PLAN = ["--memory-budget", "1GiB", "--latency-budget-ms", "250", "--write"]


def repository(root: Path, models: list[str]) -> Path:
    """The example models as shipped; the real ones copied and planned here."""
    for model in models:
        source = MODEL_REPOSITORY / model if (MODEL_REPOSITORY / model).is_dir() else REAL_MODELS / model
        shutil.copytree(source, root / model, ignore=shutil.ignore_patterns("profiles"))
        if source.parent == REAL_MODELS:
            print(f"  planning {model}", flush=True)
            done = subprocess.run([sys.executable, "-m", "tidepool.cli", "plan", str(root / model), *PLAN],
                                  capture_output=True, text=True, stdin=subprocess.DEVNULL)  # fmt: skip
            if done.returncode != 0:
                raise SystemExit(f"planning {model} failed:\n{done.stderr[-2000:]}")
    return root


def in_process(model_dir: Path, rows: int, threads: int, seconds: float) -> dict[str, float]:
    """In a fresh process (torch's threads and heap are process-wide): executions of `rows` rows."""
    child = [sys.executable, "-m", "benchmarks.in_process", "--child"]
    child += [str(model_dir), str(rows), str(threads), str(seconds)]
    done = subprocess.run(child, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"{model_dir.name} in process failed:\n{done.stderr[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def measure_child(model_dir: Path, rows: int, threads: int, seconds: float) -> dict[str, float]:
    from tidepool.inputs import random_inputs
    from tidepool.runtime.instance import ModelInstance

    config = read_config_dict(model_dir / "config.pbtxt")
    config["parameters"] |= {"TORCH_NUM_THREADS": {"string_value": str(threads)},
                             "ELASTIC_THREADS": {"string_value": "false"}}  # fmt: skip
    config["instance_group"] = [{"count": 1, "kind": "KIND_CPU"}]
    instance = ModelInstance.load(config, model_dir)
    requests = [random_inputs(instance.model, batch=1, seed=i) for i in range(rows)]
    for _ in range(5):
        instance.execute(requests)
    times, began = [], time.perf_counter()
    while time.perf_counter() - began < seconds:
        started = time.perf_counter()
        instance.execute(requests)
        times.append(time.perf_counter() - started)
    return {"per_s": rows * len(times) / sum(times), "p99_ms": float(np.percentile(times, 99)) * 1e3}


def served(url: str, model: str, concurrency: int, seconds: float) -> dict[str, float]:
    settings = SweepSettings(model, url=url, concurrency=(concurrency,), window_s=seconds / 2, warmup_s=1.0,
                             max_windows=2)  # fmt: skip
    [level] = Sweep(settings).run()
    return {"per_s": level.throughput, "p99_ms": level.p99_ms}


def lone_threads(config: dict) -> int:
    """The torch threads a lone request gets served: every core where the plan is elastic."""
    parameters = config.get("parameters", {})
    threads = int(parameters.get("TORCH_NUM_THREADS", {}).get("string_value") or usable_cores())
    elastic = parameters.get("ELASTIC_THREADS", {}).get("string_value") == "true"
    return usable_cores() if elastic else threads


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="encoder,convnet,bert,classifier")
    parser.add_argument(
        "--saturation", type=int, default=16, help="the concurrency that saturates the server"
    )
    parser.add_argument("--seconds", type=float, default=8.0)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--child", nargs=4, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        model_dir, rows, threads, seconds = args.child
        print(json.dumps(measure_child(Path(model_dir), int(rows), int(threads), float(seconds))))
        return
    models = args.models.split(",")
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        root = repository(Path(tmp), models)
        with TritonServer(ServerConfig.on_free_ports(root)) as server:
            url = server.config.grpc_url
            for model in models:
                config = read_config_dict(root / model / "config.pbtxt")
                figures: dict[str, list[dict[str, float]]] = {"s1": [], "p1": [], "sN": [], "pN": []}
                for _ in range(args.rounds):  # alternated, so that drift falls on both
                    figures["s1"].append(served(url, model, 1, args.seconds))
                    figures["p1"].append(in_process(root / model, 1, lone_threads(config), args.seconds))
                    figures["sN"].append(served(url, model, args.saturation, args.seconds))
                    batch = int(config["max_batch_size"])
                    figures["pN"].append(in_process(root / model, batch, usable_cores(), args.seconds))
                medians = {
                    key: {m: statistics.median(f[m] for f in measured) for m in ("per_s", "p99_ms")}
                    for key, measured in figures.items()
                }
                rows.append((model, config, medians))
                print(f"  measured {model}", flush=True)
    print(
        f"\n| model | served config | c=1: served / in process, infer/s | p99 ms | "
        f"c={args.saturation}: served / in process (batches of max_batch_size, every core) | p99 ms |"
    )
    print("| --- | --- | --- | --- | --- | --- |")
    for model, config, f in rows:
        print(
            f"| {model} | {label(config)} | {ratio(f['s1'], f['p1'], 'per_s')} | {pair(f['s1'], f['p1'])} | "
            f"{ratio(f['sN'], f['pN'], 'per_s')} | {pair(f['sN'], f['pN'])} |"
        )


def label(config: dict) -> str:
    parameters = config.get("parameters", {})
    instances = sum(int(group.get("count", 1)) for group in config.get("instance_group", [{}]))
    precision = parameters.get("PRECISION", {}).get("string_value", "fp32")
    graph = parameters.get("GRAPH", {}).get("string_value", "eager")
    return f"{instances} inst, {precision}, {graph}, b{config['max_batch_size']}"


def ratio(ours: dict[str, float], limit: dict[str, float], key: str) -> str:
    return f"{ours[key]:.1f} / {limit[key]:.1f} = **{ours[key] / limit[key]:.2f}**"


def pair(ours: dict[str, float], limit: dict[str, float]) -> str:
    return f"{ours['p99_ms']:.1f} / {limit['p99_ms']:.1f}"


if __name__ == "__main__":
    main()
