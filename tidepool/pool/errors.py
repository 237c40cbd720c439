"""The pool's errors: misuse of a block (PoolError) and running out of memory (OutOfMemory)."""

from __future__ import annotations

from tidepool.errors import TidepoolError
from tidepool.spec import mib


class PoolError(TidepoolError, RuntimeError):
    """A block or pool was used wrongly: freed twice, used after free, pool closed, bad size."""


class CudaUnavailable(PoolError):
    """CUDA memory was asked for where there is no usable driver or device; says which."""


class OutOfMemory(PoolError, MemoryError):
    """The pool could not serve a request within its limit, after recycling and trimming."""

    def __init__(
        self,
        requested: int,
        allocated: int,
        reserved: int,
        limit: int | None,
        largest_free_block: int,
        cause: str = "the pool's limit would be exceeded",
        node_budget: bool = False,
        device: bool = False,
    ) -> None:
        self.requested = requested
        self.allocated = allocated
        self.reserved = reserved
        self.limit = limit
        self.largest_free_block = largest_free_block
        self.cause = cause
        self.node_budget = node_budget  # refused by the node's shared budget, not the pool's limit
        self.device = device  # refused by the device (or the system), not by a limit
        super().__init__(
            f"out of memory: {cause}: requested {requested} bytes ({mib(requested, 2)}), "
            f"allocated {mib(allocated, 2)}, reserved {mib(reserved, 2)}, limit {mib(limit, 2)}, "
            f"largest free block {mib(largest_free_block, 2)} (after recycling cached blocks and "
            "trimming empty arenas)"
        )
