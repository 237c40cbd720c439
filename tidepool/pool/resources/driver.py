"""The CUDA driver through cuda-python, found once: which bindings are installed (cuda-bindings 12.x
or 13.x, picked at import) and whether this node's driver takes them, a device and its primary
context, events, and a checked call helper that turns CUresult codes into exceptions. Resources
make their context current around every driver call and restore the caller's after it, since a
pool is used from more than one thread (a loading thread, the stub's main thread, a view that goes
in garbage collection), each of which may have a context of its own current."""

from __future__ import annotations

import functools
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from tidepool.pool.errors import CudaUnavailable

# CUmemPoolProps.maxSize, the CUDA pool's own hard cap, is honoured from CUDA 12.2 drivers on;
# with older ones the pool's own limit (MemoryPool.limit_bytes) is the only one.
MAX_SIZE_DRIVER = 12020
# The install that pairs with each driver generation (docs/pool.md, "Drivers").
PAIRING = {
    12: "cuda12 (torch's cu126 build, cuda-python 12.9)",
    13: "cuda13 (torch's CUDA 13 build, cuda-python 13)",
}


def bindings() -> Any:
    """cuda-python's driver module: `cuda.bindings.driver` (cuda-bindings 12.6.1 on, and 13.x),
    else the `cuda.cuda` of older 12.x releases. One place to find it, so tests can stand in a
    simulated device."""
    try:
        from cuda.bindings import driver
    except ImportError:
        from cuda import cuda as driver
    return driver


def bindings_version() -> int:
    """The CUDA version the installed bindings were built for (13040: 13.4); 0 where unknown."""
    return int(getattr(bindings(), "CUDA_VERSION", 0))


def check(result: Any) -> Any:
    """Unpack a cuda-python call's (CUresult, *values), raising on an error code."""
    driver = bindings()
    error, *values = result if isinstance(result, tuple) else (result,)
    if error != driver.CUresult.CUDA_SUCCESS:
        _, name = driver.cuGetErrorName(error)
        message = f"CUDA driver call failed: {name.decode() if name else error}"
        if error == driver.CUresult.CUDA_ERROR_OUT_OF_MEMORY:
            raise MemoryError(message)  # the pool answers this with its OOM escalation
        raise CudaUnavailable(message)
    if not values:
        return None
    return values[0] if len(values) == 1 else tuple(values)


@functools.cache
def cuda_status(device: int = 0) -> tuple[bool, str]:
    """(True, device, driver and bindings) when the driver initialises, takes the installed
    bindings and `device` exists, else (False, why)."""
    try:
        driver = bindings()
        check(driver.cuInit(0))
        count = check(driver.cuDeviceGetCount())
        version = driver_version()
    except ImportError as exc:
        return False, f"cuda-python is not installed ({exc})"
    except CudaUnavailable as exc:
        return False, f"the CUDA driver did not initialise: {exc}"
    except Exception as exc:  # cuda-python raises DynamicLibNotFoundError without a driver
        return False, f"no CUDA driver ({type(exc).__name__}: {exc})"
    built_for = bindings_version()
    if built_for // 1000 > version // 1000:
        # Bindings of a newer major than the driver fail call by call, not at import: say so once.
        return False, (
            f"the installed cuda-bindings are built for {describe_version(built_for)} and need a CUDA "
            f"{built_for // 1000} driver; this node's driver is {describe_version(version)}: install "
            f"the {PAIRING.get(version // 1000, 'matching')} pairing (docs/pool.md, 'Drivers')"
        )
    if device >= count:
        return False, f"CUDA device {device} does not exist ({count} device(s))"
    name = check(driver.cuDeviceGetName(256, check(driver.cuDeviceGet(device)))).split(b"\0", 1)[0]
    built = f", cuda-bindings for {describe_version(built_for)}" if built_for else ""
    return True, f"{name.decode()}, driver {describe_version(version)}{built}"


def driver_version() -> int:
    """The driver's CUDA version as the driver API gives it: 12020 for 12.2."""
    return int(check(bindings().cuDriverGetVersion()))


def describe_version(version: int) -> str:
    return f"CUDA {version // 1000}.{version % 1000 // 10}"


def require_cuda(device: int = 0) -> None:
    available, reason = cuda_status(device)
    if not available:
        raise CudaUnavailable(f"CUDA memory is not available: {reason}")


def primary_context(device: int) -> Any:
    """The device's primary context (the one torch's runtime shares), retained for the caller, who
    releases it (release_primary_context) when done."""
    driver = bindings()
    return check(driver.cuDevicePrimaryCtxRetain(check(driver.cuDeviceGet(device))))


def release_primary_context(device: int) -> None:
    driver = bindings()
    check(driver.cuDevicePrimaryCtxRelease(check(driver.cuDeviceGet(device))))


@contextmanager
def current(context: Any) -> Iterator[Any]:
    """`context` current on the calling thread for the driver calls inside (the driver module is
    yielded), and the thread's own context current again after them."""
    driver = bindings()
    previous = check(driver.cuCtxGetCurrent())
    check(driver.cuCtxSetCurrent(context))
    try:
        yield driver
    finally:
        check(driver.cuCtxSetCurrent(previous))


def device_total_bytes(device: int) -> int:
    """The device's memory, for the default CUDA tier budget of the node ledger."""
    require_cuda(device)
    driver = bindings()
    return int(check(driver.cuDeviceTotalMem(check(driver.cuDeviceGet(device)))))


class DriverEvent:
    """A point in a stream: the work queued on it before `record`. `done` asks without waiting,
    `wait` blocks the host until then, `order` makes another stream's later work wait for it on
    the device (the host does not wait). `close` hands the event back for reuse."""

    def __init__(self, events: Events, handle: Any) -> None:
        self._events = events
        self.handle = handle

    def done(self) -> bool:
        with current(self._events.context) as driver:
            result = driver.cuEventQuery(self.handle)
            error = result[0] if isinstance(result, tuple) else result
            if error == driver.CUresult.CUDA_ERROR_NOT_READY:
                return False
            check(result)
            return True

    def wait(self) -> None:
        with current(self._events.context) as driver:
            check(driver.cuEventSynchronize(self.handle))

    def order(self, stream: int) -> None:
        with current(self._events.context) as driver:
            check(driver.cuStreamWaitEvent(stream, self.handle, 0))

    def close(self) -> None:
        self._events.idle.append(self.handle)


class Events:
    """A resource's events, created once and reused (a record is one driver call, a creation two),
    and every one destroyed when the resource closes, whether or not it was handed back."""

    def __init__(self, context: Any) -> None:
        self.context = context
        self.idle: list[Any] = []  # list.append and .pop are atomic: no lock needed
        self.created: list[Any] = []

    def record(self, stream: int) -> DriverEvent:
        with current(self.context) as driver:
            try:
                handle = self.idle.pop()
            except IndexError:
                handle = check(driver.cuEventCreate(driver.CUevent_flags.CU_EVENT_DISABLE_TIMING))
                self.created.append(handle)
            check(driver.cuEventRecord(handle, stream))
        return DriverEvent(self, handle)

    def close(self) -> None:
        with current(self.context) as driver:
            while self.created:
                check(driver.cuEventDestroy(self.created.pop()))
        self.idle.clear()
