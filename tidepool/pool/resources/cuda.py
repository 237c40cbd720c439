"""Device memory from an owned CUDA memory pool (cuMemPoolCreate): stream-ordered allocation,
a release threshold raised so memory stays reserved between executions, maxSize as a hard cap
(where the driver honours it). It holds the instance's own device buffers (its batches' inputs);
torch's allocations (weights, activations) stay with torch's caching allocator (docs/pool.md)."""

from __future__ import annotations

from tidepool.pool.resources import driver as cuda_driver
from tidepool.pool.resources.base import Allocation
from tidepool.pool.resources.driver import check

_NO_RELEASE = 2**64 - 1


class CudaResource:
    kind: str = "cuda"

    def __init__(self, device: int = 0, limit_bytes: int | None = None) -> None:
        cuda_driver.require_cuda(device)
        driver = self._driver = cuda_driver.bindings()
        self.device: int | None = device
        self.context = cuda_driver.primary_context(device)
        self.events = cuda_driver.Events(self.context)
        self._current()
        props = driver.CUmemPoolProps()
        props.allocType = driver.CUmemAllocationType.CU_MEM_ALLOCATION_TYPE_PINNED
        props.location.type = driver.CUmemLocationType.CU_MEM_LOCATION_TYPE_DEVICE
        props.location.id = device
        version = cuda_driver.driver_version()
        # Where the driver ignores maxSize, MemoryPool.limit_bytes still caps what the pool reserves.
        self.capped_by_driver = bool(limit_bytes) and version >= cuda_driver.MAX_SIZE_DRIVER
        if self.capped_by_driver:
            props.maxSize = limit_bytes
        self.handle = check(driver.cuMemPoolCreate(props))
        threshold = driver.cuuint64_t(_NO_RELEASE)
        check(
            driver.cuMemPoolSetAttribute(
                self.handle, driver.CUmemPool_attribute.CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, threshold
            )
        )

    def _current(self) -> None:
        cuda_driver.make_current(self.context)

    def allocate(self, nbytes: int, stream: int | None = None) -> Allocation:
        self._current()
        ptr = check(self._driver.cuMemAllocFromPoolAsync(nbytes, self.handle, stream or 0))
        return Allocation(int(ptr), nbytes)

    def deallocate(self, allocation: Allocation, stream: int | None = None) -> None:
        self._current()
        check(self._driver.cuMemFreeAsync(allocation.ptr, stream or 0))

    def record_event(self, stream: int) -> cuda_driver.DriverEvent:
        return self.events.record(stream)

    def attribute(self, name: str) -> int:
        """One of reserved/used current/high, e.g. 'RESERVED_MEM_CURRENT'."""
        self._current()
        attr = getattr(self._driver.CUmemPool_attribute, f"CU_MEMPOOL_ATTR_{name}")
        return int(check(self._driver.cuMemPoolGetAttribute(self.handle, attr)))

    def trim(self, keep_bytes: int) -> None:
        """Hand cached memory above `keep_bytes` back to the driver. The pool frees arenas on the
        default stream, after the streams that used them (MemoryPool orders it): a free still queued
        there counts as in use to cuMemPoolTrimTo, so the host waits for that stream first."""
        self._current()
        check(self._driver.cuStreamSynchronize(0))
        check(self._driver.cuMemPoolTrimTo(self.handle, keep_bytes))

    def close(self) -> None:
        if self.handle is not None:
            self._current()
            check(self._driver.cuCtxSynchronize())
            check(self._driver.cuMemPoolDestroy(self.handle))
            self.handle = None
            self.events.close()
