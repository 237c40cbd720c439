"""Page-locked host memory (cuMemHostAlloc): the staging area for fast host-to-device copies, and
events on the streams whose copies read or write it (the pool reuses a block only once its copy ran)."""

from __future__ import annotations

import ctypes

import numpy as np

from tidepool.pool.resources import driver as cuda_driver
from tidepool.pool.resources.base import Allocation
from tidepool.pool.resources.driver import check


class PinnedResource:
    kind: str = "pinned"

    def __init__(self, device: int = 0) -> None:
        cuda_driver.require_cuda(device)
        self._driver = cuda_driver.bindings()
        self.device: int | None = device
        self.context = cuda_driver.primary_context(device)
        self.events = cuda_driver.Events(self.context)

    def allocate(self, nbytes: int, stream: int | None = None) -> Allocation:
        cuda_driver.make_current(self.context)
        flags = self._driver.CU_MEMHOSTALLOC_PORTABLE
        ptr = int(check(self._driver.cuMemHostAlloc(nbytes, flags)))
        view = np.ctypeslib.as_array((ctypes.c_ubyte * nbytes).from_address(ptr))
        return Allocation(ptr, nbytes, host_view=view)

    def deallocate(self, allocation: Allocation, stream: int | None = None) -> None:
        cuda_driver.make_current(self.context)
        allocation.host_view = None
        check(self._driver.cuMemFreeHost(allocation.ptr))

    def record_event(self, stream: int) -> cuda_driver.DriverEvent:
        return self.events.record(stream)

    def trim(self, keep_bytes: int) -> None:
        pass

    def close(self) -> None:
        self.events.close()
