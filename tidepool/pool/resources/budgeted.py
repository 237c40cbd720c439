"""An adaptor that counts an upstream resource's allocations against the node ledger: it reserves
before it asks upstream and gives the bytes back once upstream really has them again (a CUDA
pool's cached memory is trimmed first, so the budget never counts memory the driver still holds)."""

from __future__ import annotations

from tidepool.pool.ledger import LedgerEntry
from tidepool.pool.resources.base import Allocation, MemoryResource, StreamEvent


class BudgetedResource:
    def __init__(self, upstream: MemoryResource, entry: LedgerEntry) -> None:
        self.upstream = upstream
        self.entry = entry
        self.kind = upstream.kind
        self.device = upstream.device
        self.release_stream = upstream.release_stream
        self.held = 0  # bytes of live upstream allocations

    def allocate(self, nbytes: int, stream: int | None = None) -> Allocation:
        self.entry.reserve(nbytes)
        try:
            allocation = self.upstream.allocate(nbytes, stream)
        except BaseException:
            self.entry.release(nbytes)
            raise
        self.held += nbytes
        return allocation

    def deallocate(self, allocation: Allocation, stream: int | None = None) -> None:
        self.upstream.deallocate(allocation, stream)
        self.held -= allocation.nbytes
        if self.kind == "cuda":
            self.upstream.trim(self.held)  # waits for the free, then hands the bytes to the driver
        self.entry.release(allocation.nbytes)

    def record_event(self, stream: int) -> StreamEvent | None:
        return self.upstream.record_event(stream)

    def trim(self, keep_bytes: int) -> None:
        self.upstream.trim(keep_bytes)

    def close(self) -> None:
        self.upstream.close()
        self.entry.leave()
