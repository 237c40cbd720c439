"""Blocks whose last use may still be queued on a stream. A pinned block freed behind an
asynchronous copy is written again only once an event recorded behind that copy has completed (as
torch's CachingHostAllocator does): the host writes it, and a stream orders nothing for the host.
Device blocks that go back to the shared arenas leave a fence on their stream, and memory taken
from the arenas on another stream is ordered after it on the device (the host does not wait)."""

from __future__ import annotations

from collections import deque
from collections.abc import Hashable, Iterator

from tidepool.pool.arena import Location
from tidepool.pool.resources.base import StreamEvent


class PendingBlocks:
    """Pinned blocks freed on a stream, per size class, oldest first, each with its event."""

    def __init__(self) -> None:
        self._by_key: dict[Hashable, deque[tuple[StreamEvent, Location]]] = {}
        self.count = 0

    def __bool__(self) -> bool:
        return self.count > 0

    def add(self, key: Hashable, event: StreamEvent, location: Location) -> None:
        self._by_key.setdefault(key, deque()).append((event, location))
        self.count += 1

    def settle(self, free: dict[Hashable, list[Location]]) -> None:
        """Move every block whose copy has run onto its free list (asks each event, no wait). Events
        of one stream complete in order, so a size class stops at its first pending one."""
        for key, waiting in self._by_key.items():
            while waiting and waiting[0][0].done():
                event, location = waiting.popleft()
                event.close()
                free.setdefault(key, []).append(location)
                self.count -= 1

    def take_oldest(self, key: Hashable) -> tuple[StreamEvent, Location] | None:
        """The oldest pending block of a size class, for a caller that waits for its event."""
        waiting = self._by_key.get(key)
        if not waiting:
            return None
        self.count -= 1
        return waiting.popleft()

    def take_all(self) -> Iterator[tuple[StreamEvent, Location]]:
        """Every pending block, emptying the list (at close, which waits for each)."""
        for waiting in self._by_key.values():
            while waiting:
                self.count -= 1
                yield waiting.popleft()


class Fences:
    """Events behind device blocks that went back to the shared arenas, with the stream each is on."""

    def __init__(self) -> None:
        self._fences: list[tuple[int, StreamEvent]] = []

    def __bool__(self) -> bool:
        return bool(self._fences)

    def add(self, stream: int, event: StreamEvent) -> None:
        self._fences.append((stream, event))

    def order(self, stream: int) -> None:
        """Make `stream`'s work from now on wait for every fence of another stream still pending;
        forget the fences that have passed."""
        pending = []
        for fenced, event in self._fences:
            if event.done():
                event.close()
                continue
            if fenced != stream:
                event.order(stream)
            pending.append((fenced, event))
        self._fences = pending
