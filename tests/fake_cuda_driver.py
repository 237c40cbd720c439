"""A typed fake of cuda-python's driver module for unit tests without a GPU: the calls the pool's
resources make, with what the real driver enforces that matters here: a context must be current
on the calling thread (else CUDA_ERROR_INVALID_CONTEXT), device memory has fake addresses, pinned
memory is real host memory, and a pool's maxSize is honoured only from a 12.2 driver on."""

from __future__ import annotations

import ctypes
import enum
import itertools
import threading
from dataclasses import dataclass, field
from typing import Any


class CUresult(enum.IntEnum):
    CUDA_SUCCESS = 0
    CUDA_ERROR_OUT_OF_MEMORY = 2
    CUDA_ERROR_INVALID_CONTEXT = 201


class CUmemAllocationType(enum.IntEnum):
    CU_MEM_ALLOCATION_TYPE_PINNED = 1


class CUmemLocationType(enum.IntEnum):
    CU_MEM_LOCATION_TYPE_DEVICE = 1


class CUmemPool_attribute(enum.IntEnum):  # noqa: N801 - the driver's own name
    CU_MEMPOOL_ATTR_RELEASE_THRESHOLD = 4
    CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT = 5
    CU_MEMPOOL_ATTR_USED_MEM_CURRENT = 7


CU_MEMHOSTALLOC_PORTABLE = 1


@dataclass
class _Location:
    type: int = 0
    id: int = 0


@dataclass
class CUmemPoolProps:
    allocType: int = 0  # noqa: N815
    location: _Location = field(default_factory=_Location)
    maxSize: int = 0  # noqa: N815


class cuuint64_t(int):  # noqa: N801
    pass


@dataclass
class _Pool:
    max_size: int
    reserved: int = 0
    threshold: int = 0


