"""Upstream memory resources: where a pool's arenas come from (one small module each), and the one
a pool of a given kind takes."""

from __future__ import annotations

from tidepool.pool.errors import PoolError
from tidepool.pool.resources.base import Allocation, MemoryResource
from tidepool.pool.resources.fake import FakeResource
from tidepool.pool.resources.host import HostResource

__all__ = ["Allocation", "FakeResource", "HostResource", "MemoryResource", "make_resource"]


def make_resource(kind: str, device: int, limit_bytes: int | None) -> tuple[MemoryResource, str]:
    """The resource for a pool of `kind` ("auto": CUDA where a driver and device are, else host),
    and why it is that one. The CUDA modules load only where CUDA memory is asked for."""
    from tidepool.pool.resources.driver import cuda_status

    if kind == "auto":
        available, reason = cuda_status(device)
        kind = "cuda" if available else "host"
        if not available:
            return HostResource(), f"auto: host memory, because {reason}"
        reason = f"auto: CUDA device {device} ({reason})"
    elif kind in ("pinned", "cuda"):
        reason = f"asked for {kind}: {cuda_status(device)[1]}"  # the device, driver and bindings
    else:
        reason = f"asked for {kind}"
    if kind == "host":
        return HostResource(), reason
    if kind == "pinned":
        from tidepool.pool.resources.pinned import PinnedResource

        return PinnedResource(device), reason
    if kind == "cuda":
        from tidepool.pool.resources.cuda import CudaResource

        resource = CudaResource(device, limit_bytes)
        if limit_bytes and not resource.capped_by_driver:
            reason += "; this driver ignores a CUDA pool's maxSize (before 12.2): the pool's limit caps it"
        return resource, reason
    raise PoolError(f"kind must be auto, host, pinned or cuda, got {kind!r}")
