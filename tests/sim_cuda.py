"""A simulated CUDA device for tests without a GPU, strict where a real one is: work queued on a
stream runs only when something waits for it (or, with `progress`, at seeded random later moments),
asynchronous copies read their source when they run, events mark a point in a stream, device
memory is backed by host buffers at fake addresses so that contents can be checked end to end, a
cuMemPool keeps what it reserved until trimmed (or a synchronize passes its release threshold),
and every call needs a current context. It stands in for cuda-python's driver module
(`cuda.bindings.driver`) of either generation (`bindings=12` or `13`) over a driver of any version.
Its enums and structs: sim_cuda_types.py; the instance's device link over it: sim_link.py."""

from __future__ import annotations

import ctypes
import functools
import itertools
import random
import threading
from collections import deque
from collections.abc import Callable
from typing import Any

import numpy as np

from tests.sim_cuda_types import (
    CU_MEMHOSTALLOC_PORTABLE,
    OK,
    POISON,
    UNWRITTEN,
    CUevent_flags,
    CUmemAllocationType,
    CUmemLocationType,
    CUmemPool_attribute,
    CUmemPoolProps,
    CUresult,
    CUstream_flags,
    SimFault,
    Work,
    _DeviceAllocation,
    _Event,
    _Pool,
    cuuint64_t,
)