class FakeDriver:
    """One fake GPU. `version` is what cuDriverGetVersion answers (12040: CUDA 12.4)."""

    CUresult = CUresult
    CUmemAllocationType = CUmemAllocationType
    CUmemLocationType = CUmemLocationType
    CUmemPool_attribute = CUmemPool_attribute
    CUmemPoolProps = CUmemPoolProps
    cuuint64_t = cuuint64_t
    CU_MEMHOSTALLOC_PORTABLE = CU_MEMHOSTALLOC_PORTABLE

    def __init__(self, version: int = 12040, device_bytes: int = 1 << 34) -> None:
        self.version = version
        self.device_bytes = device_bytes
        self._local = threading.local()
        self._addresses = itertools.count(1 << 40, 1 << 32)
        self.pools: dict[int, _Pool] = {}
        self.device_allocations: dict[int, tuple[int, int]] = {}  # ptr -> (pool, bytes)
        self.host_allocations: dict[int, Any] = {}  # ptr -> the ctypes buffer that owns it
        self.calls_without_context: list[str] = []
        self.freed_host: list[Any] = []  # kept, poisoned, so that a use after free reads 0xDD
        self.trims: list[tuple[int, int]] = []  # (pool, bytes kept) of each cuMemPoolTrimTo

    # -- devices and contexts --------------------------------------------------------------

    def cuInit(self, flags):  # noqa: N802
        return (CUresult.CUDA_SUCCESS,)

    def cuDriverGetVersion(self):  # noqa: N802
        return CUresult.CUDA_SUCCESS, self.version

    def cuDeviceGetCount(self):  # noqa: N802
        return CUresult.CUDA_SUCCESS, 1

    def cuDeviceGet(self, ordinal):  # noqa: N802
        return CUresult.CUDA_SUCCESS, ordinal

    def cuDeviceGetName(self, length, device):  # noqa: N802
        return CUresult.CUDA_SUCCESS, b"Fake GPU\0\0"

    def cuDeviceTotalMem(self, device):  # noqa: N802
        return CUresult.CUDA_SUCCESS, self.device_bytes

    def cuGetErrorName(self, error):  # noqa: N802
        return CUresult.CUDA_SUCCESS, CUresult(error).name.encode()

    def cuDevicePrimaryCtxRetain(self, device):  # noqa: N802
        return CUresult.CUDA_SUCCESS, ("context", device)

    def cuCtxSetCurrent(self, context):  # noqa: N802
        self._local.context = context
        return (CUresult.CUDA_SUCCESS,)

    def _needs_context(self, call: str) -> CUresult | None:
        if getattr(self._local, "context", None) is None:
            self.calls_without_context.append(call)
            return CUresult.CUDA_ERROR_INVALID_CONTEXT
        return None

    def cuCtxSynchronize(self):  # noqa: N802
        return (self._needs_context("cuCtxSynchronize") or CUresult.CUDA_SUCCESS,)

    def cuStreamSynchronize(self, stream):  # noqa: N802
        return (self._needs_context("cuStreamSynchronize") or CUresult.CUDA_SUCCESS,)

    # -- memory pools ----------------------------------------------------------------------

    def cuMemPoolCreate(self, props):  # noqa: N802
        if error := self._needs_context("cuMemPoolCreate"):
            return error, None
        handle = next(self._addresses)
        # Drivers before 12.2 ignore maxSize: the pool grows until the device is full.
        self.pools[handle] = _Pool(props.maxSize if self.version >= 12020 and props.maxSize else 0)
        return CUresult.CUDA_SUCCESS, handle

    def cuMemPoolSetAttribute(self, pool, attribute, value):  # noqa: N802
        if error := self._needs_context("cuMemPoolSetAttribute"):
            return (error,)
        self.pools[pool].threshold = int(value)
        return (CUresult.CUDA_SUCCESS,)

    def cuMemPoolGetAttribute(self, pool, attribute):  # noqa: N802
        if error := self._needs_context("cuMemPoolGetAttribute"):
            return error, None
        return CUresult.CUDA_SUCCESS, self.pools[pool].reserved

    def cuMemAllocFromPoolAsync(self, nbytes, pool, stream):  # noqa: N802
        if error := self._needs_context("cuMemAllocFromPoolAsync"):
            return error, None
        state = self.pools[pool]
        full = sum(n for _, n in self.device_allocations.values()) + nbytes > self.device_bytes
        if full or (state.max_size and state.reserved + nbytes > state.max_size):
            return CUresult.CUDA_ERROR_OUT_OF_MEMORY, None
        ptr = next(self._addresses)
        self.device_allocations[ptr] = (pool, nbytes)
        state.reserved += nbytes
        return CUresult.CUDA_SUCCESS, ptr

    def cuMemFreeAsync(self, ptr, stream):  # noqa: N802
        if error := self._needs_context("cuMemFreeAsync"):
            return (error,)
        pool, nbytes = self.device_allocations.pop(ptr)
        self.pools[pool].reserved -= nbytes
        return (CUresult.CUDA_SUCCESS,)

    def cuMemPoolTrimTo(self, pool, keep):  # noqa: N802
        if error := self._needs_context("cuMemPoolTrimTo"):
            return (error,)
        self.trims.append((pool, keep))
        return (CUresult.CUDA_SUCCESS,)

    def cuMemPoolDestroy(self, pool):  # noqa: N802
        if error := self._needs_context("cuMemPoolDestroy"):
            return (error,)
        del self.pools[pool]
        return (CUresult.CUDA_SUCCESS,)

    # -- pinned host memory ----------------------------------------------------------------

    def cuMemHostAlloc(self, nbytes, flags):  # noqa: N802
        if error := self._needs_context("cuMemHostAlloc"):
            return error, None
        buffer = (ctypes.c_ubyte * nbytes)()
        ptr = ctypes.addressof(buffer)
        self.host_allocations[ptr] = buffer
        return CUresult.CUDA_SUCCESS, ptr

    def cuMemFreeHost(self, ptr):  # noqa: N802
        if error := self._needs_context("cuMemFreeHost"):
            return (error,)
        buffer = self.host_allocations.pop(ptr)
        ctypes.memset(ptr, 0xDD, len(buffer))
        self.freed_host.append(buffer)
        return (CUresult.CUDA_SUCCESS,)
