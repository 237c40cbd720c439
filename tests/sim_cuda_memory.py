"""The simulated device's memory: its cuMemPools (stream-ordered allocation, memory kept until
trimmed), device memory backed by host buffers at fake addresses, pinned host memory, and the
asynchronous copies between them. A mixin of SimDevice (tests/sim_cuda.py), whose queues it uses."""

from __future__ import annotations

import ctypes
import threading
from collections import deque
from collections.abc import Callable
from typing import Any

import numpy as np

from tests.sim_cuda_types import (
    OK,
    POISON,
    UNWRITTEN,
    CUmemPool_attribute,
    CUresult,
    SimFault,
    Work,
    _DeviceAllocation,
    _Pool,
    cuuint64_t,
    driver_call,
)


class SimMemory:
    # SimDevice's, read and written here.
    _lock: threading.RLock
    _handles: Any
    version: int
    device_bytes: int
    streams: dict[int, deque[Work]]
    pools: dict[int, _Pool]
    device_memory: dict[int, _DeviceAllocation]
    host_allocations: dict[int, Any]
    freed_host: list[Any]
    trims: list[tuple[int, int]]
    torch_cached: int
    _call: Callable[[str], CUresult | None]
    _queue: Callable[..., Work]
    _run: Callable[..., None]
    _idle: Callable[[int], bool]

    # -- device memory -----------------------------------------------------------------------

    def _allocation_at(self, ptr: int, nbytes: int = 1) -> tuple[int, _DeviceAllocation]:
        for base, allocation in self.device_memory.items():
            if base <= ptr and ptr + nbytes <= base + len(allocation.buffer):
                return base, allocation
        raise SimFault(f"device memory {ptr:#x} (+{nbytes}) was never allocated")

    def _device_span(self, ptr: int, nbytes: int, by_work: bool = False) -> np.ndarray:
        """The host buffer behind device bytes [ptr, ptr + nbytes); SimFault outside a live
        allocation, and (`by_work`: queued work runs) before its stream-ordered allocation ran."""
        base, allocation = self._allocation_at(ptr, nbytes)
        if not allocation.live:
            raise SimFault(f"device memory {ptr:#x} is used after its free ran")
        if by_work and not allocation.ready:
            raise SimFault(f"device memory {ptr:#x} is used before its stream-ordered allocation ran")
        return allocation.buffer[ptr - base : ptr - base + nbytes]

    def device_array(self, ptr: int, nbytes: int) -> np.ndarray:
        """A host view of device memory, for tests and the simulated link (no queue runs)."""
        with self._lock:
            return self._device_span(int(ptr), nbytes)

    def device_scratch(self, nbytes: int) -> int:
        """Device memory outside any pool (what torch's own allocator would hand out)."""
        with self._lock:
            ptr = next(self._handles)
            self.device_memory[ptr] = _DeviceAllocation(None, np.full(max(nbytes, 1), UNWRITTEN, np.uint8))
            return ptr

    @driver_call(values=1)
    def cuMemPoolCreate(self, props):  # noqa: N802
        handle = next(self._handles)
        # Drivers before 12.2 ignore maxSize: the pool grows until the device is full.
        self.pools[handle] = _Pool(props.maxSize if self.version >= 12020 and props.maxSize else 0)
        return OK, handle

    @driver_call()
    def cuMemPoolSetAttribute(self, pool, attribute, value):  # noqa: N802
        state = self.pools[int(pool)]
        name = CUmemPool_attribute(attribute).name.removeprefix("CU_MEMPOOL_ATTR_")
        if name == "RELEASE_THRESHOLD":
            state.threshold = int(value)
        elif name in ("RESERVED_MEM_HIGH", "USED_MEM_HIGH"):  # only a reset to 0 is allowed
            setattr(state, name.lower().replace("_mem", ""), int(value))
        else:
            raise SimFault(f"{name} cannot be set")
        return (OK,)

    @driver_call(values=1)
    def cuMemPoolGetAttribute(self, pool, attribute):  # noqa: N802
        state = self.pools[int(pool)]
        name = CUmemPool_attribute(attribute).name.removeprefix("CU_MEMPOOL_ATTR_")
        value = {
            "RELEASE_THRESHOLD": state.threshold,
            "RESERVED_MEM_CURRENT": state.reserved,
            "RESERVED_MEM_HIGH": state.reserved_high,
            "USED_MEM_CURRENT": state.used,
            "USED_MEM_HIGH": state.used_high,
        }[name]
        return OK, cuuint64_t(value)

    @driver_call(values=1)
    def cuMemAllocFromPoolAsync(self, nbytes, pool, stream):  # noqa: N802
        state = self.pools[int(pool)]
        grow = max(0, nbytes - state.cached)
        device_reserved = sum(p.reserved for p in self.pools.values()) + self.torch_cached
        if device_reserved + grow > self.device_bytes or (
            state.max_size and state.reserved + grow > state.max_size
        ):
            return CUresult.CUDA_ERROR_OUT_OF_MEMORY, None
        state.cached -= nbytes - grow
        state.reserved += grow
        state.used += nbytes
        state.reserved_high = max(state.reserved_high, state.reserved)
        state.used_high = max(state.used_high, state.used)
        ptr = next(self._handles)
        allocation = _DeviceAllocation(int(pool), np.full(nbytes, UNWRITTEN, np.uint8))
        self.device_memory[ptr] = allocation
        if not self._idle(int(stream or 0)):  # usable in the stream's order, after its queued work

            def ready() -> None:
                allocation.ready = True

            allocation.ready = False
            self._queue(stream, "allocate", ready)
        return OK, ptr

    @driver_call()
    def cuMemFreeAsync(self, ptr, stream):  # noqa: N802
        allocation = self.device_memory.get(int(ptr))
        if allocation is None or allocation.pool is None:
            raise SimFault(f"cuMemFreeAsync of {int(ptr):#x}, which no pool handed out")

        def free() -> None:
            if not allocation.live:
                raise SimFault(f"device memory {int(ptr):#x} freed twice")
            users = [w for q in self.streams.values() for w in q if not w.done and self._uses(w, int(ptr))]
            if users:
                raise SimFault(f"device memory {int(ptr):#x} freed while {users[0].what} queued on another "
                               "stream still uses it")  # fmt: skip
            allocation.live = False
            state = self.pools[allocation.pool]
            state.used -= len(allocation.buffer)
            state.cached += len(allocation.buffer)

        self._queue(stream, "free", free)
        return (OK,)

    def _uses(self, work: Work, base: int) -> bool:
        """Whether queued `work` touches the device allocation at `base`."""
        return any(self._allocation_at(ptr)[0] == base for ptr in work.touches)

    @staticmethod
    def _trim(state: _Pool, keep: int) -> None:
        # Only frees that ran count: one still queued keeps its memory outstanding.
        give = min(state.cached, max(0, state.reserved - keep))
        state.cached -= give
        state.reserved -= give

    @driver_call(blocks=True)
    def cuMemPoolTrimTo(self, pool, keep):  # noqa: N802
        self.trims.append((int(pool), int(keep)))
        self._trim(self.pools[int(pool)], int(keep))
        return (OK,)

    @driver_call()
    def cuMemPoolDestroy(self, pool):  # noqa: N802
        del self.pools[int(pool)]
        return (OK,)

    # -- pinned host memory and copies ------------------------------------------------------

    @driver_call(values=1)
    def cuMemHostAlloc(self, nbytes, flags):  # noqa: N802
        buffer = (ctypes.c_ubyte * nbytes)()
        ptr = ctypes.addressof(buffer)
        with self._lock:
            self.host_allocations[ptr] = buffer
        return OK, ptr

    @driver_call()
    def cuMemFreeHost(self, ptr):  # noqa: N802
        busy = [w for q in self.streams.values() for w in q if w.reads_host == int(ptr)]
        if busy:
            raise SimFault(f"pinned memory {int(ptr):#x} freed while a queued copy uses it")
        buffer = self.host_allocations.pop(int(ptr))
        ctypes.memset(int(ptr), POISON, len(buffer))
        self.freed_host.append(buffer)
        return (OK,)

    def _pinned_base(self, ptr: int) -> int | None:
        for base, buffer in self.host_allocations.items():
            if base <= ptr < base + len(buffer):
                return base
        return None

    @staticmethod
    def _host(ptr: int, nbytes: int) -> np.ndarray:
        return np.ctypeslib.as_array((ctypes.c_ubyte * nbytes).from_address(ptr))

    def cuMemcpyHtoDAsync(self, dst, src, nbytes, stream):  # noqa: N802
        """From pinned memory the copy reads its source when it runs; from pageable memory the
        call returns once the source is read (the driver stages it), as CUDA does."""
        if error := self._call("cuMemcpyHtoDAsync"):
            return (error,)
        with self._lock:
            dst, src = int(dst), int(src)
            self._device_span(dst, nbytes)  # a bad destination fails at the call

            def copy(data: np.ndarray | None = None) -> None:
                span = self._device_span(dst, nbytes, by_work=True)
                span[:] = self._host(src, nbytes) if data is None else data

            pinned = self._pinned_base(src)
            if pinned is None:
                staged = self._host(src, nbytes).copy()
                self._queue(stream, "copy", lambda: copy(staged), touches=(dst,))
            else:
                self._queue(stream, "copy", copy, reads_host=pinned, touches=(dst,))
        return (OK,)

    def cuMemcpyDtoHAsync(self, dst, src, nbytes, stream):  # noqa: N802
        """Into pinned memory the copy writes when it runs; into pageable memory the call returns
        once the copy is done."""
        if error := self._call("cuMemcpyDtoHAsync"):
            return (error,)
        with self._lock:
            dst, src = int(dst), int(src)

            def copy() -> None:
                self._host(dst, nbytes)[:] = self._device_span(src, nbytes, by_work=True)

            pinned = self._pinned_base(dst)
            work = self._queue(stream, "copy", copy, reads_host=pinned, touches=(src,))
            if pinned is None:
                self._run(int(stream or 0), work)
        return (OK,)
