"""Upstream memory resources: where a pool's arenas come from (one small module each)."""

from tidepool.pool.resources.base import Allocation, MemoryResource
from tidepool.pool.resources.fake import FakeResource
from tidepool.pool.resources.host import HostResource

__all__ = ["Allocation", "FakeResource", "HostResource", "MemoryResource"]
