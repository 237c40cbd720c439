"""Device memory from an owned CUDA memory pool (cuMemPoolCreate): stream-ordered allocation,
a release threshold raised so memory stays reserved between executions, maxSize as a hard cap."""

from __future__ import annotations

from tidepool.pool.resources.base import Allocation
from tidepool.pool.resources.driver import check, make_context_current, require_cuda

_NO_RELEASE = 2**64 - 1


class CudaResource:
    kind: str = "cuda"

    def __init__(self, device: int = 0, limit_bytes: int | None = None) -> None:
        require_cuda(device)
        from cuda.bindings import driver

        self._driver = driver
        self.device: int | None = device
        make_context_current(device)
        props = driver.CUmemPoolProps()
        props.allocType = driver.CUmemAllocationType.CU_MEM_ALLOCATION_TYPE_PINNED
        props.location.type = driver.CUmemLocationType.CU_MEM_LOCATION_TYPE_DEVICE
        props.location.id = device
        if limit_bytes:
            props.maxSize = limit_bytes
        self.handle = check(driver.cuMemPoolCreate(props))
        threshold = driver.cuuint64_t(_NO_RELEASE)
        check(
            driver.cuMemPoolSetAttribute(
                self.handle, driver.CUmemPool_attribute.CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, threshold
            )
        )

    def allocate(self, nbytes: int, stream: int | None = None) -> Allocation:
        ptr = check(self._driver.cuMemAllocFromPoolAsync(nbytes, self.handle, stream or 0))
        return Allocation(int(ptr), nbytes)

    def deallocate(self, allocation: Allocation, stream: int | None = None) -> None:
        check(self._driver.cuMemFreeAsync(allocation.ptr, stream or 0))

    def synchronize(self, stream: int | None) -> None:
        check(self._driver.cuStreamSynchronize(stream or 0))

    def attribute(self, name: str) -> int:
        """One of reserved/used current/high, e.g. 'RESERVED_MEM_CURRENT'."""
        attr = getattr(self._driver.CUmemPool_attribute, f"CU_MEMPOOL_ATTR_{name}")
        return int(check(self._driver.cuMemPoolGetAttribute(self.handle, attr)))

    def trim(self, keep_bytes: int) -> None:
        check(self._driver.cuCtxSynchronize())
        check(self._driver.cuMemPoolTrimTo(self.handle, keep_bytes))

    def set_as_device_default(self) -> None:
        """Make this the device's current pool, so cudaMallocAsync (and torch's cudaMallocAsync
        allocator backend) draws from it."""
        check(self._driver.cuDeviceSetMemPool(check(self._driver.cuDeviceGet(self.device)), self.handle))

    def close(self) -> None:
        if self.handle is not None:
            check(self._driver.cuCtxSynchronize())
            check(self._driver.cuMemPoolDestroy(self.handle))
            self.handle = None
