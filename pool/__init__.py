"""Tidepool's memory pool: upstream resources, block strategies and the pool itself.
Knows nothing of Triton; a model instance creates one and reuses it across executions."""

from pool.block import Block
from pool.errors import CudaUnavailable, OutOfMemory, PoolError
from pool.memory_pool import ExecutionScope, MemoryPool, size_class
from pool.resources.driver import cuda_status
from pool.stats import PoolStats

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
]
