"""Host memory pool figures, side by side in one run (medians over many iterations):
allocate+free on a cache hit next to numpy.empty and torch.empty; allocate+write-every-byte
next to numpy.empty+write; a replay of a serving pattern.

    .venv/bin/python -m benchmarks.pool_host [--quick]
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np
import torch

from tidepool.pool import MemoryPool
from tidepool.pool.host_heap import minor_page_faults

KiB, MiB = 2**10, 2**20


def median_us(run, iterations: int, repeats: int = 15) -> float:
    """Median over `repeats` rounds of the mean time of one call, in microseconds."""
    rounds = []
    for _ in range(repeats):
        began = time.perf_counter()
        run(iterations)
        rounds.append((time.perf_counter() - began) / iterations * 1e6)
    return statistics.median(rounds)


def ms_and_faults(run, iterations: int, repeats: int) -> tuple[float, float]:
    """median_us in milliseconds, and the minor page faults of one call on average."""
    faults = minor_page_faults()
    ms = median_us(run, iterations, repeats) / 1e3
    return ms, (minor_page_faults() - faults) / (iterations * repeats)


def size_label(nbytes: int) -> str:
    return (
        f"{nbytes // MiB} MiB"
        if nbytes >= MiB
        else f"{nbytes // KiB} KiB"
        if nbytes >= KiB
        else f"{nbytes} B"
    )


def bench_cache_hit(sizes, iterations: int) -> None:
    print("\nallocate + free, cache hit (us per pair; ratio = other / pool)")
    print(f"{'size':>10}{'pool':>10}{'numpy.empty':>14}{'torch.empty':>14}{'np/pool':>10}{'torch/pool':>12}")
    pool = MemoryPool("host", arena_bytes=128 * MiB)
    for nbytes in sizes:
        pool.allocate(nbytes).free()

        def with_pool(n, nbytes=nbytes):
            allocate = pool.allocate
            for _ in range(n):
                allocate(nbytes).free()

        def with_numpy(n, nbytes=nbytes):
            for _ in range(n):
                np.empty(nbytes, dtype=np.uint8)

        def with_torch(n, nbytes=nbytes):
            for _ in range(n):
                torch.empty(nbytes, dtype=torch.uint8)

        p, n, t = (median_us(f, iterations) for f in (with_pool, with_numpy, with_torch))
        print(f"{size_label(nbytes):>10}{p:>10.2f}{n:>14.2f}{t:>14.2f}{n / p:>10.2f}{t / p:>12.2f}")
    pool.close()


def bench_write(sizes, repeats: int) -> None:
    print("\nallocate + write every byte (ms; ratio = numpy / pool, > 1 means the pool is faster;")
    print("faults = minor page faults per iteration, when the allocator hands out memory afresh)")
    print(f"{'size':>10}{'pool':>10}{'numpy':>10}{'ratio':>8}{'pool faults':>13}{'numpy faults':>14}")
    pool = MemoryPool("host", arena_bytes=256 * MiB)
    for nbytes in sizes:
        pool.allocate(nbytes).free()

        def with_pool(n, nbytes=nbytes):
            for _ in range(n):
                with pool.allocate(nbytes) as block:
                    block.as_numpy().fill(1)

        def with_numpy(n, nbytes=nbytes):
            for _ in range(n):
                np.empty(nbytes, dtype=np.uint8).fill(1)

        iterations = max(1, (64 * MiB) // nbytes)
        p, pool_faults = ms_and_faults(with_pool, iterations, repeats)
        n, numpy_faults = ms_and_faults(with_numpy, iterations, repeats)
        figures = f"{p:>10.3f}{n:>10.3f}{n / p:>8.2f}{pool_faults:>13.0f}{numpy_faults:>14.0f}"
        print(f"{size_label(nbytes):>10}{figures}")
    pool.close()


# Buffers of one execution at batch b, shaped like the example models' (bytes per sample).
REPLAY_BUFFERS = [128 * 4, 256 * 4, 128 * 256 * 4, 128 * 1024 * 4, 3 * 224 * 224 * 4, 1000 * 4]


def bench_replay(executions: int, threshold: float, seed: int = 0) -> None:
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
    print(f"  reuse ratio overall            {stats.reuse_ratio:.5f}")
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
    print(f"  time per execution            {elapsed / (executions + len(warmup)) * 1e6:.1f} us")
    pool.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer sizes and iterations")
    args = parser.parse_args()
    hit_sizes = [256, 4 * KiB, 64 * KiB, 1 * MiB, 16 * MiB, 64 * MiB]
    write_sizes = [1 * MiB, 16 * MiB, 64 * MiB, 256 * MiB]
    if args.quick:
        hit_sizes, write_sizes = [256, 1 * MiB, 64 * MiB], [1 * MiB, 64 * MiB]
    bench_cache_hit(hit_sizes, iterations=2000 if args.quick else 20000)
    bench_write(write_sizes, repeats=5 if args.quick else 9)
    for threshold in (0.10, 1.0):  # the default, and free lists kept across executions
        bench_replay(1000 if args.quick else 10000, threshold)


if __name__ == "__main__":
    main()