def _driver_call(values: int = 0, blocks: bool = False) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """A driver call: maybe some queued work runs first; without a current context, the error (and
    `values` Nones after it, as the call's result has them); else the call, under the device's lock,
    counted in `blocking_calls` where it `blocks` the host (or trims a pool)."""

    def wrap(method: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(method)
        def call(self: SimDevice, *args: Any) -> Any:
            if error := self._call(method.__name__):
                return (error, *([None] * values))
            with self._lock:
                if blocks:
                    self.blocking_calls.append((method.__name__, threading.current_thread().name))
                return method(self, *args)

        return call

    return wrap


class SimDevice:
    """One simulated GPU and the driver in front of it. `version` is what cuDriverGetVersion answers
    (12040: CUDA 12.4); `bindings` the generation of cuda-bindings it stands for (its CUDA_VERSION);
    `progress` the chance that, at any driver call, one queued item of some stream runs."""

    CUresult = CUresult
    CUmemAllocationType = CUmemAllocationType
    CUmemLocationType = CUmemLocationType
    CUmemPool_attribute = CUmemPool_attribute
    CUmemPoolProps = CUmemPoolProps
    CUevent_flags = CUevent_flags
    CUstream_flags = CUstream_flags
    cuuint64_t = cuuint64_t
    CU_MEMHOSTALLOC_PORTABLE = CU_MEMHOSTALLOC_PORTABLE

    def __init__(
        self,
        version: int = 12040,
        bindings: int = 12,
        device_bytes: int = 1 << 34,
        progress: float = 0.0,
        seed: int = 0,
    ) -> None:
        self.version = version
        self.CUDA_VERSION = {12: 12090, 13: 13040}[bindings]
        self.device_bytes = device_bytes
        self.progress = progress
        self._random = random.Random(seed)
        self._lock = threading.RLock()
        self._local = threading.local()
        self._handles = itertools.count(1 << 40, 1 << 32)  # fake device addresses and handles
        self._seq = itertools.count()
        self.streams: dict[int, deque[Work]] = {0: deque()}  # 0: the legacy default stream
        self.non_blocking: set[int] = set()
        self.events: dict[int, _Event] = {}
        self.pools: dict[int, _Pool] = {}
        self.device_memory: dict[int, _DeviceAllocation] = {}
        self.host_allocations: dict[int, Any] = {}  # pinned: ptr -> the ctypes buffer that owns it
        self.freed_host: list[Any] = []  # kept, poisoned, so that a use after free reads 0xDD
        self.calls_without_context: list[str] = []
        self.blocking_calls: list[tuple[str, str]] = []  # (call, thread) that blocked or trimmed
        self.trims: list[tuple[int, int]] = []  # (pool, bytes kept) of each cuMemPoolTrimTo

    # -- the queues ------------------------------------------------------------------------

    def _call(self, name: str) -> CUresult | None:
        """Every driver call: maybe some queued work runs; an error where no context is current."""
        with self._lock:
            if self.progress and self._random.random() < self.progress:
                queued = [stream for stream, queue in self.streams.items() if queue]
                if queued:
                    stream = self._random.choice(queued)
                    self._run(stream, self.streams[stream][0])
        if getattr(self._local, "context", None) is None:
            self.calls_without_context.append(name)
            return CUresult.CUDA_ERROR_INVALID_CONTEXT
        return None

    def _queue(self, stream: int, work_kind: str, run: Callable[[], None], **extra: Any) -> Work:
        stream = int(stream or 0)
        if stream not in self.streams:
            raise SimFault(f"stream {stream:#x} does not exist")
        work = Work(work_kind, run, next(self._seq), **extra)
        self.streams[stream].append(work)
        return work

    def _run(self, stream: int, until: Work | None = None) -> None:
        """Run `stream`'s queue in order, through `until` (everything where None). Waits on events
        run the recorded stream first; the legacy stream runs after the blocking streams' earlier
        work, and their later work after its earlier work."""
        queue = self.streams[stream]
        while queue and (until is None or not until.done):
            work = queue[0]
            if work.what == "wait" and work.event is not None and work.event.marker is not None:
                self._run_to(work.event.marker)
            self._run_earlier_legacy_order(stream, work.seq)
            if queue and queue[0] is work:
                queue.popleft()
                work.run()
                work.done = True

    def _legacy_peers(self, stream: int) -> list[int]:
        """The streams whose earlier work `stream`'s work waits for under the legacy default
        stream's rules: every blocking stream for stream 0, stream 0 for a blocking stream."""
        if stream in self.non_blocking:
            return []
        if stream == 0:
            return [s for s in self.streams if s != 0 and s not in self.non_blocking]
        return [0]

    def _run_earlier_legacy_order(self, stream: int, seq: int) -> None:
        for other in self._legacy_peers(stream):
            queue = self.streams[other]
            while queue and queue[0].seq < seq:
                self._run(other, queue[0])

    def _idle(self, stream: int) -> bool:
        return not any(self.streams[s] for s in [stream, *self._legacy_peers(stream)])

    def _run_to(self, marker: Work) -> None:
        for stream, queue in self.streams.items():
            if marker in queue:
                self._run(stream, marker)
                return

    def _release_above_thresholds(self) -> None:
        """What a real cuMemPool does when a synchronize returns: cached memory above its release
        threshold goes back to the system."""
        for state in self.pools.values():
            self._trim(state, state.threshold)

    def queued(self, stream: int = 0) -> int:
        """How many items wait on `stream` (for tests)."""
        return len(self.streams[int(stream)])

    # -- devices, contexts, streams, events --------------------------------------------------

    def cuInit(self, flags):  # noqa: N802
        return (OK,)

    def cuDriverGetVersion(self):  # noqa: N802
        return OK, self.version

    def cuDeviceGetCount(self):  # noqa: N802
        return OK, 1

    def cuDeviceGet(self, ordinal):  # noqa: N802
        return OK, ordinal

    def cuDeviceGetName(self, length, device):  # noqa: N802
        return OK, b"Simulated GPU\0\0"

    def cuDeviceTotalMem(self, device):  # noqa: N802
        return OK, self.device_bytes

    def cuGetErrorName(self, error):  # noqa: N802
        return OK, CUresult(error).name.encode()

    def cuDevicePrimaryCtxRetain(self, device):  # noqa: N802
        return OK, ("context", device)

    def cuCtxSetCurrent(self, context):  # noqa: N802
        self._local.context = context
        return (OK,)

    @_driver_call(blocks=True)
    def cuCtxSynchronize(self):  # noqa: N802
        for stream in list(self.streams):
            self._run(stream)
        self._release_above_thresholds()
        return (OK,)

    @_driver_call(values=1)
    def cuStreamCreate(self, flags):  # noqa: N802
        handle = next(self._handles)
        self.streams[handle] = deque()
        if flags & CUstream_flags.CU_STREAM_NON_BLOCKING:
            self.non_blocking.add(handle)
        return OK, handle

    @_driver_call(blocks=True)
    def cuStreamSynchronize(self, stream):  # noqa: N802
        self._run(int(stream or 0))
        self._release_above_thresholds()
        return (OK,)

    @_driver_call()
    def cuStreamWaitEvent(self, stream, event, flags):  # noqa: N802
        recorded = _Event(self.events[int(event)].marker)  # what is recorded now, not later
        self._queue(stream, "wait", lambda: None, event=recorded)
        return (OK,)

    @_driver_call(values=1)
    def cuEventCreate(self, flags):  # noqa: N802
        handle = next(self._handles)
        self.events[handle] = _Event()
        return OK, handle

    @_driver_call()
    def cuEventRecord(self, event, stream):  # noqa: N802
        state = self.events[int(event)]
        # An idle stream passes a record at once, as a real device does.
        idle = self._idle(int(stream or 0))
        state.marker = None if idle else self._queue(stream, "record", lambda: None)
        return (OK,)

    @_driver_call()
    def cuEventQuery(self, event):  # noqa: N802
        return (OK if self.events[int(event)].complete else CUresult.CUDA_ERROR_NOT_READY,)

    @_driver_call(blocks=True)
    def cuEventSynchronize(self, event):  # noqa: N802
        marker = self.events[int(event)].marker
        if marker is not None and not marker.done:
            self._run_to(marker)
        return (OK,)

    @_driver_call()
    def cuEventDestroy(self, event):  # noqa: N802
        del self.events[int(event)]
        return (OK,)

    def new_stream(self, non_blocking: bool = False) -> int:
        """A stream for a test's own work (this thread's context made current first)."""
        self.cuCtxSetCurrent(("context", 0))
        flags = CUstream_flags.CU_STREAM_NON_BLOCKING if non_blocking else CUstream_flags.CU_STREAM_DEFAULT
        return int(self.cuStreamCreate(flags)[1])

    def launch(self, stream: int, kernel: Callable[[], None]) -> None:
        """Queue a kernel (any host function standing for device work) on `stream`."""
        with self._lock:
            self._queue(stream, "kernel", kernel)

    # -- device memory -----------------------------------------------------------------------

    def _device_span(self, ptr: int, nbytes: int) -> np.ndarray:
        """The host buffer behind device bytes [ptr, ptr + nbytes); SimFault outside a live allocation."""
        for base, allocation in self.device_memory.items():
            if base <= ptr and ptr + nbytes <= base + len(allocation.buffer):
                if not allocation.live:
                    raise SimFault(f"device memory {ptr:#x} is used after its free ran")
                return allocation.buffer[ptr - base : ptr - base + nbytes]
        raise SimFault(f"device memory {ptr:#x} (+{nbytes}) was never allocated")

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

    @_driver_call(values=1)
    def cuMemPoolCreate(self, props):  # noqa: N802
        handle = next(self._handles)
        # Drivers before 12.2 ignore maxSize: the pool grows until the device is full.
        self.pools[handle] = _Pool(props.maxSize if self.version >= 12020 and props.maxSize else 0)
        return OK, handle

    @_driver_call()
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

    @_driver_call(values=1)
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

    @_driver_call(values=1)
    def cuMemAllocFromPoolAsync(self, nbytes, pool, stream):  # noqa: N802
        state = self.pools[int(pool)]
        grow = max(0, nbytes - state.cached)
        device_reserved = sum(p.reserved for p in self.pools.values())
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
        self.device_memory[ptr] = _DeviceAllocation(int(pool), np.full(nbytes, UNWRITTEN, np.uint8))
        return OK, ptr

    @_driver_call()
    def cuMemFreeAsync(self, ptr, stream):  # noqa: N802
        allocation = self.device_memory.get(int(ptr))
        if allocation is None or allocation.pool is None:
            raise SimFault(f"cuMemFreeAsync of {int(ptr):#x}, which no pool handed out")

        def free() -> None:
            if not allocation.live:
                raise SimFault(f"device memory {int(ptr):#x} freed twice")
            allocation.live = False
            state = self.pools[allocation.pool]
            state.used -= len(allocation.buffer)
            state.cached += len(allocation.buffer)

        self._queue(stream, "free", free)
        return (OK,)

    @staticmethod
    def _trim(state: _Pool, keep: int) -> None:
        # Only frees that ran count: one still queued keeps its memory outstanding.
        give = min(state.cached, max(0, state.reserved - keep))
        state.cached -= give
        state.reserved -= give

    @_driver_call(blocks=True)
    def cuMemPoolTrimTo(self, pool, keep):  # noqa: N802
        self.trims.append((int(pool), int(keep)))
        self._trim(self.pools[int(pool)], int(keep))
        return (OK,)

    @_driver_call()
    def cuMemPoolDestroy(self, pool):  # noqa: N802
        del self.pools[int(pool)]
        return (OK,)

    # -- pinned host memory and copies ------------------------------------------------------

    @_driver_call(values=1)
    def cuMemHostAlloc(self, nbytes, flags):  # noqa: N802
        buffer = (ctypes.c_ubyte * nbytes)()
        ptr = ctypes.addressof(buffer)
        with self._lock:
            self.host_allocations[ptr] = buffer
        return OK, ptr

    @_driver_call()
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
                self._device_span(dst, nbytes)[:] = self._host(src, nbytes) if data is None else data

            pinned = self._pinned_base(src)
            if pinned is None:
                staged = self._host(src, nbytes).copy()
                self._queue(stream, "copy", lambda: copy(staged))
            else:
                self._queue(stream, "copy", copy, reads_host=pinned)
        return (OK,)

    def cuMemcpyDtoHAsync(self, dst, src, nbytes, stream):  # noqa: N802
        """Into pinned memory the copy writes when it runs; into pageable memory the call returns
        once the copy is done."""
        if error := self._call("cuMemcpyDtoHAsync"):
            return (error,)
        with self._lock:
            dst, src = int(dst), int(src)

            def copy() -> None:
                self._host(dst, nbytes)[:] = self._device_span(src, nbytes)

            pinned = self._pinned_base(dst)
            work = self._queue(stream, "copy", copy, reads_host=pinned)
            if pinned is None:
                self._run(int(stream or 0), work)
        return (OK,)
