"""A simulated CUDA device for tests without a GPU, strict where a real one is: work queued on a
stream runs only when something waits for it (or, with `progress`, at seeded random later moments),
asynchronous copies read their source when they run, events mark a point in a stream, device
memory is backed by host buffers at fake addresses so that contents can be checked end to end, a
cuMemPool keeps what it reserved until trimmed (or a synchronize passes its release threshold),
and every call needs a current context. The legacy default stream (handle 0) is the device's: it
waits for every blocking stream's earlier work and they for its. A stream-ordered allocation is
usable on its stream's order (SimFault where other work uses it first), and device memory freed
while work queued on another stream still uses it is a SimFault too. It stands in for
cuda-python's driver module (`cuda.bindings.driver`) of either generation (`bindings=12` or `13`)
over a driver of any version. Its enums and structs: sim_cuda_types.py; its memory:
sim_cuda_memory.py; the instance's device link over it: sim_link.py."""

from __future__ import annotations

import itertools
import random
import threading
from collections import deque
from collections.abc import Callable
from typing import Any

from tests.sim_cuda_memory import SimMemory
from tests.sim_cuda_types import (
    CU_MEMHOSTALLOC_PORTABLE,
    OK,
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
    driver_call,
)


class SimDevice(SimMemory):
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
        self.primary_retained = 0  # cuDevicePrimaryCtxRetain less cuDevicePrimaryCtxRelease
        self.torch_cached = 0  # device bytes torch's caching allocator holds unused (sim_link.py)

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
        self.primary_retained += 1
        return OK, ("context", device)

    def cuDevicePrimaryCtxRelease(self, device):  # noqa: N802
        if self.primary_retained == 0:
            raise SimFault("the primary context was released more often than retained")
        self.primary_retained -= 1
        return (OK,)

    def cuCtxSetCurrent(self, context):  # noqa: N802
        self._local.context = context
        return (OK,)

    def cuCtxGetCurrent(self):  # noqa: N802
        return OK, getattr(self._local, "context", None)

    @driver_call(blocks=True)
    def cuCtxSynchronize(self):  # noqa: N802
        for stream in list(self.streams):
            self._run(stream)
        self._release_above_thresholds()
        return (OK,)

    @driver_call(values=1)
    def cuStreamCreate(self, flags):  # noqa: N802
        handle = next(self._handles)
        self.streams[handle] = deque()
        if flags & CUstream_flags.CU_STREAM_NON_BLOCKING:
            self.non_blocking.add(handle)
        return OK, handle

    @driver_call()
    def cuStreamDestroy(self, stream):  # noqa: N802
        self._run(int(stream))  # its queued work still completes, as on a device
        del self.streams[int(stream)]
        self.non_blocking.discard(int(stream))
        return (OK,)

    @driver_call(blocks=True)
    def cuStreamSynchronize(self, stream):  # noqa: N802
        self._run(int(stream or 0))
        self._release_above_thresholds()
        return (OK,)

    @driver_call()
    def cuStreamWaitEvent(self, stream, event, flags):  # noqa: N802
        recorded = _Event(self.events[int(event)].marker)  # what is recorded now, not later
        self._queue(stream, "wait", lambda: None, event=recorded)
        return (OK,)

    @driver_call(values=1)
    def cuEventCreate(self, flags):  # noqa: N802
        handle = next(self._handles)
        self.events[handle] = _Event()
        return OK, handle

    @driver_call()
    def cuEventRecord(self, event, stream):  # noqa: N802
        state = self.events[int(event)]
        # An idle stream passes a record at once, as a real device does.
        idle = self._idle(int(stream or 0))
        state.marker = None if idle else self._queue(stream, "record", lambda: None)
        return (OK,)

    @driver_call()
    def cuEventQuery(self, event):  # noqa: N802
        return (OK if self.events[int(event)].complete else CUresult.CUDA_ERROR_NOT_READY,)

    @driver_call(blocks=True)
    def cuEventSynchronize(self, event):  # noqa: N802
        marker = self.events[int(event)].marker
        if marker is not None and not marker.done:
            self._run_to(marker)
        return (OK,)

    @driver_call()
    def cuEventDestroy(self, event):  # noqa: N802
        del self.events[int(event)]
        return (OK,)

    def new_stream(self, non_blocking: bool = False) -> int:
        """A stream for a test's own work (this thread's context made current first)."""
        self.cuCtxSetCurrent(("context", 0))
        flags = CUstream_flags.CU_STREAM_NON_BLOCKING if non_blocking else CUstream_flags.CU_STREAM_DEFAULT
        return int(self.cuStreamCreate(flags)[1])

    def launch(self, stream: int, kernel: Callable[[], None], touches: tuple[int, ...] = ()) -> None:
        """Queue a kernel (any host function standing for device work) on `stream`; `touches`: the
        device addresses it reads or writes."""
        with self._lock:
            self._queue(stream, "kernel", kernel, touches=touches)
