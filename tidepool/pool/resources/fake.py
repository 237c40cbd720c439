"""A resource with fake addresses and no memory behind them: tests pool logic fast, anywhere."""

from __future__ import annotations

from tidepool.pool.resources.base import Allocation

_SPACING = 1 << 40  # far apart, so blocks of different arenas can never look adjacent


class FakeResource:
    kind: str = "fake"
    release_stream: int = 0
    device: int | None = None

    def __init__(self, capacity_bytes: int | None = None) -> None:
        self.capacity_bytes = capacity_bytes  # an upstream that runs out (like a full device)
        self.live: dict[int, int] = {}
        self.allocations = 0
        self.deallocations = 0
        self._next = _SPACING

    def allocate(self, nbytes: int, stream: int | None = None) -> Allocation:
        if self.capacity_bytes is not None and sum(self.live.values()) + nbytes > self.capacity_bytes:
            raise MemoryError(f"fake upstream exhausted ({nbytes} bytes asked)")
        ptr = self._next
        self._next += max(_SPACING, nbytes)
        self.live[ptr] = nbytes
        self.allocations += 1
        return Allocation(ptr, nbytes)

    def deallocate(self, allocation: Allocation, stream: int | None = None) -> None:
        del self.live[allocation.ptr]
        self.deallocations += 1

    def record_event(self, stream: int) -> None:
        return None  # no streams use this memory

    def trim(self, keep_bytes: int) -> None:
        pass

    def close(self) -> None:
        self.live.clear()
