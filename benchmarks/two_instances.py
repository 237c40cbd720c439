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
from pathlib import Path

from benchmarks.in_turn import Target, copy_variant, in_turn, median_of, spread, throughputs
from benchmarks.plan_vs_grid import plain_model
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
        with TritonServer(config):
            targets = {label: Target(config.grpc_url, name) for label, name in names.items()}
            results = in_turn(targets, [1], args.rounds, args.window_s)
    print(f"\n{args.model}, c=1, {cores} cores, median (min-max) of {args.rounds} rounds")
    print("| variant | infer/s | compute per request, us (median) | infer/s / one instance of its backend |")
    print("| --- | --- | --- | --- |")
    for label in names:
        rates = throughputs(results[label][1])
        ratio = statistics.median(rates) / median_of(results[BASELINES[label]][1], "throughput")
        compute = median_of(results[label][1], "compute_infer_us")  # Triton's, per request
        print(f"| {label} | {spread(rates)} | {compute:.0f} | {ratio:.2f} |")


if __name__ == "__main__":
    main()
