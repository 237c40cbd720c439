"""What a second, idle instance costs a lone request: one instance with every core against two of
them where the rate limiter's priorities keep every request on the first, for Tidepool (fixed
threads, and the shipped elastic pair) and for Triton's plain Python backend. One server with
`--rate-limit=execution_count`, concurrency 1, the variants in turn, --rounds rounds. Prints
infer/s (median, min-max), Triton's own compute time per request (the stub's round trip and
`execute`), and the ratio to one instance of the same backend.

    .venv/bin/python -m benchmarks.two_instances [--model encoder] [--rounds 8] [--window-s 3]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
from collections.abc import Sequence
from pathlib import Path

from benchmarks.in_turn import Target, copy_variant, in_turn, spread
from benchmarks.plan_vs_grid import plain_model
from tidepool.clients.connection import Connection
from tidepool.configfile import read_config, set_instances, write_config
from tidepool.launcher.server import ServerConfig, TritonServer
from tidepool.machine import usable_cores
from tidepool.testing import MODEL_REPOSITORY

# label -> the one-instance variant it is compared with
BASELINES = {"one": "one", "pair fixed": "one", "pair elastic": "one", "plain one": "plain one",
             "plain pair": "plain one"}  # fmt: skip


def build(repository: Path, source: Path, cores: int) -> dict[str, str]:
    """label -> model name, each variant written to `repository`."""
    threads = str(cores)
    copy_variant(source, repository, "one", instances=1, ELASTIC_THREADS="false", TORCH_NUM_THREADS=threads)
    copy_variant(
        source, repository, "pair_fixed", instances=2, prefer_first=True,
        ELASTIC_THREADS="false", TORCH_NUM_THREADS=threads,
    )  # fmt: skip
    copy_variant(source, repository, "pair_elastic")  # as shipped
    plain_model(repository / "plain_one", source, 1, cores, 0)
    plain_pair = plain_model(repository / "plain_pair", source, 2, cores, 0)
    config = read_config(plain_pair / "config.pbtxt")
    write_config(plain_pair / "config.pbtxt", set_instances(config, 2, prefer_first=True))
    return {label: label.replace(" ", "_") for label in BASELINES}


def compute_us(http: Connection, models: Sequence[str]) -> dict[str, tuple[int, int]]:
    """model -> (requests, compute_infer ns) as Triton counts them so far."""
    figures = {}
    for model in models:
        stats = http.client.get_inference_statistics(model)["model_stats"][0]["inference_stats"]
        figures[model] = (int(stats["success"]["count"]), int(stats["compute_infer"]["ns"]))
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="encoder")
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--window-s", type=float, default=3.0)
    args = parser.parse_args()
    cores = usable_cores()
    with tempfile.TemporaryDirectory() as tmp:
        repository = Path(tmp)
        names = build(repository, MODEL_REPOSITORY / args.model, cores)
        config = ServerConfig.on_free_ports(repository, rate_limit="execution_count")
        with TritonServer(config), Connection.open("http", config.http_url) as http:
            before = compute_us(http, list(names.values()))
            targets = {label: Target(config.grpc_url, name) for label, name in names.items()}
            results = in_turn(targets, [1], args.rounds, args.window_s)
            after = compute_us(http, list(names.values()))
    print(f"\n{args.model}, c=1, {cores} cores, median (min-max) of {args.rounds} rounds")
    print("| variant | infer/s | compute per request, us | infer/s / one instance of its backend |")
    print("| --- | --- | --- | --- |")
    for label, name in names.items():
        rates = [r.throughput for r in results[label][1]]
        baseline = [r.throughput for r in results[BASELINES[label]][1]]
        requests = after[name][0] - before[name][0]
        compute = (after[name][1] - before[name][1]) / max(1, requests) / 1000
        ratio = statistics.median(rates) / statistics.median(baseline)
        print(f"| {label} | {spread(rates)} | {compute:.0f} | {ratio:.2f} |")


if __name__ == "__main__":
    main()
