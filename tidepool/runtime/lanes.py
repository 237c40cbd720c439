"""Several batches of one Triton instance at once (BATCHES_IN_FLIGHT): each runs on a lane, with its
own pool, held execution and elastic share, over one copy of the module. Lane 0 is Triton's own
thread, which answers from `execute` as a plain instance does; the other lanes are threads of the
stub, given a batch only under load, which answer through the requests' response senders.

Why, and not more instances: Triton without its rate limiter hands a lone client's requests to the
instances in turn, so with two instances every other request ran in a process whose caches and
OpenMP workers had gone cold. Here a lone request always runs on lane 0, with every core, exactly
as on one instance; under load a batch that finds lane 0's caller back at once (requests were
waiting) or holding several requests goes to an idle lane and `execute` returns at once, so Triton
hands lane 0 the next batch while that one runs. Triton's Python backend (2.51) allows this: an
`execute` that returns None leaves each request to its response sender.

Every torch call of a lane runs on that lane's thread, loading included: libgomp keeps one team of
workers per thread that starts parallel work, and where the process holds more OpenMP threads than
there are cores it makes idle workers sleep at once (its throttled spin), which cost the encoder's
pass 1.7x on 2 cores when a second thread's team of 2 came beside the loader's. So lane 0 loads the
model and takes up to TORCH_NUM_THREADS, and the other lanes run at most cores / lanes threads."""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # torch loads with lane 0, once the OpenMP environment is chosen
    from tidepool.runtime.instance import ModelInstance

Job = Callable[["ModelInstance"], None]  # runs on a lane's thread, with that lane's instance

# A batch counts as "under load" when it holds several requests, or when Triton called `execute`
# within this long of the last return: requests were already waiting. A lone client's next request
# comes a round trip later (0.5-1 ms over loopback gRPC here).
BACK_TO_BACK_NS = 150_000


@dataclass
class Lanes:
    """Lane 0 (`first`) runs in the caller's thread; `claim` and `hand` give a job to another lane."""

    instances: list[ModelInstance]
    _inboxes: list[queue.SimpleQueue[Job | None]] = field(default_factory=list)  # lanes 1..
    _threads: list[threading.Thread] = field(default_factory=list)
    _idle: list[int] = field(default_factory=list)  # lanes 1.. waiting for a job, lowest first
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _returned_ns: int = 0  # when Triton's thread last left execute
    on_error: Callable[[BaseException], None] = lambda error: None  # a job's escaped exception

    @classmethod
    def start(cls, count: int, first: ModelInstance) -> Lanes:
        """Lanes 1..count-1 beside `first` (lane 0, loaded by the caller): each made and warmed up
        on its own thread with `ModelInstance.lane`. Returns once all are warm; where one fails,
        the others are closed and its error is raised here."""
        made: list[ModelInstance | None] = [None] * count
        failures: list[BaseException] = []
        ready = [threading.Event() for _ in range(count)]
        lanes = cls([first], [queue.SimpleQueue() for _ in range(count)])

        def run(index: int) -> None:
            try:
                made[index] = first.lane(index)
            except BaseException as error:  # noqa: BLE001 - raised again by start, in Triton's thread
                failures.append(error)
            finally:
                ready[index].set()
            if made[index] is not None:
                lanes._serve(index)

        lanes._threads = [threading.Thread(target=run, args=(i,), name=f"tidepool-lane-{i}", daemon=True)
                          for i in range(1, count)]  # fmt: skip
        for thread in lanes._threads:
            thread.start()
        for event in ready[1:]:
            event.wait()
        lanes.instances += [instance for instance in made if instance is not None]
        if failures:
            lanes.close()
            raise failures[0]
        lanes._idle = list(range(1, count))
        return lanes

    @property
    def first(self) -> ModelInstance:
        return self.instances[0]

    def under_load(self, requests: int) -> bool:
        """Whether a batch of `requests` that Triton hands over now found requests waiting."""
        return requests > 1 or time.monotonic_ns() - self._returned_ns < BACK_TO_BACK_NS

    def returned(self) -> None:
        """Triton's thread leaves execute now."""
        self._returned_ns = time.monotonic_ns()

    def claim(self) -> int | None:
        """The lowest idle lane other than lane 0, now reserved for the caller's `hand`; None where
        every one is busy."""
        with self._lock:
            return self._idle.pop(0) if self._idle else None

    def hand(self, lane: int, job: Job) -> None:
        """Run `job` on `lane` (from `claim`)."""
        self._inboxes[lane].put(job)

    def _serve(self, index: int) -> None:
        """A lane's loop: run jobs until `close`."""
        inbox = self._inboxes[index]
        while (job := inbox.get()) is not None:
            try:
                job(self.instances[index])
            except BaseException as error:  # noqa: BLE001 - a lane outlives any one job
                self.on_error(error)
            finally:
                with self._lock:
                    self._idle.append(index)
                    self._idle.sort()

    def close(self) -> None:
        """Let the jobs in hand finish, stop the lanes and close every lane's instance."""
        for inbox in self._inboxes:
            inbox.put(None)
        for thread in self._threads:
            thread.join()
        for instance in self.instances:
            instance.close()

    def describe(self) -> str:
        threads = ", ".join(str(instance.settings.torch_threads) for instance in self.instances)
        return (
            f"{len(self.instances)} batches in flight (lane 0 in Triton's thread, the others under load), "
            f"up to {threads} torch threads"
        )
