"""What every upstream resource provides: large allocations (arenas) on demand and back."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
import numpy.typing as npt


@dataclass(eq=False)
class Allocation:
    """One upstream allocation. `host_view` is a uint8 array over the memory where the CPU can
    read it (None for device or fake memory); `owner` keeps whatever owns the memory alive."""

    ptr: int
    nbytes: int
    host_view: npt.NDArray[np.uint8] | None = None
    owner: Any = None


class MemoryResource(Protocol):
    kind: str  # "host", "pinned", "cuda" or "fake"
    device: int | None

    def allocate(self, nbytes: int, stream: int | None = None) -> Allocation: ...

    def deallocate(self, allocation: Allocation, stream: int | None = None) -> None: ...

    def synchronize(self, stream: int | None) -> None:
        """Wait until work queued on `stream` is done (no-op for host memory)."""
        ...

    def trim(self, keep_bytes: int) -> None:
        """Give memory the resource itself caches back to the system."""
        ...

    def close(self) -> None: ...
