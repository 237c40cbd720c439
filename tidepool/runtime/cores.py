"""Elastic torch threads: the CPU instances of one server share its cores among those computing
right now. Each instance holds a slot in a small shared file named after the server's pid (a
processes.SlotTable, so a killed instance's slot and cores come back as its memory does in the node
ledger) and, before each forward pass, takes cores / (instances busy) threads, capped at
TORCH_NUM_THREADS; where the others already use every core (one took them all while it ran alone),
it waits for them.

Why: on a CPU the best split of the cores depends on the load. One instance with every core
answers a lone request fastest; one instance per core serves most under load. Elastic threads
give a config of several instances both: a request that runs alone gets every core, and
instances that run together split them instead of oversubscribing.

Also here: a CPU instance can load at a lower priority (`at_lower_priority`, opt-in), so that a
reload does not take the cores from the instances that serve meanwhile."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import numpy as np

from tidepool import parameters as param
from tidepool.machine import usable_cores
from tidepool.parameters import DEFAULT_HOLD_US
from tidepool.processes import SlotTable, shared_directory
from tidepool.spec import ConfigError, ModelSpec, parse_model_config

SLOTS = 64
# Per slot: the owner (pid, 0: free; its start time), until when it counts as busy (monotonic ns),
# and the threads its forward pass runs with now (0: none).
ROW = np.dtype([("pid", "<i8"), ("start", "<i8"), ("busy_until", "<i8"), ("threads", "<i8")])
NO_HEADER = np.dtype([])
BUSY = 2**63 - 1  # "until further notice": computing now
# Under load an instance counts as busy for a while after its forward pass (the hold), so that
# another one that starts while it fetches its next batch does not take its cores and then share
# them three ways. A fixed hold cannot serve a lone client too: measured on 2 cores (convnet, 2
# instances x up to 2 threads), a lone client's next request reached the other instance 1-4 ms
# after the last pass ended, and a saturated instance's next batch came as late: a 1 ms hold served
# c=1 at 0.97 of one 2-thread instance but c=4 at 0.87 of two 1-thread ones; 4 ms, c=4 at 1.01 but
# c=1 at 0.69. Nor can the gaps between an instance's passes tell load apart: without Triton's rate
# limiter a lone client's requests go to the instances in turn, so each instance's gap is one round
# trip, as short as under load, and a hold of twice that left every other lone request one thread
# (encoder on 2 cores under plain tritonserver, c=1: 0.61-0.69x one instance with both cores).
# What does tell load is whether passes overlap: a lone client's never do. So:
# - an instance whose recent passes did not overlap another's (a moving share under
#   LOADED_OVERLAP) is not held at all: the next request, whichever instance takes it, runs alone;
# - a loaded one that takes batches back to back (gaps under BACK_TO_BACK_NS) is held for twice
#   its typical gap, and otherwise for ELASTIC_HOLD_US (default DEFAULT_HOLD_US).
BACK_TO_BACK_NS = 10_000_000
GAP_CAP_NS = 20_000_000  # longer gaps count as this long: one idle spell must not dominate the mean
# A pass overlaps when another instance was in a pass (or waiting for a core) as it started or
# ended. The share moves a quarter of the way per pass: one overlap makes the instance loaded
# (0.25), and from there it takes five passes in a row without one (0.25 x 0.75^5 < 0.06) before it
# is no longer held, so a saturated instance that by chance runs a pass alone keeps its hold.
OVERLAP_WEIGHT = 0.25
LOADED_OVERLAP = 0.06
# A forward pass that finds every core taken waits this long at most, polling, before it runs on
# one thread anyway: waiting for a pass that holds every core beats sharing them three ways, where
# OpenMP threads wait at each barrier for a thread the kernel has descheduled.
MAX_WAIT_S = 0.1
POLL_S = 0.0002
# A killed instance's slot keeps its BUSY mark and its threads until someone clears it: a pass
# clears dead owners' slots before it would wait for a core, and at least this often otherwise.
RECLAIM_EVERY_NS = 1_000_000_000
SPIN_VARIABLE = "GOMP_SPINCOUNT"
# What a loading instance's thread adds to its nice value, from TIDEPOOL_LOADING_NICENESS in
# tritonserver's environment (default 0: load at full priority, in the stub's main thread).
# Importing torch and warming up take seconds of CPU (2.6 s for `import torch` here), which a reload
# takes from the requests the old instances serve on the same cores; a nice loader gives them back,
# but under saturation it is starved and the reload that would add capacity comes late. Measured on
# 2 cores (encoder, 2x1): at nice 10 one reload in 12 s of closed loop cost 11-12% of the requests
# instead of 23-33% (`benchmarks/live.py reload`), but under a Locust step load on the same
# cores each reload took 35-40 s instead of 6-9 s, and the live re-planner served the old config
# for three steps (docs/operations.md). So it is opt-in: for reloads that add no capacity.
NICENESS_VARIABLE = "TIDEPOOL_LOADING_NICENESS"


def loading_niceness() -> int:
    value = os.environ.get(NICENESS_VARIABLE, "").strip() or "0"
    if not value.isdigit() or int(value) > 19:
        raise ConfigError(f"{NICENESS_VARIABLE} must be a whole number 0-19, got {value!r}")
    return int(value)


Loaded = TypeVar("Loaded")


def at_lower_priority(load: Callable[[], Loaded], niceness: int) -> Loaded:
    """`load()` run in a thread of its own whose nice value is `niceness` higher (at 0, simply
    `load()`). The calling thread, which goes on to serve, keeps its priority (raising it back
    would need privileges). Threads that `load` starts inherit the lower priority: OpenMP's workers
    for the warm-up passes end with the loading thread, and the serving thread starts its own."""
    if niceness == 0:
        return load()
    loaded: list[Loaded] = []
    failed: list[BaseException] = []

    def run() -> None:
        thread = threading.get_native_id()
        try:
            os.setpriority(os.PRIO_PROCESS, thread, os.getpriority(os.PRIO_PROCESS, thread) + niceness)
        except OSError:  # not Linux, or a seccomp profile that forbids it: load at full priority
            pass
        try:
            loaded.append(load())
        except BaseException as error:  # noqa: BLE001 - re-raised in the caller's thread
            failed.append(error)

    loader = threading.Thread(target=run, name="tidepool-load")
    loader.start()
    loader.join()
    if failed:
        raise failed[0]
    return loaded[0]


# What idle OpenMP threads of an elastic instance spin before they sleep (ELASTIC_SPIN_COUNT,
# default DEFAULT_SPIN_COUNT; libgomp's own default is ~300,000 rounds, milliseconds): long enough to
# stay awake between the operators of one forward pass, short enough to leave the cores before
# another instance takes the next request. Measured on 2 cores (encoder, 2 instances x up to 2
# threads, concurrency 1): default spin 0.67x one instance with 2 threads, 20,000 rounds 0.94-1.09x.
# Why (docs/planning.md): two processes taking turns at the default spin took 1.93x the pass of one
# process; at 20,000, 1.06x.


def oversubscribed(model: ModelSpec, cores: int) -> bool:
    """Whether the model's CPU instances could ask for more threads than there are cores, which is
    when elastic threads change anything (and ELASTIC_THREADS is true). A bad value of either
    parameter raises ConfigError, as the instance's load does."""
    if not param.ELASTIC_THREADS.read(model.parameters):
        return False
    threads = param.TORCH_NUM_THREADS.read(model.parameters) or cores
    return model.cpu_instances * min(threads, cores) > cores


