"""Page-locked host memory (cuMemHostAlloc): the staging area for fast host-to-device copies, and
events on the streams whose copies read or write it (the pool reuses a block only once its copy ran)."""

from __future__ import annotations

import ctypes

import numpy as np

from tidepool.pool.resources import driver as cuda_driver
from tidepool.pool.resources.base import Allocation
from tidepool.pool.resources.driver import check, current


class PinnedResource:
    kind: str = "pinned"
    release_stream: int = 0

    def __init__(self, device: int = 0) -> None:
        cuda_driver.require_cuda(device)
        self.device: int | None = device
        self.context = cuda_driver.primary_context(device)
        self._retained = True  # the primary context, until close
        self.events = cuda_driver.Events(self.context)

    def allocate(self, nbytes: int, stream: int | None = None) -> Allocation:
        with current(self.context) as driver:
            ptr = int(check(driver.cuMemHostAlloc(nbytes, driver.CU_MEMHOSTALLOC_PORTABLE)))
        view = np.ctypeslib.as_array((ctypes.c_ubyte * nbytes).from_address(ptr))
        return Allocation(ptr, nbytes, host_view=view)

    def deallocate(self, allocation: Allocation, stream: int | None = None) -> None:
        allocation.host_view = None
        with current(self.context) as driver:
            check(driver.cuMemFreeHost(allocation.ptr))

    def record_event(self, stream: int) -> cuda_driver.DriverEvent:
        return self.events.record(stream)

    def trim(self, keep_bytes: int) -> None:
        pass

    def close(self) -> None:
        self.events.close()
        if self._retained and self.device is not None:
            cuda_driver.release_primary_context(self.device)
            self._retained = False
