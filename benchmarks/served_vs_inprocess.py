"""Served throughput of a model at concurrency N (real tritonserver, gRPC) next to the same
module called in-process at the batch sizes the server formed, in one run.

    .venv/bin/python -m benchmarks.served_vs_inprocess [--model encoder] [--concurrency 8]
"""

from __future__ import annotations

import argparse
import time

import torch

from tidepool.clients.closed_loop import run_closed_loop
from tidepool.clients.connection import Connection
from tidepool.configfile import read_config_dict
from tidepool.inputs import random_inputs
from tidepool.launcher.server import ServerConfig, TritonServer
from tidepool.runtime.instance import ModelInstance
from tidepool.testing import MODEL_REPOSITORY


def in_process_samples_per_s(instance: ModelInstance, batch: int, duration_s: float) -> float:
    inputs = random_inputs(instance.model, batch=batch)
    instance.execute([inputs])  # warm-up
    done, began = 0, time.perf_counter()
    while time.perf_counter() - began < duration_s:
        instance.execute([inputs])
        done += batch
    return done / (time.perf_counter() - began)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="encoder")
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--duration-s", type=float, default=15.0)
    args = parser.parse_args()

    config = ServerConfig.on_free_ports(MODEL_REPOSITORY)
    with TritonServer(config) as server:
        with Connection.open("grpc", server.config.grpc_url) as grpc:
            run_closed_loop(args.model, server.config.grpc_url, concurrency=args.concurrency, duration_s=2)
            before = grpc.statistics(args.model)["model_stats"][0]
            served = run_closed_loop(
                args.model, server.config.grpc_url, concurrency=args.concurrency, duration_s=args.duration_s
            )
            after = grpc.statistics(args.model)["model_stats"][0]
    inferences = int(after["inference_count"]) - int(before["inference_count"])
    executions = int(after["execution_count"]) - int(before["execution_count"])
    mean_batch = inferences / max(executions, 1)

    model_dir = MODEL_REPOSITORY / args.model
    instance = ModelInstance.load(read_config_dict(model_dir / "config.pbtxt"), model_dir)
    sizes = sorted({1, max(1, round(mean_batch)), args.concurrency})
    print(
        f"\n{args.model}: served over gRPC at concurrency {args.concurrency}, "
        f"{args.duration_s:.0f} s, torch threads {torch.get_num_threads()}"
    )
    print(f"{'path':<34}{'samples/s':>12}{'p50 ms':>10}{'p99 ms':>10}{'ratio':>8}")
    base = served.samples_per_s
    print(
        f"{f'served (mean batch {mean_batch:.1f})':<34}{base:>12.1f}"
        f"{served.percentile_ms(50):>10.1f}{served.percentile_ms(99):>10.1f}{1.0:>8.2f}"
    )
    for size in sizes:
        rate = in_process_samples_per_s(instance, size, duration_s=5)
        print(f"{f'in-process batch {size}':<34}{rate:>12.1f}{'':>10}{'':>10}{rate / base:>8.2f}")
    print(f"errors: {len(served.errors)}")


if __name__ == "__main__":
    main()
