"""The backend's execute path with the pool on and with POOL=off, without Triton: one fresh
process per variant and round (the pool's heap settings are process-wide), on the GPU where there
is one (the batch then goes through pinned staging into the instance's CUDA pool),
executions of N one-row requests as the dynamic batcher would hand them over. Runs where there
is no tritonserver for the device, e.g. the GPU machine (`benchmarks/gpu_check.sh`).

    python -m benchmarks.instance_on_off [--models encoder,convnet] [--rounds 2] [--seconds 8]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time

from tidepool.configfile import read_config_dict
from tidepool.testing import MODEL_REPOSITORY


def measure(model: str, pool: str, requests: int, seconds: float) -> dict:
    """In this process: load the instance, run executions of `requests` requests for `seconds`."""
    import torch

    from tidepool.inputs import random_inputs
    from tidepool.runtime.instance import ModelInstance

    config = read_config_dict(MODEL_REPOSITORY / model / "config.pbtxt")
    config["parameters"]["POOL"] = {"string_value": pool}
    instance = ModelInstance.load(config, MODEL_REPOSITORY / model)
    batch = [random_inputs(instance.model, batch=1, seed=i) for i in range(requests)]
    sync = torch.cuda.synchronize if instance.device.type == "cuda" else (lambda: None)
    for _ in range(3):
        instance.execute(batch)
    sync()
    times, faults, began = [], 0, time.perf_counter()
    while time.perf_counter() - began < seconds:
        started = time.perf_counter()
        execution = instance.execute(batch)
        sync()
        times.append(time.perf_counter() - started)
        faults += execution.page_faults
        assert all(isinstance(result, dict) for result in execution.results), execution.results
    return {
        "device": instance.device.type,
        "ms": statistics.median(times) * 1e3,
        "samples_per_s": requests * len(times) / sum(times),
        "faults": faults / len(times),
    }


def run_variant(model: str, pool: str, requests: int, seconds: float) -> dict:
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "benchmarks.instance_on_off",
            "--child",
            model,
            pool,
            str(requests),
            str(seconds),
        ],
        capture_output=True,
        text=True,
    )
    if done.returncode != 0:
        raise SystemExit(f"{model} POOL={pool} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="encoder,convnet")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--seconds", type=float, default=8.0)
    parser.add_argument("--child", nargs=4, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        model, pool, requests, seconds = args.child
        print(json.dumps(measure(model, pool, int(requests), float(seconds))))
        return
    rows = []
    for model in args.models.split(","):
        max_batch = int(read_config_dict(MODEL_REPOSITORY / model / "config.pbtxt")["max_batch_size"])
        for requests in sorted({1, max_batch}):
            runs: dict[str, list[dict]] = {"on": [], "off": []}
            for _ in range(args.rounds):  # alternate, so both variants share the machine's drift
                for pool in runs:
                    runs[pool].append(run_variant(model, pool, requests, args.seconds))
            rows.append((model, requests, runs))
            print(f"  measured {model}, executions of {requests} request(s)", flush=True)
    print(
        f"\n{'model':<9}{'device':>7}{'reqs':>6}{'on ms':>9}{'off ms':>9}{'thr ratio':>10}"
        f"{'on flt/ex':>10}{'off flt/ex':>11}"
    )
    for model, requests, runs in rows:
        on, off = (
            {key: statistics.mean(r[key] for r in runs[p]) for key in runs[p][0] if key != "device"}
            for p in ("on", "off")
        )
        print(
            f"{model:<9}{runs['on'][0]['device']:>7}{requests:>6}{on['ms']:>9.2f}{off['ms']:>9.2f}"
            f"{on['samples_per_s'] / off['samples_per_s']:>10.3f}{on['faults']:>10.0f}{off['faults']:>11.0f}"
        )
    print("ms = median per execution; thr ratio = on / off samples/s (>1: pool faster); flt/ex = page faults")


if __name__ == "__main__":
    main()
