"""A block handed out by the pool: its address and size, freeing, and typed views of its memory
(numpy for host memory, torch for any, CUDA array interface and DLPack for device memory)."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import numpy as np

from pool.errors import PoolError

if TYPE_CHECKING:
    from pool.memory_pool import Arena, ExecutionScope, MemoryPool

_KDL_CUDA = 2


class Block:
    __slots__ = ("ptr", "nbytes", "capacity", "stream", "_pool", "_loc", "_scope", "_freed")

    def __init__(self, pool: MemoryPool, loc: tuple, nbytes: int, capacity: int, stream: Any) -> None:
        self.ptr: int = loc[0].base + loc[1]
        self.nbytes = nbytes  # asked for
        self.capacity = capacity  # given (>= nbytes, aligned to at least 256 bytes)
        self.stream = stream
        self._pool = pool
        self._loc = loc  # (arena, offset, slab or None)
        self._scope: ExecutionScope | None = None
        self._freed = False

    def free(self) -> None:
        self._pool._release(self)

    @property
    def freed(self) -> bool:
        return self._freed

    def __enter__(self) -> Block:
        return self

    def __exit__(self, *exc_info) -> None:
        if not self._freed:
            self.free()

    def __repr__(self) -> str:
        state = "freed" if self._freed else "live"
        return (
            f"<Block {self._pool.kind} {self.ptr:#x} nbytes={self.nbytes} capacity={self.capacity} {state}>"
        )

    def _check_live(self, what: str) -> Arena:
        if self._freed:
            raise PoolError(f"{what}: block at {self.ptr:#x} ({self.nbytes} bytes) was already freed")
        if self._pool.closed:
            raise PoolError(f"{what}: the pool of block {self.ptr:#x} is closed")
        return self._loc[0]

    def _shape_for(self, itemsize: int, shape, what: str) -> tuple[int, ...]:
        shape = (self.nbytes // itemsize,) if shape is None else tuple(map(int, shape))
        need = math.prod(shape) * itemsize
        if need > self.capacity:
            raise PoolError(
                f"{what}: shape {list(shape)} needs {need} bytes, the block holds {self.capacity}"
            )
        return shape

    @property
    def is_device(self) -> bool:
        return self._pool.kind == "cuda"

    def as_numpy(self, dtype: Any = np.uint8, shape=None) -> np.ndarray:
        """A numpy view of the block's memory (host and pinned blocks only; no copy)."""
        arena = self._check_live("as_numpy")
        if arena.host_view is None:
            raise PoolError(f"as_numpy: {self._pool.kind} memory is not readable from the host; use as_torch")
        dtype = np.dtype(dtype)
        shape = self._shape_for(dtype.itemsize, shape, "as_numpy")
        return np.ndarray(shape, dtype, buffer=arena.host_view, offset=self._loc[1])

    def as_torch(self, dtype: Any = None, shape=None):
        """A torch tensor over the block's memory (no copy), on the CPU or the block's device."""
        import torch

        dtype = torch.uint8 if dtype is None else dtype
        if not isinstance(dtype, torch.dtype):
            dtype = torch.from_numpy(np.empty(0, dtype=np.dtype(dtype))).dtype
        if self.is_device:
            self._check_live("as_torch")
            raw = torch.as_tensor(
                _DeviceView(self.ptr, (self.capacity,), "|u1"), device=f"cuda:{self._pool.device}"
            )
        else:
            raw = torch.from_numpy(self.as_numpy(np.uint8, (self.capacity,)))
        shape = self._shape_for(dtype.itemsize, shape, "as_torch")
        return raw.view(dtype)[: math.prod(shape)].view(shape)

    @property
    def __cuda_array_interface__(self) -> dict:
        if not self.is_device:
            raise AttributeError("__cuda_array_interface__: only device blocks have one")
        self._check_live("__cuda_array_interface__")
        return _DeviceView(self.ptr, (self.nbytes,), "|u1").__cuda_array_interface__

    def __dlpack__(self, stream: Any = None):
        if not self.is_device:
            raise PoolError("__dlpack__: only device blocks export DLPack; use as_numpy for host")
        return self.as_torch().__dlpack__(stream=stream)

    def __dlpack_device__(self) -> tuple[int, int]:
        return (_KDL_CUDA, self._pool.device or 0)


class _DeviceView:
    """A typed window on device memory, readable through the CUDA array interface."""

    def __init__(self, ptr: int, shape: tuple[int, ...], typestr: str) -> None:
        self.__cuda_array_interface__ = {
            "shape": shape,
            "typestr": typestr,
            "data": (ptr, False),
            "version": 3,
            "strides": None,
            "stream": None,  # the caller orders work on the block's stream itself
        }
