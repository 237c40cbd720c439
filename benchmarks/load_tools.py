"""The three load tools against one server, one after the other, for one model at one
concurrency: `tidepool sweep`, Locust (`tidepool load`) and NVIDIA's perf_analyzer; then how
many requests per second one sweep process sustains against a trivial model.

    make perf-analyzer && .venv/bin/python -m benchmarks.load_tools [--model encoder] [--concurrency 8]
"""

from __future__ import annotations

import argparse
import csv
import json
import resource
import subprocess
import tempfile
import time
from pathlib import Path

from tidepool.clients.connection import Connection
from tidepool.clients.locust_run import LoadSettings, run_load
from tidepool.clients.sweep import Sweep, SweepSettings
from tidepool.inputs import random_inputs
from tidepool.launcher.server import ServerConfig, TritonServer
from tidepool.testing import REPO_ROOT, linked_repository

PERF_ANALYZER = REPO_ROOT / ".tools" / "perf_analyzer"


def perf_analyzer(
    model: str, url: str, concurrency: int, window_ms: int, workdir: Path
) -> tuple[float, float]:
    with Connection.open("grpc", url) as grpc:
        spec = grpc.model_spec(model)
    inputs = random_inputs(spec, batch=1)
    data = {"data": [{name: array[0].ravel().tolist() for name, array in inputs.items()}]}
    data_file, out_file = workdir / "pa_data.json", workdir / "pa.csv"
    data_file.write_text(json.dumps(data))
    command = [str(PERF_ANALYZER), "-m", model, "-i", "grpc", "-u", url]
    command += ["--concurrency-range", str(concurrency), "--measurement-interval", str(window_ms)]
    command += ["--input-data", str(data_file), "-f", str(out_file)]
    subprocess.run(command, check=True, capture_output=True, text=True)
    row = next(csv.DictReader(out_file.open()))
    return float(row["Inferences/Second"]), float(row["p99 latency"]) / 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="encoder")
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--window-s", type=float, default=10.0)
    args = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        workdir = Path(tmp)
        repository = workdir / "repository"
        repository.mkdir()
        config = ServerConfig.on_free_ports(linked_repository(repository))
        with TritonServer(config) as server:
            url = server.config.grpc_url
            settings = SweepSettings(
                args.model,
                url=url,
                concurrency=(args.concurrency,),
                window_s=args.window_s,
                warmup_s=3,
                max_windows=4,
            )
            sweep = Sweep(settings).run()[0]
            rows.append(("tidepool sweep", sweep.throughput, sweep.p99_ms))
            users = args.concurrency
            duration = f"{int(args.window_s * 3)}s"
            load = run_load(
                LoadSettings(args.model, users, users, duration, url=url, report_dir=workdir / "locust")
            )
            rows.append(("locust", load.requests_per_s, load.p99_ms))
            if PERF_ANALYZER.exists():
                window_ms = int(args.window_s * 1000)
                rows.append(
                    ("perf_analyzer", *perf_analyzer(args.model, url, args.concurrency, window_ms, workdir))
                )
            else:
                print("perf_analyzer not found: run `make perf-analyzer` first")

            before = resource.getrusage(resource.RUSAGE_SELF)
            began = time.perf_counter()
            trivial = SweepSettings(
                "identity", url=url, concurrency=(1, 4, 16, 32), window_s=3, warmup_s=1, max_windows=2
            )
            generator = Sweep(trivial).run()
            wall = time.perf_counter() - began
            after = resource.getrusage(resource.RUSAGE_SELF)
    base = rows[0][1]
    print(f"\n{args.model} at concurrency {args.concurrency} over gRPC, one tool after the other:")
    print(f"{'tool':<16}{'infer/s':>10}{'p99 ms':>9}{'vs sweep':>10}")
    for tool, throughput, p99 in rows:
        print(f"{tool:<16}{throughput:>10.1f}{p99:>9.1f}{throughput / base:>10.3f}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    best = max(generator, key=lambda r: r.throughput)
    print("\nload generator against the trivial `identity` model (one sweep process, asyncio gRPC):")
    for level in generator:
        print(
            f"  concurrency {level.level:>3g}: {level.throughput:>8.1f} req/s, p99 {level.p99_ms:6.1f} ms, "
            f"server batch {level.avg_batch:.2f}"
        )
    print(
        f"  best {best.throughput:.0f} req/s; the sweep process used {cpu / wall:.0%} of one core "
        "on average (2 cores shared with the server)"
    )


if __name__ == "__main__":
    main()
