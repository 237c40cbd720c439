"""The same models served with the pool on and with POOL=off, by one real server in one run:
throughput and p99 latency ratios at concurrency 1 and 8 (runs alternate on/off to share noise).

    .venv/bin/python -m benchmarks.pool_on_off [--duration-s 10] [--rounds 2]
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import tempfile
from pathlib import Path

from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2

from backend.server import ServerConfig, TritonServer
from clients.closed_loop import run_closed_loop
from tests.conftest import MODEL_REPOSITORY

CASES = [("encoder", 1, 1), ("encoder", 8, 1), ("convnet", 1, 16), ("convnet", 8, 16)]  # model, conc, batch


def copy_model(source: Path, target_root: Path, name: str, pool: str) -> None:
    target = target_root / name
    shutil.copytree(source, target, ignore=shutil.ignore_patterns("__pycache__"))
    config = text_format.Parse((source / "config.pbtxt").read_text(), model_config_pb2.ModelConfig())
    config.name = name
    config.parameters["POOL"].string_value = pool
    (target / "config.pbtxt").write_text(text_format.MessageToString(config))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--duration-s", type=float, default=10.0)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        for model in ("encoder", "convnet"):
            copy_model(MODEL_REPOSITORY / model, root, f"{model}_pool_on", "on")
            copy_model(MODEL_REPOSITORY / model, root, f"{model}_pool_off", "off")
        config = ServerConfig.on_free_ports(root)
        rows = []
        with TritonServer(config) as server:
            url = server.config.grpc_url
            for model, concurrency, batch in CASES:
                runs = {"on": [], "off": []}
                for variant in ("on", "off"):  # warm-up both
                    run_closed_loop(
                        f"{model}_pool_{variant}", url, concurrency=concurrency, duration_s=2, batch=batch
                    )
                for _ in range(args.rounds):
                    for variant in ("on", "off"):
                        runs[variant].append(
                            run_closed_loop(
                                f"{model}_pool_{variant}",
                                url,
                                concurrency=concurrency,
                                duration_s=args.duration_s,
                                batch=batch,
                            )
                        )
                rows.append((model, concurrency, batch, runs))
                print(f"  measured {model} concurrency {concurrency} batch {batch}", flush=True)
    print(
        f"\n{'model':<9}{'conc':>5}{'batch':>6}{'on inf/s':>10}{'off inf/s':>10}{'thr ratio':>10}"
        f"{'on p99':>8}{'off p99':>9}{'p99 ratio':>10}{'errors':>7}"
    )
    for model, concurrency, batch, runs in rows:
        on_rate = statistics.mean(r.samples_per_s for r in runs["on"])
        off_rate = statistics.mean(r.samples_per_s for r in runs["off"])
        on_p99 = statistics.mean(r.percentile_ms(99) for r in runs["on"])
        off_p99 = statistics.mean(r.percentile_ms(99) for r in runs["off"])
        errors = sum(len(r.errors) for variant in runs.values() for r in variant)
        print(
            f"{model:<9}{concurrency:>5}{batch:>6}{on_rate:>10.1f}{off_rate:>10.1f}"
            f"{on_rate / off_rate:>10.3f}"
            f"{on_p99:>8.1f}{off_p99:>9.1f}{off_p99 / on_p99:>10.3f}{errors:>7}"
        )
    print("thr ratio = on / off throughput (>1: pool faster); p99 ratio = off / on p99 (>1: pool lower)")


if __name__ == "__main__":
    main()
