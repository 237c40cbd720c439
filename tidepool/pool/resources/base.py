"""What every upstream resource provides: large allocations (arenas) on demand and back, and, for
memory that streams use, events that say when the work queued on a stream so far has run."""

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


class StreamEvent(Protocol):
    """The work queued on one stream before the event was recorded (driver.DriverEvent)."""

    def done(self) -> bool:
        """Whether that work has run (asks without waiting)."""
        ...

    def wait(self) -> None:
        """Block the host until that work has run."""
        ...

    def order(self, stream: int) -> None:
        """Make work queued on `stream` from now on wait for it (on the device, not the host)."""
        ...

    def close(self) -> None:
        """The caller is done with the event."""
        ...


class MemoryResource(Protocol):
    kind: str  # "host", "pinned", "cuda" or "fake"
    device: int | None
    # The stream its frees are queued on, which the pool orders after the streams that used the
    # memory (0 where memory has no streams).
    release_stream: int

    def allocate(self, nbytes: int, stream: int | None = None) -> Allocation: ...

    def deallocate(self, allocation: Allocation, stream: int | None = None) -> None: ...

    def record_event(self, stream: int) -> StreamEvent | None:
        """An event behind the work queued on `stream` so far; None where memory has no streams."""
        ...

    def trim(self, keep_bytes: int) -> None:
        """Give memory the resource itself caches back to the system."""
        ...

    def close(self) -> None: ...
