"""Host memory from numpy, page-aligned. The arena's numpy array owns the memory, so a view a
caller still holds keeps it alive even after the pool lets the arena go."""

from __future__ import annotations

import mmap

import numpy as np

from tidepool.pool.resources.base import Allocation

PAGE = mmap.PAGESIZE


class HostResource:
    kind: str = "host"
    release_stream: int = 0
    device: int | None = None

    def allocate(self, nbytes: int, stream: int | None = None) -> Allocation:
        raw = np.empty(nbytes + PAGE, dtype=np.uint8)
        shift = (-raw.ctypes.data) % PAGE
        view = raw[shift : shift + nbytes]
        return Allocation(view.ctypes.data, nbytes, host_view=view, owner=raw)

    def deallocate(self, allocation: Allocation, stream: int | None = None) -> None:
        allocation.host_view = None
        allocation.owner = None

    def record_event(self, stream: int) -> None:
        return None  # no streams use this memory

    def trim(self, keep_bytes: int) -> None:
        pass

    def close(self) -> None:
        pass
