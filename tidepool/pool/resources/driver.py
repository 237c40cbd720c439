"""The CUDA driver through cuda-python, found once: whether a driver and device exist (and why
not), its version, the device's primary context, and a checked call helper that turns CUresult
codes into exceptions. Resources make their context current before every driver call, since a
pool is used from more than one thread (a loading thread, the stub's main thread, a view that goes
in garbage collection)."""

from __future__ import annotations

import functools
from typing import Any

from tidepool.pool.errors import CudaUnavailable

# CUmemPoolProps.maxSize, the CUDA pool's own hard cap, is honoured from CUDA 12.2 drivers on;
# with older ones the pool's own limit (MemoryPool.limit_bytes) is the only one.
MAX_SIZE_DRIVER = 12020


def bindings() -> Any:
    """cuda-python's driver module (one place to find it, so tests can stand a fake in)."""
    from cuda.bindings import driver

    return driver


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
    """(True, device name and driver version) when the driver initialises and `device` exists,
    else (False, why)."""
    try:
        driver = bindings()
        check(driver.cuInit(0))
        count = check(driver.cuDeviceGetCount())
    except ImportError as exc:
        return False, f"cuda-python is not installed ({exc})"
    except CudaUnavailable as exc:
        return False, f"the CUDA driver did not initialise: {exc}"
    except Exception as exc:  # cuda-python raises DynamicLibNotFoundError without a driver
        return False, f"no CUDA driver ({type(exc).__name__}: {exc})"
    if device >= count:
        return False, f"CUDA device {device} does not exist ({count} device(s))"
    name = check(driver.cuDeviceGetName(256, check(driver.cuDeviceGet(device)))).split(b"\0", 1)[0]
    return True, f"{name.decode()}, driver {describe_version(driver_version())}"


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
    """The device's primary context (the one torch's runtime shares), retained for the caller."""
    driver = bindings()
    return check(driver.cuDevicePrimaryCtxRetain(check(driver.cuDeviceGet(device))))


def make_current(context: Any) -> None:
    """Make `context` current on the calling thread (cheap; a driver call needs one current)."""
    check(bindings().cuCtxSetCurrent(context))


def device_total_bytes(device: int) -> int:
    """The device's memory, for the default CUDA tier budget of the node ledger."""
    require_cuda(device)
    driver = bindings()
    return int(check(driver.cuDeviceTotalMem(check(driver.cuDeviceGet(device)))))
