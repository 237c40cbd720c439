"""GPU allocate+free medians, side by side in one run: the pool on a cache hit, torch.empty,
raw cuMemAllocFromPoolAsync/cuMemFreeAsync (the stream-ordered allocator), cuMemAlloc/cuMemFree.

    python -m benchmarks.pool_gpu      (needs a CUDA device)
"""

from __future__ import annotations

import torch
from cuda.bindings import driver

from benchmarks.pool_host import median_us, size_label
from tidepool.pool import MemoryPool
from tidepool.pool.resources.driver import check

MiB = 2**20


def main() -> None:
    torch.cuda.init()
    pool = MemoryPool("cuda", arena_bytes=256 * MiB)
    raw_pool = check(driver.cuDeviceGetDefaultMemPool(check(driver.cuDeviceGet(0))))
    print(f"{'size':>10}{'pool':>10}{'torch.empty':>13}{'mallocAsync':>13}{'cuMemAlloc':>12}")
    for nbytes in (256, 64 * 1024, MiB, 16 * MiB, 64 * MiB):
        pool.allocate(nbytes).free()

        def with_pool(n, nbytes=nbytes):
            for _ in range(n):
                pool.allocate(nbytes).free()

        def with_torch(n, nbytes=nbytes):
            for _ in range(n):
                torch.empty(nbytes, dtype=torch.uint8, device="cuda")

        def with_async(n, nbytes=nbytes):
            for _ in range(n):
                ptr = check(driver.cuMemAllocFromPoolAsync(nbytes, raw_pool, 0))
                check(driver.cuMemFreeAsync(ptr, 0))

        def with_malloc(n, nbytes=nbytes):
            for _ in range(n):
                check(driver.cuMemFree(check(driver.cuMemAlloc(nbytes))))

        figures = [median_us(f, 500, 9) for f in (with_pool, with_torch, with_async, with_malloc)]
        print(f"{size_label(nbytes):>10}" + "".join(f"{v:>12.2f} " for v in figures))
    print("(microseconds per allocate+free pair, medians of 9 rounds of 500)")
    pool.close()


if __name__ == "__main__":
    main()
