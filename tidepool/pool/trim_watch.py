"""One background thread per process that answers the node ledger's trim requests for pools that
sit idle (a busy pool also answers at its next execution), within TRIM_POLL_S. Process-wide state,
changed only through `watch` and `unwatch`."""

from __future__ import annotations

import threading
import time
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from tidepool.pool.memory_pool import MemoryPool

TRIM_POLL_S = 0.05

_pools: list[MemoryPool] = []
_lock = threading.Lock()
_thread: threading.Thread | None = None


def watch(pool: MemoryPool) -> None:
    """Answer `pool`'s trim requests from the background until `unwatch`."""
    global _thread
    with _lock:
        _pools.append(pool)
        if _thread is None:
            _thread = threading.Thread(target=_run, name="tidepool-trim-watch", daemon=True)
            _thread.start()


def unwatch(pool: MemoryPool) -> None:
    with _lock:
        if pool in _pools:
            _pools.remove(pool)


def watched() -> int:
    with _lock:
        return len(_pools)


def _run() -> None:
    while True:
        with _lock:
            pools = list(_pools)
        for pool in pools:
            if not pool.closed:
                try:
                    pool.answer_trim()
                except Exception:  # noqa: S112 - a pool closing meanwhile; the next round sees it closed
                    continue
        time.sleep(TRIM_POLL_S)
