"""Tidepool's memory pool: upstream resources, block strategies and the pool itself.
Knows nothing of Triton; a model instance creates one and reuses it across executions."""

from tidepool.pool.arena import size_class
from tidepool.pool.block import Block, torch_dtype
from tidepool.pool.errors import CudaUnavailable, OutOfMemory, PoolError
from tidepool.pool.memory_pool import ExecutionScope, MemoryPool
from tidepool.pool.resources.driver import cuda_status
from tidepool.pool.stats import PoolStats

__all__ = [
    "Block",
    "CudaUnavailable",
    "ExecutionScope",
    "MemoryPool",
    "OutOfMemory",
    "PoolError",
    "PoolStats",
    "cuda_status",
    "size_class",
    "torch_dtype",
]
