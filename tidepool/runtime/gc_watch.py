"""Python's garbage collector in this process: how many collections of each generation ran and how
long they stopped it, for the metrics. A collection holds the GIL, so in a stub it stops `execute`,
the responses and the metrics thread alike: one tail a model's own Python code can cause.

Process-wide, as `gc.callbacks` is: `start_watching()` installs the one watch (counted, so that
several instances in one process share it) and `stop_watching()` removes it with the last user."""

from __future__ import annotations

import gc
import threading
import time
from dataclasses import dataclass
from typing import Any

GENERATIONS = 3


@dataclass(frozen=True)
class GcTotals:
    """Since the watch was installed: collections per generation (0, 1, 2) and their pause time."""

    collections: tuple[int, ...]
    pause_ns: int


class GcWatch:
    """Totals that only grow. The callback runs in whichever thread allocates and must never wait
    (a lock it shares with a reader that allocates would deadlock), so readers take the totals
    without a lock and send what grew since they last read."""

    def __init__(self) -> None:
        self._collections = [0] * GENERATIONS
        self._pause_ns = 0
        self._began_ns = 0

    def on_gc(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self._began_ns = time.perf_counter_ns()
        elif self._began_ns:  # a "stop" without its "start": installed mid-collection
            self._collections[info["generation"]] += 1
            self._pause_ns += time.perf_counter_ns() - self._began_ns
            self._began_ns = 0

    def totals(self) -> GcTotals:
        return GcTotals(tuple(self._collections), self._pause_ns)


_watch: GcWatch | None = None
_users = 0
_lock = threading.Lock()  # installing and removing only, never taken inside a collection


def start_watching() -> GcWatch:
    """The process's watch, installed with its first user."""
    global _watch, _users
    with _lock:
        if _watch is None:
            _watch = GcWatch()
            gc.callbacks.append(_watch.on_gc)
        _users += 1
        return _watch


def stop_watching() -> None:
    """One user fewer; the last one removes the watch."""
    global _watch, _users
    with _lock:
        _users = max(0, _users - 1)
        if _users == 0 and _watch is not None:
            gc.callbacks.remove(_watch.on_gc)
            _watch = None
