"""A block handed out by the pool: its address and size, freeing, and typed views of its memory
(numpy for host memory, torch for any, CUDA array interface and DLPack for device memory). Every
view holds the block's export: while one lives, the block is not reused and its arena not given
back upstream, whatever `free()` or the pool's `close()` said; they take effect when it goes."""

from __future__ import annotations

import math
import weakref
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

    def export_started(self, block: Block) -> None:
        """A view of the block now exists (its first since the last one went)."""
        ...

    def export_ended(self, block: Block) -> None:
        """The views sharing one export are gone; may run in any thread, inside garbage collection."""
        ...


class BlockScope(Protocol):
    """An execution scope that a block belongs to; told when the block goes back early."""

    def released(self, block: Block) -> None: ...


def torch_dtype(dtype: Any) -> torch.dtype:
    """The torch dtype of a numpy dtype (or of anything numpy takes as one)."""
    import torch

    return torch.from_numpy(np.empty(0, dtype=np.dtype(dtype))).dtype


class _Export:
    """What every view of a block holds. Its life is counted by the block's pool: while one lives
    the block's memory stays the block's, and its arena stays reserved upstream."""

    __slots__ = ("block", "__weakref__")

    def __init__(self, block: Block) -> None:
        self.block = block
        block.owner.export_started(block)

    def __del__(self) -> None:
        try:
            self.block.owner.export_ended(self.block)
        except Exception:  # noqa: BLE001 - interpreter shutdown: nothing is left to give back to
            pass


class _HostWindow:
    """A typed window on host memory that numpy reads through the array interface; the array made
    from it keeps it (and so the export) alive."""

    __slots__ = ("__array_interface__", "export")

    def __init__(self, ptr: int, shape: tuple[int, ...], typestr: str, export: _Export) -> None:
        self.__array_interface__ = {"shape": shape, "typestr": typestr, "data": (ptr, False), "version": 3}
        self.export = export


class Block:
    """`ptr`, `nbytes` (asked for) and `capacity` (given) are for callers. `location`, `scope`,
    `freed`, `exports` and `release_pending` are the owner's bookkeeping: only the pool that handed
    the block out writes them (under its lock)."""

    __slots__ = (
        "ptr", "nbytes", "capacity", "stream", "owner", "location", "scope", "freed",
        "exports", "release_pending", "_export",
    )  # fmt: skip

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
        self.exports = 0  # live exports (views hold them)
        self.release_pending = False  # freed while exported: goes back when the last export does
        self._export: weakref.ref[_Export] | None = None

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

    def export(self) -> _Export:
        """The block's live export, or a new one: what a view holds to keep the memory its own."""
        current = self._export() if self._export is not None else None
        if current is None:
            current = _Export(self)
            self._export = weakref.ref(current)
        return current

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
        return np.asarray(_HostWindow(self.ptr, checked, dtype.str, self.export()))

    def as_torch(self, dtype: Any = None, shape: Sequence[int] | None = None) -> torch.Tensor:
        """A torch tensor over the block's memory (no copy), on the CPU or the block's device."""
        import torch

        dtype = torch.uint8 if dtype is None else dtype
        if not isinstance(dtype, torch.dtype):
            dtype = torch_dtype(dtype)
        if self.is_device:
            # torch keeps the view (and so the export) until the tensor's storage goes.
            raw = torch.as_tensor(self.as_cuda_array(), device=f"cuda:{self.owner.device}")
        else:
            raw = torch.from_numpy(self.as_numpy(np.uint8, (self.capacity,)))
        checked = self._shape_for(dtype.itemsize, shape, "as_torch")
        return raw.view(dtype)[: math.prod(checked)].view(checked)

    def as_cuda_array(self) -> _DeviceView:
        """The block's bytes (its whole capacity) through the CUDA array interface, for CuPy, Numba
        or torch.as_tensor; whoever keeps the view keeps the memory the block's."""
        if not self.is_device:
            raise PoolError("as_cuda_array: only device blocks have one; use as_numpy for host")
        self._check_live("as_cuda_array")
        return _DeviceView(self.ptr, (self.capacity,), "|u1", self.export())

    def __dlpack__(self, stream: Any = None) -> Any:
        if not self.is_device:
            raise PoolError("__dlpack__: only device blocks export DLPack; use as_numpy for host")
        return self.as_torch().__dlpack__(stream=stream)

    def __dlpack_device__(self) -> tuple[int, int]:
        return (_KDL_CUDA, self.owner.device or 0)


class _DeviceView:
    """A typed window on device memory, readable through the CUDA array interface; holds the
    block's export."""

    def __init__(self, ptr: int, shape: tuple[int, ...], typestr: str, export: _Export) -> None:
        self.export = export
        self.__cuda_array_interface__ = {
            "shape": shape,
            "typestr": typestr,
            "data": (ptr, False),
            "version": 3,
            "strides": None,
            "stream": None,  # the caller orders work on the block's stream itself
        }
