"""Device memory from an owned CUDA memory pool (cuMemPoolCreate): stream-ordered allocation,
a release threshold raised so memory stays reserved between executions, maxSize as a hard cap
(where the driver honours it). It holds the instance's own device buffers (its batches' inputs);
torch's allocations (weights, activations) stay with torch's caching allocator (docs/pool.md).
Its frees go on a stream of its own, which the pool orders after the streams that used the memory,
so that giving memory back waits for those uses only, not for the instance's whole queue."""

from __future__ import annotations

from tidepool.pool.resources import driver as cuda_driver
from tidepool.pool.resources.base import Allocation
from tidepool.pool.resources.driver import check, current

_NO_RELEASE = 2**64 - 1


class CudaResource:
    kind: str = "cuda"

    def __init__(self, device: int = 0, limit_bytes: int | None = None) -> None:
        cuda_driver.require_cuda(device)
        self.device: int | None = device
        self.context = cuda_driver.primary_context(device)
        self.events = cuda_driver.Events(self.context)
        version = cuda_driver.driver_version()
        # Where the driver ignores maxSize, MemoryPool.limit_bytes still caps what the pool reserves.
        self.capped_by_driver = bool(limit_bytes) and version >= cuda_driver.MAX_SIZE_DRIVER
        with current(self.context) as driver:
            props = driver.CUmemPoolProps()
            props.allocType = driver.CUmemAllocationType.CU_MEM_ALLOCATION_TYPE_PINNED
            props.location.type = driver.CUmemLocationType.CU_MEM_LOCATION_TYPE_DEVICE
            props.location.id = device
            if self.capped_by_driver:
                props.maxSize = limit_bytes
            self.handle = check(driver.cuMemPoolCreate(props))
            threshold = driver.cuuint64_t(_NO_RELEASE)
            attribute = driver.CUmemPool_attribute.CU_MEMPOOL_ATTR_RELEASE_THRESHOLD
            check(driver.cuMemPoolSetAttribute(self.handle, attribute, threshold))
            flags = driver.CUstream_flags.CU_STREAM_NON_BLOCKING  # nothing implicit with stream 0
            self.release_stream = int(check(driver.cuStreamCreate(flags)))

    def allocate(self, nbytes: int, stream: int | None = None) -> Allocation:
        with current(self.context) as driver:
            ptr = check(driver.cuMemAllocFromPoolAsync(nbytes, self.handle, stream or 0))
        return Allocation(int(ptr), nbytes)

    def deallocate(self, allocation: Allocation, stream: int | None = None) -> None:
        """Queued on the release stream, which the pool has ordered after the memory's uses."""
        with current(self.context) as driver:
            check(driver.cuMemFreeAsync(allocation.ptr, self.release_stream))

    def record_event(self, stream: int) -> cuda_driver.DriverEvent:
        return self.events.record(stream)

    def attribute(self, name: str) -> int:
        """One of reserved/used current/high, e.g. 'RESERVED_MEM_CURRENT'."""
        with current(self.context) as driver:
            attr = getattr(driver.CUmemPool_attribute, f"CU_MEMPOOL_ATTR_{name}")
            return int(check(driver.cuMemPoolGetAttribute(self.handle, attr)))

    def trim(self, keep_bytes: int) -> None:
        """Hand cached memory above `keep_bytes` back to the driver. A free still queued counts as in
        use to cuMemPoolTrimTo, so the host first waits for the release stream: for the frees, and
        the uses they were ordered after, nothing else."""
        with current(self.context) as driver:
            check(driver.cuStreamSynchronize(self.release_stream))
            check(driver.cuMemPoolTrimTo(self.handle, keep_bytes))

    def close(self) -> None:
        if self.handle is None:
            return
        with current(self.context) as driver:
            check(driver.cuStreamSynchronize(self.release_stream))
            check(driver.cuMemPoolDestroy(self.handle))
            check(driver.cuStreamDestroy(self.release_stream))
        self.handle = None
        self.events.close()
        if self.device is not None:
            cuda_driver.release_primary_context(self.device)
