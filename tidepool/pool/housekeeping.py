"""One background thread per process that does the pools' housekeeping off the request path:
the maintenance an execution left due, and answers to the node ledger's trim requests. It runs
each watched callable when kicked (a model instance kicks it as an execution ends) and at least
every POLL_S (an idle pool answers a trim request within that). Process-wide state, changed only
through `watch`, `unwatch` and `kick`."""

from __future__ import annotations

import threading
from collections.abc import Callable

POLL_S = 0.05

Chore = Callable[[], object]  # e.g. MemoryPool.housekeep, or a model instance's own
_chores: list[Chore] = []
_lock = threading.Lock()
_kicked = threading.Event()
_thread: threading.Thread | None = None


def watch(chore: Chore) -> None:
    """Run `chore` from the background on every kick and every POLL_S until `unwatch(chore)`; it
    must be cheap when there is nothing to do."""
    global _thread
    with _lock:
        _chores.append(chore)
        if _thread is None:
            _thread = threading.Thread(target=_run, name="tidepool-housekeeping", daemon=True)
            _thread.start()


def unwatch(chore: Chore) -> None:
    with _lock:
        if chore in _chores:
            _chores.remove(chore)


def kick() -> None:
    """Have the background thread run its chores now rather than at its next poll."""
    _kicked.set()


def _run() -> None:
    while True:
        _kicked.wait(POLL_S)
        _kicked.clear()
        with _lock:
            chores = list(_chores)
        for chore in chores:
            try:
                chore()
            except Exception:  # noqa: S112 - a pool closing meanwhile; it is unwatched next
                continue
