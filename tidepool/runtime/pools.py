"""A model instance's pools: the one its batches, outputs and (on a GPU) device inputs take blocks
from, and the staging pool its batches are gathered in (pinned memory on a GPU), each reserving
from the server's node budget where there is one; and how a request the pools cannot hold is
answered."""

from __future__ import annotations

from typing import TYPE_CHECKING

from tidepool.pool import MemoryPool, OutOfMemory
from tidepool.pool.budget import tier_of
from tidepool.pool.ledger import NodeLedger
from tidepool.runtime.settings import InstanceSettings, Placement
from tidepool.runtime.validation import RequestError
from tidepool.spec import mib

if TYPE_CHECKING:
    from tidepool.runtime.device import DeviceLink

# How a request the node's memory budget cannot hold now is answered (UNAVAILABLE), and how warm-up
# tells it from a device out of memory.
NODE_BUDGET_REFUSED = "does not fit the node's memory budget now"


def create_pools(
    settings: InstanceSettings, placement: Placement
) -> tuple[MemoryPool, MemoryPool, list[str]]:
    """(the pool, the staging pool, notes for the log on the node budget): one pool on the CPU;
    on a GPU a CUDA pool for the device inputs and a pinned one to gather batches in."""
    notes: list[str] = []
    kind = settings.pool_kind
    if kind == "auto":
        kind = "cuda" if settings.on_gpu else "host"
    pool = new_pool(settings, placement, kind, settings.pool_initial_bytes, notes)
    staging = new_pool(settings, placement, "pinned", 0, notes) if pool.kind == "cuda" else pool
    return pool, staging, notes


def new_pool(
    settings: InstanceSettings, placement: Placement, kind: str, initial_bytes: int, notes: list[str]
) -> MemoryPool:
    """A pool of the instance; inside a server, one that reserves from the node's ledger for its
    tier (its floor: what `initial_bytes` reserves) and answers its trim requests. Its housekeeping
    is deferred: the instance runs it between executions (ModelInstance.housekeep)."""
    entry = None
    if settings.node_budget and placement.server_pid is not None:
        ledger = NodeLedger.attach(tier_of(kind, settings.device_index), placement.server_pid)
        if ledger.created:
            notes.append(f"node {ledger.tier} budget {ledger.budget / 2**30:.2f} GiB ({ledger.budget_why})")
        floor = MemoryPool.initial_arena_bytes(initial_bytes)
        try:
            entry = ledger.join(placement.model_name, placement.instance_name, floor)
        except BaseException:
            ledger.close()
            raise
    try:
        return MemoryPool(
            kind,
            device=settings.device_index,
            limit_bytes=settings.pool_limit_bytes,
            initial_bytes=initial_bytes,
            fragmentation_threshold=settings.pool_fragmentation_threshold,
            budget=entry,
            defer_housekeeping=True,
        )
    except BaseException:
        if entry is not None:
            entry.leave()
            entry.ledger.close()
        raise


def make_room(pool: MemoryPool | None) -> None:
    """After torch ran out of device memory: the instance's CUDA pool gives back what it holds
    above its floor, so that the retried halves find it free (torch's cache and the pool draw on
    one device)."""
    if pool is not None and pool.kind == "cuda":
        pool.trim(keep_bytes=pool.initial_bytes)


def memory_held(pool: MemoryPool | None, link: DeviceLink | None) -> str:
    """Who holds the device's memory, for a refusal: torch's caching allocator and the pool."""
    if link is None or pool is None or pool.kind != "cuda":
        return ""
    reserved, allocated = link.memory_held()
    stats = pool.stats(walk_arenas=False)
    return (
        f"torch's caching allocator holds {mib(reserved)} ({mib(allocated)} in use), the instance's "
        f"pool {mib(stats.reserved_bytes)} ({mib(stats.allocated_bytes)} in use)"
    )


def refusal(error: Exception, rows: int, held: str = "") -> RequestError:
    """The answer to a request that alone does not fit: retrying it cannot help where the pool's
    limit is the cause; the node budget's or the device's memory may free up. `held`: who holds
    the device's memory (memory_held)."""
    holders = f"; {held}" if held else ""
    if isinstance(error, OutOfMemory) and error.node_budget:
        # UNAVAILABLE: the memory may come back once other models' pools trim (2.51 has no
        # RESOURCE_EXHAUSTED to say so).
        return RequestError(
            f"this request ({rows} row(s)) {NODE_BUDGET_REFUSED}: {error.cause}", code="UNAVAILABLE"
        )
    if isinstance(error, OutOfMemory) and error.device:
        return RequestError(
            f"this request ({rows} row(s)) does not fit the device's free memory: {error.cause}, after "
            f"torch's cache was emptied and the pool trimmed{holders}",
            code="UNAVAILABLE",
        )
    if isinstance(error, OutOfMemory):
        return RequestError(
            f"this request ({rows} row(s)) does not fit the model instance's memory pool: it needs "
            f"{error.requested} bytes more, the pool limit is {error.limit} bytes ({error.reserved} "
            "reserved); send fewer rows or raise POOL_LIMIT_BYTES",
            code="RESOURCE_EXHAUSTED",
        )
    return RequestError(
        f"the device ran out of memory for this request ({rows} row(s)), after the pool gave back what "
        f"it caches: {str(error).splitlines()[0]}{holders}",
        code="UNAVAILABLE",
    )
