"""The CUDA driver through cuda-python, found once: whether a driver and device exist (and why
not), and a checked call helper that turns CUresult codes into exceptions."""

from __future__ import annotations

import functools
from typing import Any

from tidepool.pool.errors import CudaUnavailable


def _driver() -> Any:
    from cuda.bindings import driver

    return driver


def check(result: Any) -> Any:
    """Unpack a cuda-python call's (CUresult, *values), raising on an error code."""
    driver = _driver()
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
    """(True, device name) when the driver initialises and `device` exists, else (False, why)."""
    try:
        driver = _driver()
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
    name = check(driver.cuDeviceGetName(256, check(driver.cuDeviceGet(device))))
    return True, name.split(b"\0", 1)[0].decode()


def require_cuda(device: int = 0) -> None:
    available, reason = cuda_status(device)
    if not available:
        raise CudaUnavailable(f"CUDA memory is not available: {reason}")


def make_context_current(device: int) -> None:
    """Use the device's primary context (the one torch's runtime shares)."""
    driver = _driver()
    context = check(driver.cuDevicePrimaryCtxRetain(check(driver.cuDeviceGet(device))))
    check(driver.cuCtxSetCurrent(context))