def prepare_openmp(model_config: dict[str, Any]) -> str | None:
    """Before torch loads in a stub: bound how long idle OpenMP threads spin where elastic threads
    share the cores (see ELASTIC_SPIN_COUNT). A value the user set is kept. Returns a note for the log."""
    try:
        model = parse_model_config(model_config)
        if not oversubscribed(model, usable_cores()):
            return None
        spin = param.ELASTIC_SPIN_COUNT.read(model.parameters)
    except ConfigError:
        return None  # loading the instance says what is wrong
    if SPIN_VARIABLE in os.environ:
        return f"{SPIN_VARIABLE}={os.environ[SPIN_VARIABLE]} as set"
    os.environ[SPIN_VARIABLE] = str(spin)
    return f"{SPIN_VARIABLE}={spin} (idle OpenMP threads leave the cores soon)"


def share_path(server_pid: int, directory: Path | None = None) -> Path:
    """The file of one server's instances. The name starts `tidepool_<pid>_`, like the launcher's
    other shared files, so `tidepool serve` removes it once that process is gone."""
    return (directory or shared_directory()) / f"tidepool_{server_pid}_cores"


@dataclass
class CoreShare:
    """This instance's slot among the instances of one server."""

    table: SlotTable
    slot: int
    cores: int
    cap: int  # TORCH_NUM_THREADS: never more threads than this
    hold_ns: int  # the least time this instance counts as busy after a forward pass
    last_wait_ns: int = field(default=0, init=False)  # how long the last start waited for a core
    _last_stop_ns: int = field(default=0, init=False)
    _gap_ns: float = field(default=float(GAP_CAP_NS), init=False)  # moving mean of gaps between passes
    _overlap: float = field(default=0.0, init=False)  # moving share of passes that overlapped another's
    _started_with_others: bool = field(default=False, init=False)
    _reclaimed_ns: int = field(default=0, init=False)  # when dead owners' slots were last cleared

    def __post_init__(self) -> None:
        # Views of the shared rows for the hot path (read and written without the lock: each
        # instance writes its own row only).
        self._busy_until: np.ndarray[Any, Any] = self.table.rows["busy_until"]
        self._threads: np.ndarray[Any, Any] = self.table.rows["threads"]

    @property
    def path(self) -> Path:
        return self.table.path

    @classmethod
    def join(
        cls,
        cores: int,
        cap: int,
        hold_us: int = DEFAULT_HOLD_US,
        server_pid: int | None = None,
        directory: Path | None = None,
    ) -> CoreShare:
        """Take a free slot (dead owners' slots are free). `server_pid` defaults to the parent
        process: a Triton Python stub is a child of tritonserver."""
        path = share_path(server_pid if server_pid is not None else os.getppid(), directory)
        table = SlotTable.open(path, NO_HEADER, ROW, SLOTS)
        with table.locked():
            slot = table.take()
        if slot is None:
            table.close()
            raise RuntimeError(f"more than {SLOTS} instances share {path}")
        return cls(table, slot, cores, cap, hold_us * 1000)

    def busy_instances(self) -> int:
        return int(np.count_nonzero(self._busy_until > time.monotonic_ns()))

    def start(self) -> int:
        """Mark this instance busy; the torch threads it should run its forward pass with: its
        share of the cores among the busy instances, no more than the others leave free. Before it
        waits for a core it clears the slots of instances that died (a killed stub's BUSY slot
        would otherwise keep its cores)."""
        now = time.monotonic_ns()
        if self._last_stop_ns:
            self._gap_ns = 0.5 * self._gap_ns + 0.5 * min(now - self._last_stop_ns, GAP_CAP_NS)
        self._busy_until[self.slot] = BUSY
        if now - self._reclaimed_ns >= RECLAIM_EVERY_NS:
            self._reclaim_dead(now)
        self._started_with_others = self._others_computing()
        give_up = time.monotonic() + MAX_WAIT_S
        self.last_wait_ns = 0
        while True:
            share = max(1, min(self.cap, self.cores // max(1, self.busy_instances())))
            free = self.cores - int(self._threads.sum())
            if free >= 1 or time.monotonic() >= give_up:
                threads = max(1, min(share, free))
                self._threads[self.slot] = threads
                return threads
            if self._reclaimed_ns != now:  # once per pass, before it first waits
                self._reclaim_dead(now)
                continue
            time.sleep(POLL_S)
            self.last_wait_ns = time.monotonic_ns() - now

    def _reclaim_dead(self, now: int) -> None:
        with self.table.locked():  # the table clears dead owners' rows as it is taken
            self._reclaimed_ns = now

    def stop(self) -> None:
        self._threads[self.slot] = 0
        overlapped = self._started_with_others or self._others_computing()
        self._overlap += OVERLAP_WEIGHT * (float(overlapped) - self._overlap)
        self._last_stop_ns = time.monotonic_ns()
        self._busy_until[self.slot] = self._last_stop_ns + self.current_hold_ns()

    def _others_computing(self) -> bool:
        """Whether another instance is in a forward pass or waiting to start one now."""
        computing = int(np.count_nonzero(self._busy_until == BUSY))
        return computing > int(self._busy_until[self.slot] == BUSY)

    def current_hold_ns(self) -> int:
        """How long this instance counts as busy after the pass that just ended (see the hold)."""
        if self._overlap < LOADED_OVERLAP:
            return 0  # no load: the next request, whichever instance takes it, runs alone
        if self._gap_ns < BACK_TO_BACK_NS:
            return max(self.hold_ns, int(2 * self._gap_ns))
        return self.hold_ns

    def leave(self) -> None:
        """Free the slot; the last instance to leave removes the file."""
        if self.table.closed:
            return
        with self.table.locked():
            self.table.give_up(self.slot)
        del self._busy_until, self._threads  # numpy views pin the mapping until they go
        self.table.close()
