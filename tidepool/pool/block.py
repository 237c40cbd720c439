"""A block handed out by the pool: its address and size, freeing, and typed views of its memory
(numpy for host memory, torch for any, CUDA array interface and DLPack for device memory)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np
import numpy.typing as npt

from tidepool.pool.arena import Arena, Location
from tidepool.pool.errors import PoolError

if TYPE_CHECKING:
    import torch

_KDL_CUDA = 2


class BlockOwner(Protocol):
    """What a block needs from the pool that handed it out."""

    kind: str
    device: int | None

    @property
    def closed(self) -> bool: ...

    def release(self, block: Block) -> None:
        """Take the block back (it raises PoolError if the block was already freed)."""
        ...


class BlockScope(Protocol):
    """An execution scope that a block belongs to; told when the block goes back early."""

    def released(self, block: Block) -> None: ...


def torch_dtype(dtype: Any) -> torch.dtype:
    """The torch dtype of a numpy dtype (or of anything numpy takes as one)."""
    import torch

    return torch.from_numpy(np.empty(0, dtype=np.dtype(dtype))).dtype


class Block:
    """`ptr`, `nbytes` (asked for) and `capacity` (given) are for callers. `location`, `scope` and
    `freed` are the owner's bookkeeping: only the pool that handed the block out writes them."""

    __slots__ = ("ptr", "nbytes", "capacity", "stream", "owner", "location", "scope", "freed")

    def __init__(
        self, owner: BlockOwner, location: Location, nbytes: int, capacity: int, stream: Any
    ) -> None:
        self.ptr: int = location.ptr
        self.nbytes = nbytes
        self.capacity = capacity  # >= nbytes, aligned to at least 256 bytes
        self.stream = stream
        self.owner = owner
        self.location = location
        self.scope: BlockScope | None = None
        self.freed = False

    def free(self) -> None:
        self.owner.release(self)

    def __enter__(self) -> Block:
        return self

    def __exit__(self, *exc_info: object) -> None:
        if not self.freed:
            self.free()

    def __repr__(self) -> str:
        state = "freed" if self.freed else "live"
        return (
            f"<Block {self.owner.kind} {self.ptr:#x} nbytes={self.nbytes} capacity={self.capacity} {state}>"
        )

    def _check_live(self, what: str) -> Arena:
        if self.freed:
            raise PoolError(f"{what}: block at {self.ptr:#x} ({self.nbytes} bytes) was already freed")
        if self.owner.closed:
            raise PoolError(f"{what}: the pool of block {self.ptr:#x} is closed")
        return self.location.arena

    def _shape_for(self, itemsize: int, shape: Sequence[int] | None, what: str) -> tuple[int, ...]:
        checked = (self.nbytes // itemsize,) if shape is None else tuple(map(int, shape))
        need = math.prod(checked) * itemsize
        if need > self.capacity:
            raise PoolError(
                f"{what}: shape {list(checked)} needs {need} bytes, the block holds {self.capacity}"
            )
        return checked

    @property
    def is_device(self) -> bool:
        return self.owner.kind == "cuda"

    def as_numpy(self, dtype: Any = np.uint8, shape: Sequence[int] | None = None) -> npt.NDArray[Any]:
        """A numpy view of the block's memory (host and pinned blocks only; no copy)."""
        arena = self._check_live("as_numpy")
        if arena.host_view is None:
            raise PoolError(f"as_numpy: {self.owner.kind} memory is not readable from the host; use as_torch")
        dtype = np.dtype(dtype)
        checked = self._shape_for(dtype.itemsize, shape, "as_numpy")
        return np.ndarray(checked, dtype, buffer=arena.host_view, offset=self.location.offset)

    def as_torch(self, dtype: Any = None, shape: Sequence[int] | None = None) -> torch.Tensor:
        """A torch tensor over the block's memory (no copy), on the CPU or the block's device."""
        import torch

        dtype = torch.uint8 if dtype is None else dtype
        if not isinstance(dtype, torch.dtype):
            dtype = torch_dtype(dtype)
        if self.is_device:
            self._check_live("as_torch")
            raw = torch.as_tensor(
                _DeviceView(self.ptr, (self.capacity,), "|u1"), device=f"cuda:{self.owner.device}"
            )
        else:
            raw = torch.from_numpy(self.as_numpy(np.uint8, (self.capacity,)))
        checked = self._shape_for(dtype.itemsize, shape, "as_torch")
        return raw.view(dtype)[: math.prod(checked)].view(checked)

    @property
    def __cuda_array_interface__(self) -> dict[str, Any]:
        if not self.is_device:
            raise AttributeError("__cuda_array_interface__: only device blocks have one")
        self._check_live("__cuda_array_interface__")
        return _DeviceView(self.ptr, (self.nbytes,), "|u1").__cuda_array_interface__

    def __dlpack__(self, stream: Any = None) -> Any:
        if not self.is_device:
            raise PoolError("__dlpack__: only device blocks export DLPack; use as_numpy for host")
        return self.as_torch().__dlpack__(stream=stream)

    def __dlpack_device__(self) -> tuple[int, int]:
        return (_KDL_CUDA, self.owner.device or 0)


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
