"""The simulated device's enums and structs, named as cuda-bindings names them (the calls the pool
makes read them), the items its streams queue, and the wrapper of its driver calls."""

from __future__ import annotations

import enum
import functools
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np


class SimFault(AssertionError):
    """Something a real device would punish: a use after free, a freed buffer a copy still reads."""


class CUresult(enum.IntEnum):
    CUDA_SUCCESS = 0
    CUDA_ERROR_OUT_OF_MEMORY = 2
    CUDA_ERROR_INVALID_CONTEXT = 201
    CUDA_ERROR_NOT_READY = 600


class CUmemAllocationType(enum.IntEnum):
    CU_MEM_ALLOCATION_TYPE_PINNED = 1


class CUmemLocationType(enum.IntEnum):
    CU_MEM_LOCATION_TYPE_DEVICE = 1


class CUmemPool_attribute(enum.IntEnum):  # noqa: N801 - the driver's own name
    CU_MEMPOOL_ATTR_RELEASE_THRESHOLD = 4
    CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT = 5
    CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH = 6
    CU_MEMPOOL_ATTR_USED_MEM_CURRENT = 7
    CU_MEMPOOL_ATTR_USED_MEM_HIGH = 8


class CUevent_flags(enum.IntEnum):  # noqa: N801
    CU_EVENT_DEFAULT = 0
    CU_EVENT_DISABLE_TIMING = 2


class CUstream_flags(enum.IntEnum):  # noqa: N801
    CU_STREAM_DEFAULT = 0
    CU_STREAM_NON_BLOCKING = 1


CU_MEMHOSTALLOC_PORTABLE = 1
OK = CUresult.CUDA_SUCCESS
UNWRITTEN = 0xCD  # fresh device memory, so that a read of what no copy wrote shows
POISON = 0xDD  # freed pinned memory


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


@dataclass(eq=False)
class Work:
    """One item of a stream's queue."""

    what: str  # "copy", "free", "kernel", "record", "wait"
    run: Callable[[], None]
    seq: int
    reads_host: int | None = None  # the pinned buffer a copy reads or writes, while queued
    touches: tuple[int, ...] = ()  # device addresses it reads or writes
    event: _Event | None = None  # for "wait": the event it waits for
    done: bool = False


@dataclass
class _Event:
    marker: Work | None = None  # the latest record; done when it ran

    @property
    def complete(self) -> bool:
        return self.marker is None or self.marker.done


@dataclass
class _Pool:
    max_size: int
    threshold: int = 0
    reserved: int = 0
    used: int = 0
    cached: int = 0  # freed (and the free ran): reserved, handed out again or trimmed
    reserved_high: int = 0
    used_high: int = 0


@dataclass
class _DeviceAllocation:
    pool: int | None
    buffer: np.ndarray
    live: bool = True
    ready: bool = True  # its stream-ordered allocation has run on its stream


def driver_call(values: int = 0, blocks: bool = False) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """A driver call: maybe some queued work runs first; without a current context, the error (and
    `values` Nones after it, as the call's result has them); else the call, under the device's lock,
    counted in `blocking_calls` where it `blocks` the host (or trims a pool)."""

    def wrap(method: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(method)
        def call(self: Any, *args: Any) -> Any:
            if error := self._call(method.__name__):
                return (error, *([None] * values))
            with self._lock:
                if blocks:
                    self.blocking_calls.append((method.__name__, threading.current_thread().name))
                return method(self, *args)

        return call

    return wrap
