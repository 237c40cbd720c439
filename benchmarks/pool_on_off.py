"""The same models served with the pool on and with POOL=off, by one real server in one run:
throughput and p99 latency ratios at concurrency 1 and 8 (runs alternate on/off to share noise),
and the minor page faults per execution that /metrics reports for each.

    .venv/bin/python -m benchmarks.pool_on_off [--duration-s 10] [--rounds 2]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from tidepool.clients.closed_loop import LoadResult, run_closed_loop
from tidepool.clients.metrics import scrape, value, values
from tidepool.launcher.server import ServerConfig, TritonServer
from tidepool.runtime.metrics import DEFAULT_INTERVAL_S
from tidepool.testing import MODEL_REPOSITORY, model_variant

CASES = [("encoder", 1, 1), ("encoder", 8, 1), ("convnet", 1, 16), ("convnet", 8, 16)]  # model, conc, batch


@dataclass
class Runs:
    loads: list[LoadResult]
    faults: float = 0.0
    executions: float = 0.0

    @property
    def samples_per_s(self) -> float:
        return statistics.mean(r.samples_per_s for r in self.loads)

    @property
    def p99_ms(self) -> float:
        return statistics.mean(r.percentile_ms(99) for r in self.loads)


def execution_figures(metrics_url: str, model: str) -> tuple[float, float]:
    time.sleep(2 * DEFAULT_INTERVAL_S)  # the backend sends its metrics every interval
    samples = scrape(metrics_url)
    return (
        value(samples, "tidepool_page_faults_total", model=model),
        sum(values(samples, "tidepool_batches_total", model=model)),
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--duration-s", type=float, default=10.0)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        for model in ("encoder", "convnet"):
            model_variant(MODEL_REPOSITORY / model, root, f"{model}_pool_on", POOL="on")
            model_variant(MODEL_REPOSITORY / model, root, f"{model}_pool_off", POOL="off")
        rows = []
        with TritonServer(ServerConfig.on_free_ports(root)) as server:
            url, metrics_url = server.config.grpc_url, server.config.metrics_url
            for model, concurrency, batch in CASES:
                runs = {"on": Runs([]), "off": Runs([])}
                for variant in runs:  # warm-up both
                    run_closed_loop(
                        f"{model}_pool_{variant}", url, concurrency=concurrency, duration_s=2, batch=batch
                    )
                for _ in range(args.rounds):
                    for variant, measured in runs.items():
                        name = f"{model}_pool_{variant}"
                        faults, executions = execution_figures(metrics_url, name)
                        measured.loads.append(
                            run_closed_loop(
                                name, url, concurrency=concurrency, duration_s=args.duration_s, batch=batch
                            )
                        )
                        faults_after, executions_after = execution_figures(metrics_url, name)
                        measured.faults += faults_after - faults
                        measured.executions += executions_after - executions
                rows.append((model, concurrency, batch, runs))
                print(f"  measured {model} concurrency {concurrency} batch {batch}", flush=True)
    print(
        f"\n{'model':<9}{'conc':>5}{'batch':>6}{'on inf/s':>10}{'off inf/s':>10}{'thr ratio':>10}"
        f"{'on p99':>8}{'off p99':>9}{'p99 ratio':>10}{'on flt/ex':>10}{'off flt/ex':>11}{'errors':>7}"
    )
    for model, concurrency, batch, runs in rows:
        on, off = runs["on"], runs["off"]
        errors = sum(len(r.errors) for measured in runs.values() for r in measured.loads)
        print(
            f"{model:<9}{concurrency:>5}{batch:>6}{on.samples_per_s:>10.1f}{off.samples_per_s:>10.1f}"
            f"{on.samples_per_s / off.samples_per_s:>10.3f}{on.p99_ms:>8.1f}{off.p99_ms:>9.1f}"
            f"{off.p99_ms / on.p99_ms:>10.3f}{on.faults / on.executions:>10.0f}"
            f"{off.faults / off.executions:>11.0f}{errors:>7}"
        )
    print(
        "thr ratio = on / off throughput (>1: pool faster); p99 ratio = off / on p99 (>1: pool lower);\n"
        "flt/ex = minor page faults per execution (memory touched afresh), from /metrics"
    )


if __name__ == "__main__":
    main()
