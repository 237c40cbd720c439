"""The memory pool against what it replaces, side by side in one run:

python -m benchmarks.pool alloc [--quick] [--gpu]
    allocate+free on a cache hit next to numpy.empty / torch.empty (and, --gpu, next to
    torch.empty on the device and the driver's own allocators); allocate+write-every-byte;
    a replay of a serving pattern (reuse ratio, fragmentation, upstream allocations)
python -m benchmarks.pool execute [--models convnet] [--rounds 2] [--seconds 6]
    the backend's execute path without Triton, one fresh process per variant and round (the
    pool's heap settings are process-wide): POOL=off against the pool, and on a GPU the pool's
    device inputs against torch's caching allocator for them (POOL_KIND=pinned); throughput,
    p50/p99 per execution, and upstream allocations per 1,000 requests
python -m benchmarks.pool served [--duration-s 10] [--rounds 2]
    both example models served with the pool on and POOL=off by one real server: throughput
    and p99 at concurrency 1 and 8, and page faults per execution from /metrics
python -m benchmarks.pool budget [--model encoder] [--levels 1,2,4,8,16] [--rounds 3]
    what the node budget costs: NODE_BUDGET on against off, under the rate limiter and without it
    (benchmarks/common/node_budget.py)
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from benchmarks.common import node_budget
from tidepool.pool import MemoryPool
from tidepool.pool.host_heap import minor_page_faults

KiB, MiB = 2**10, 2**20


def median_us(run: Callable[[int], None], iterations: int, repeats: int = 15) -> float:
    """Median over `repeats` rounds of the mean time of one call, in microseconds."""
    rounds = []
    for _ in range(repeats):
        began = time.perf_counter()
        run(iterations)
        rounds.append((time.perf_counter() - began) / iterations * 1e6)
    return statistics.median(rounds)


def size_label(nbytes: int) -> str:
    if nbytes >= MiB:
        return f"{nbytes // MiB} MiB"
    return f"{nbytes // KiB} KiB" if nbytes >= KiB else f"{nbytes} B"


# -- alloc --------------------------------------------------------------------------------------


def alloc_cache_hit(sizes: list[int], iterations: int) -> None:
    import torch

    print("\nallocate + free, cache hit (us per pair; ratio = other / pool)")
    print(f"{'size':>10}{'pool':>10}{'numpy.empty':>14}{'torch.empty':>14}{'np/pool':>10}{'torch/pool':>12}")
    pool = MemoryPool("host", arena_bytes=128 * MiB)
    for nbytes in sizes:
        pool.allocate(nbytes).free()

        def with_pool(n: int, nbytes: int = nbytes) -> None:
            allocate = pool.allocate
            for _ in range(n):
                allocate(nbytes).free()

        def with_numpy(n: int, nbytes: int = nbytes) -> None:
            for _ in range(n):
                np.empty(nbytes, dtype=np.uint8)

        def with_torch(n: int, nbytes: int = nbytes) -> None:
            for _ in range(n):
                torch.empty(nbytes, dtype=torch.uint8)

        p, n, t = (median_us(f, iterations) for f in (with_pool, with_numpy, with_torch))
        print(f"{size_label(nbytes):>10}{p:>10.2f}{n:>14.2f}{t:>14.2f}{n / p:>10.2f}{t / p:>12.2f}")
    pool.close()


def alloc_write(sizes: list[int], repeats: int) -> None:
    print("\nallocate + write every byte (ms; ratio = numpy / pool, > 1 means the pool is faster;")
    print("faults = minor page faults per iteration, when the allocator hands out memory afresh)")
    print(f"{'size':>10}{'pool':>10}{'numpy':>10}{'ratio':>8}{'pool faults':>13}{'numpy faults':>14}")
    pool = MemoryPool("host", arena_bytes=256 * MiB)

    def ms_and_faults(run: Callable[[int], None], iterations: int) -> tuple[float, float]:
        faults = minor_page_faults()
        ms = median_us(run, iterations, repeats) / 1e3
        return ms, (minor_page_faults() - faults) / (iterations * repeats)

    for nbytes in sizes:
        pool.allocate(nbytes).free()

        def with_pool(n: int, nbytes: int = nbytes) -> None:
            for _ in range(n):
                with pool.allocate(nbytes) as block:
                    block.as_numpy().fill(1)

        def with_numpy(n: int, nbytes: int = nbytes) -> None:
            for _ in range(n):
                np.empty(nbytes, dtype=np.uint8).fill(1)

        iterations = max(1, (64 * MiB) // nbytes)
        p, pool_faults = ms_and_faults(with_pool, iterations)
        n, numpy_faults = ms_and_faults(with_numpy, iterations)
        figures = f"{p:>10.3f}{n:>10.3f}{n / p:>8.2f}{pool_faults:>13.0f}{numpy_faults:>14.0f}"
        print(f"{size_label(nbytes):>10}{figures}")
    pool.close()


# Buffers of one execution at batch b, shaped like the example models' (bytes per sample).
REPLAY_BUFFERS = [128 * 4, 256 * 4, 128 * 256 * 4, 128 * 1024 * 4, 3 * 224 * 224 * 4, 1000 * 4]


def alloc_replay(executions: int, threshold: float, seed: int = 0) -> None:
    rng = np.random.default_rng(seed)
    pool = MemoryPool("host", fragmentation_threshold=threshold)
    warmup = list(range(1, 33))  # every batch size once
    fragmentation: list[float] = []
    began = time.perf_counter()
    after_warmup = None
    for index, batch in enumerate(warmup + list(rng.integers(1, 33, size=executions))):
        with pool.execution():
            for per_sample in REPLAY_BUFFERS:
                pool.allocate(int(per_sample * batch))
        if index == len(warmup) - 1:
            after_warmup = pool.stats()
        elif index >= len(warmup):
            fragmentation.append(pool.stats().fragmentation or 0.0)
    elapsed = time.perf_counter() - began
    stats = pool.stats()
    assert after_warmup is not None
    allocs = stats.num_allocs - after_warmup.num_allocs
    hits = stats.cache_hits - after_warmup.cache_hits
    print(
        f"\nreplay: {executions} executions, batch sizes 1..32, {len(REPLAY_BUFFERS)} buffers each, "
        f"fragmentation_threshold {threshold}"
    )
    print(f"  reuse ratio after warm-up      {hits / allocs:.5f}  ({hits}/{allocs})")
    print(
        f"  upstream allocs after warm-up  {stats.upstream_allocs - after_warmup.upstream_allocs}"
        f"  (during warm-up: {after_warmup.upstream_allocs})"
    )
    print(f"  fragmentation after each exec  max {max(fragmentation):.3f}  mean {np.mean(fragmentation):.3f}")
    print(f"  free-list hits                 {stats.free_list_hits / stats.num_allocs:.3f} of allocations")
    print(
        f"  reserved                       {stats.reserved_bytes / MiB:.0f} MiB, peak allocated "
        f"{stats.peak_allocated_bytes / MiB:.0f} MiB"
    )
    print(f"  time per execution             {elapsed / (executions + len(warmup)) * 1e6:.1f} us")
    pool.close()


def alloc_gpu(sizes: list[int]) -> None:
    import torch
    from cuda.bindings import driver

    from tidepool.pool.resources.driver import check

    torch.cuda.init()
    pool = MemoryPool("cuda", arena_bytes=256 * MiB)
    raw_pool = check(driver.cuDeviceGetDefaultMemPool(check(driver.cuDeviceGet(0))))
    print("\nGPU allocate + free (us per pair; medians of 9 rounds of 500)")
    print(f"{'size':>10}{'pool':>10}{'torch.empty':>13}{'mallocAsync':>13}{'cuMemAlloc':>12}")
    for nbytes in sizes:
        pool.allocate(nbytes).free()

        def with_pool(n: int, nbytes: int = nbytes) -> None:
            for _ in range(n):
                pool.allocate(nbytes).free()

        def with_torch(n: int, nbytes: int = nbytes) -> None:
            for _ in range(n):
                torch.empty(nbytes, dtype=torch.uint8, device="cuda")

        def with_async(n: int, nbytes: int = nbytes) -> None:
            for _ in range(n):
                check(driver.cuMemFreeAsync(check(driver.cuMemAllocFromPoolAsync(nbytes, raw_pool, 0)), 0))

        def with_malloc(n: int, nbytes: int = nbytes) -> None:
            for _ in range(n):
                check(driver.cuMemFree(check(driver.cuMemAlloc(nbytes))))

        figures = [median_us(f, 500, 9) for f in (with_pool, with_torch, with_async, with_malloc)]
        print(f"{size_label(nbytes):>10}" + "".join(f"{v:>12.2f} " for v in figures))
    pool.close()


def run_alloc(args: argparse.Namespace) -> None:
    hit_sizes = [256, 4 * KiB, 64 * KiB, 1 * MiB, 16 * MiB, 64 * MiB]
    write_sizes = [1 * MiB, 16 * MiB, 64 * MiB, 256 * MiB]
    if args.quick:
        hit_sizes, write_sizes = [256, 1 * MiB, 64 * MiB], [1 * MiB, 64 * MiB]
    if args.gpu:
        alloc_gpu([256, 64 * KiB, MiB, 16 * MiB, 64 * MiB])
        return
    alloc_cache_hit(hit_sizes, iterations=2000 if args.quick else 20000)
    alloc_write(write_sizes, repeats=5 if args.quick else 9)
    for threshold in (0.10, 1.0):  # the default, and free lists kept across executions
        alloc_replay(1000 if args.quick else 10000, threshold)


# -- execute ------------------------------------------------------------------------------------

# name -> the parameters it sets; "device inputs: torch" keeps pinned staging but takes the device
# inputs from torch's caching allocator rather than the instance's CUDA pool.
VARIANTS = {"pool off": {"POOL": "off"}, "pool": {}, "device inputs: torch": {"POOL_KIND": "pinned"}}


def measure_execute(model: str, variant: str, requests: int, seconds: float) -> dict[str, object]:
    """In this process: load the instance, run executions of `requests` one-row requests."""
    import torch

    from tidepool.configfile import read_config_dict
    from tidepool.inputs import random_inputs
    from tidepool.runtime.instance import ModelInstance
    from tidepool.testing import MODEL_REPOSITORY

    config = read_config_dict(MODEL_REPOSITORY / model / "config.pbtxt")
    config["parameters"] |= {name: {"string_value": v} for name, v in VARIANTS[variant].items()}
    if torch.cuda.is_available():  # the example configs say KIND_CPU: on a GPU machine, measure the GPU
        config["parameters"]["DEVICE"] = {"string_value": "cuda"}
    instance = ModelInstance.load(config, MODEL_REPOSITORY / model)
    on_gpu = instance.device.type == "cuda"
    batch = [random_inputs(instance.model, batch=1, seed=i) for i in range(requests)]

    def upstream() -> int:
        """Allocations from the driver or the system: the pools' arenas, and torch's segments."""
        pooled = sum(pool.stats().upstream_allocs for pool in instance.pools)
        return pooled + (int(torch.cuda.memory_stats().get("segment.all.allocated", 0)) if on_gpu else 0)

    for _ in range(3):
        instance.execute(batch)
    times, faults, before, began = [], 0, upstream(), time.perf_counter()
    while time.perf_counter() - began < seconds:
        started = time.perf_counter()
        execution = instance.execute(batch)
        if on_gpu:
            torch.cuda.synchronize()  # GPU_OUTPUTS=device would return before the pass ran
        times.append(time.perf_counter() - started)
        faults += execution.page_faults
        assert all(isinstance(result, dict) for result in execution.results), execution.results
    return {
        "device": instance.device.type,
        "p50_ms": statistics.median(times) * 1e3,
        "p99_ms": float(np.percentile(times, 99)) * 1e3,
        "samples_per_s": requests * len(times) / sum(times),
        "upstream_per_1000": (upstream() - before) * 1000 / (requests * len(times)),
        "faults": faults / len(times),
    }


def run_execute(args: argparse.Namespace) -> None:
    from tidepool.configfile import read_config_dict
    from tidepool.testing import MODEL_REPOSITORY, cuda_available

    variants = list(VARIANTS) if cuda_available() else ["pool off", "pool"]
    rows = []
    for model in args.models.split(","):
        max_batch = int(read_config_dict(MODEL_REPOSITORY / model / "config.pbtxt")["max_batch_size"])
        for requests in sorted({1, max_batch}):
            runs: dict[str, list[dict]] = {variant: [] for variant in variants}
            for _ in range(args.rounds):  # alternate, so every variant shares the machine's drift
                for variant in variants:
                    child = [
                        sys.executable,
                        "-m",
                        "benchmarks.pool",
                        "execute",
                        "--child",
                        model,
                        variant,
                        str(requests),
                        str(args.seconds),
                    ]
                    done = subprocess.run(child, capture_output=True, text=True)
                    if done.returncode != 0:
                        raise SystemExit(f"{model} {variant} failed:\n{done.stderr[-3000:]}")
                    runs[variant].append(json.loads(done.stdout.strip().splitlines()[-1]))
            rows.append((model, requests, runs))
            print(f"  measured {model}, executions of {requests} request(s)", flush=True)
    print(
        f"\n{'model':<9}{'device':>7}{'reqs':>6}  {'variant':<22}{'samples/s':>10}{'p50 ms':>8}{'p99 ms':>8}"
        f"{'upstream/1k':>12}{'flt/ex':>8}{'thr / off':>10}"
    )
    for model, requests, runs in rows:
        mean = {
            variant: {
                key: statistics.mean(r[key] for r in measured) for key in measured[0] if key != "device"
            }
            for variant, measured in runs.items()
        }
        for variant, figures in mean.items():
            ratio = figures["samples_per_s"] / mean["pool off"]["samples_per_s"]
            print(
                f"{model:<9}{runs[variant][0]['device']:>7}{requests:>6}  {variant:<22}"
                f"{figures['samples_per_s']:>10.1f}{figures['p50_ms']:>8.2f}{figures['p99_ms']:>8.2f}"
                f"{figures['upstream_per_1000']:>12.2f}{figures['faults']:>8.0f}{ratio:>10.3f}"
            )
    print(
        "per execution of `reqs` one-row requests, means of the rounds; upstream/1k = allocations from the\n"
        "system or driver (pool arenas, torch's CUDA segments) per 1,000 requests; flt/ex = page faults"
    )


# -- served -------------------------------------------------------------------------------------


@dataclass
class ServedRuns:
    samples_per_s: list[float]
    p99_ms: list[float]
    faults: float = 0.0
    executions: float = 0.0
    errors: int = 0


# (model, concurrency, rows per request)
SERVED_CASES = [("encoder", 1, 1), ("encoder", 8, 1), ("convnet", 1, 16), ("convnet", 8, 16)]


def run_served(args: argparse.Namespace) -> None:
    from tidepool.clients.closed_loop import run_closed_loop
    from tidepool.clients.metrics import scrape, value, values
    from tidepool.launcher.server import ServerConfig, TritonServer
    from tidepool.runtime.metrics import DEFAULT_INTERVAL_S
    from tidepool.testing import MODEL_REPOSITORY, model_variant

    def execution_figures(metrics_url: str, model: str) -> tuple[float, float]:
        time.sleep(2 * DEFAULT_INTERVAL_S)  # the backend sends its metrics every interval
        samples = scrape(metrics_url)
        faults = value(samples, "tidepool_page_faults_total", model=model)
        return faults, sum(values(samples, "tidepool_batches_total", model=model))

    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        for model in ("encoder", "convnet"):
            model_variant(MODEL_REPOSITORY / model, root, f"{model}_pool_on", POOL="on")
            model_variant(MODEL_REPOSITORY / model, root, f"{model}_pool_off", POOL="off")
        with TritonServer(ServerConfig.on_free_ports(root)) as server:
            url, metrics_url = server.config.grpc_url, server.config.metrics_url
            for model, concurrency, batch in SERVED_CASES:
                runs = {"on": ServedRuns([], []), "off": ServedRuns([], [])}
                for variant in runs:  # warm-up both
                    run_closed_loop(
                        f"{model}_pool_{variant}", url, concurrency=concurrency, duration_s=2, batch=batch
                    )
                for _ in range(args.rounds):
                    for variant, measured in runs.items():
                        name = f"{model}_pool_{variant}"
                        faults, executions = execution_figures(metrics_url, name)
                        load = run_closed_loop(
                            name, url, concurrency=concurrency, duration_s=args.duration_s, batch=batch
                        )
                        faults_after, executions_after = execution_figures(metrics_url, name)
                        measured.samples_per_s.append(load.samples_per_s)
                        measured.p99_ms.append(load.percentile_ms(99))
                        measured.faults += faults_after - faults
                        measured.executions += executions_after - executions
                        measured.errors += len(load.errors)
                rows.append((model, concurrency, batch, runs))
                print(f"  measured {model} concurrency {concurrency} batch {batch}", flush=True)
    print(
        f"\n{'model':<9}{'conc':>5}{'batch':>6}{'on inf/s':>10}{'off inf/s':>10}{'thr ratio':>10}"
        f"{'on p99':>8}{'off p99':>9}{'p99 ratio':>10}{'on flt/ex':>10}{'off flt/ex':>11}{'errors':>7}"
    )
    for model, concurrency, batch, runs in rows:
        on, off = runs["on"], runs["off"]
        on_thr, off_thr = statistics.mean(on.samples_per_s), statistics.mean(off.samples_per_s)
        on_p99, off_p99 = statistics.mean(on.p99_ms), statistics.mean(off.p99_ms)
        print(
            f"{model:<9}{concurrency:>5}{batch:>6}{on_thr:>10.1f}{off_thr:>10.1f}{on_thr / off_thr:>10.3f}"
            f"{on_p99:>8.1f}{off_p99:>9.1f}{off_p99 / on_p99:>10.3f}{on.faults / on.executions:>10.0f}"
            f"{off.faults / off.executions:>11.0f}{on.errors + off.errors:>7}"
        )
    print(
        "thr ratio = on / off throughput (>1: pool faster); p99 ratio = off / on p99 (>1: pool lower);\n"
        "flt/ex = minor page faults per execution (memory touched afresh), from /metrics"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    alloc = commands.add_parser("alloc", help="allocate+free and a serving replay, against numpy and torch")
    alloc.add_argument("--quick", action="store_true", help="fewer sizes and iterations")
    alloc.add_argument("--gpu", action="store_true", help="the CUDA pool against torch and the driver")
    execute = commands.add_parser("execute", help="the instance's execute path, pool on and off")
    execute.add_argument("--models", default="encoder,convnet")
    execute.add_argument("--rounds", type=int, default=2)
    execute.add_argument("--seconds", type=float, default=6.0)
    execute.add_argument("--child", nargs=4, help=argparse.SUPPRESS)
    served = commands.add_parser("served", help="served by one real server, pool on and off")
    served.add_argument("--duration-s", type=float, default=10.0)
    served.add_argument("--rounds", type=int, default=2)
    node_budget.add_arguments(commands.add_parser("budget", help="NODE_BUDGET on against off, served"))
    args = parser.parse_args()
    if args.command == "execute" and args.child:
        model, variant, requests, seconds = args.child
        print(json.dumps(measure_execute(model, variant, int(requests), float(seconds))))
    else:
        commands_run = {
            "alloc": run_alloc,
            "execute": run_execute,
            "served": run_served,
            "budget": node_budget.run,
        }
        commands_run[args.command](args)


if __name__ == "__main__":
    main()
