"""Upstream memory resources: where a pool's arenas come from (one small module each)."""

from pool.resources.base import Allocation, MemoryResource
from pool.resources.fake import FakeResource
from pool.resources.host import HostResource

__all__ = ["Allocation", "FakeResource", "HostResource", "MemoryResource"]
