"""Elastic threads: instances of one server share its cores through a small shared file. Tested
with several shares in one process and a clock the test moves."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from tidepool.processes import process_start
from tidepool.runtime import cores
from tidepool.runtime import settings as settings_module
from tidepool.runtime.cores import (
    BUSY,
    CoreShare,
    at_lower_priority,
    loading_niceness,
    oversubscribed,
    prepare_openmp,
)
from tidepool.runtime.settings import InstanceSettings, Placement
from tidepool.spec import ConfigError, parse_model_config

HOLD_NS = cores.DEFAULT_HOLD_US * 1000


@pytest.fixture
def clock(monkeypatch):
    now = [10**12]
    monkeypatch.setattr(cores.time, "monotonic_ns", lambda: now[0])
    return now


def join(tmp_path, cap=2, cores_=2, hold_us=cores.DEFAULT_HOLD_US) -> CoreShare:
    return CoreShare.join(cores_, cap, hold_us, server_pid=4242, directory=tmp_path)


def run_together(*shares: CoreShare) -> None:
    """One pass of each share, all at once: each counts as loaded afterwards (its pass overlapped)."""
    for share in shares:
        share.start()
    for share in shares:
        share.stop()


@pytest.fixture
def no_waiting(monkeypatch):
    monkeypatch.setattr(cores, "MAX_WAIT_S", 0.0)


def test_a_lone_client_served_in_turn_gets_every_core_on_each_instance(tmp_path, clock):
    """Without Triton's rate limiter a lone client's requests go to the instances in turn, each
    arriving a round trip after the last pass ended: no pass overlaps another, so none is held."""
    first, second = join(tmp_path), join(tmp_path)
    for _ in range(20):
        for share in (first, second):
            clock[0] += 500_000  # the round trip, well inside any hold
            assert share.start() == 2
            clock[0] += 5_000_000
            share.stop()
            assert share.current_hold_ns() == 0


def test_overlapping_passes_turn_the_hold_on_and_lone_ones_turn_it_off(tmp_path, clock, no_waiting):
    first, second = join(tmp_path), join(tmp_path)
    run_together(first, second)
    assert first.current_hold_ns() == second.current_hold_ns() == HOLD_NS
    for _ in range(4):  # a loaded instance may run a few passes alone: it stays held
        clock[0] += 30_000_000
        first.start()
        first.stop()
        assert first.current_hold_ns() == HOLD_NS
    clock[0] += 30_000_000
    first.start()
    first.stop()  # the fifth in a row: the load is gone
    assert first.current_hold_ns() == 0
    assert second.start() == 2  # at once after the other's pass


def test_an_instance_alone_takes_every_core_and_busy_ones_split_them(tmp_path, clock):
    first, second = join(tmp_path), join(tmp_path)
    assert (first.slot, second.slot) == (0, 1)
    assert first.start() == 2  # alone
    first.stop()
    clock[0] += HOLD_NS + 1
    assert second.start() == 2  # the other is idle: alone again
    assert first.start() == 1  # one core is left, and its share is one
    second.stop()
    first.stop()
    clock[0] += HOLD_NS - 1
    assert first.start() == 1  # the other may be taking its next batch: still counted
    first.stop()
    clock[0] += HOLD_NS + 1
    assert first.start() == 2  # now it is idle
    (tmp_path / "other").mkdir()
    alone = CoreShare.join(4, 3, server_pid=4242, directory=tmp_path / "other")
    assert alone.start() == 3  # never above TORCH_NUM_THREADS


def test_each_instance_counts_as_busy_for_its_own_hold(tmp_path, clock, no_waiting, monkeypatch):
    monkeypatch.setattr(cores, "BACK_TO_BACK_NS", 0)  # the gaps below are short: only the floor here
    slow, quick = join(tmp_path, hold_us=5000), join(tmp_path)  # ELASTIC_HOLD_US 5000 and default
    run_together(slow, quick)  # under load: holds apply
    clock[0] += 5_000_001
    assert slow.start() == 2
    slow.stop()
    clock[0] += 4_999_000
    assert quick.start() == 1  # the slow instance may still be fetching its next batch
    quick.stop()
    clock[0] += 2_000  # past the slow one's hold, within the quick one's
    assert slow.start() == 1
    slow.stop()
    clock[0] += HOLD_NS + 1
    assert quick.start() == 1  # slow is held for 5 ms after its last pass
    quick.stop()
    clock[0] += 5_000_000
    assert slow.start() == 2


def test_an_instance_taking_batches_back_to_back_is_held_for_twice_its_gap(tmp_path, clock):
    busy, other = join(tmp_path), join(tmp_path)
    run_together(busy, other)
    assert busy.current_hold_ns() == HOLD_NS  # no gap seen yet: the floor
    for _ in range(10):  # saturated: its next batch comes 3 ms after each pass, the other computes too
        busy.start()
        other._busy_until[other.slot] = BUSY  # the other computes too, as it looks from here
        clock[0] += 20_000_000
        busy.stop()
        other._busy_until[other.slot] = 0
        clock[0] += 3_000_000
    assert busy.current_hold_ns() == pytest.approx(6_000_000, rel=0.02)
    clock[0] += 2_000_000  # 5 ms after its last pass: still counted, so the other takes one core
    assert other.start() == 1
    other.stop()
    for _ in range(6):  # a lone client now: 30 ms and more between its passes
        clock[0] += 30_000_000
        busy.start()
        clock[0] += 20_000_000
        busy.stop()
    assert busy.current_hold_ns() == HOLD_NS
    clock[0] += HOLD_NS + 1
    assert other.start() == 2  # the next lone request gets every core


def test_a_pass_that_finds_every_core_taken_waits_for_them(tmp_path, clock, monkeypatch):
    monkeypatch.setattr(cores, "MAX_WAIT_S", 30.0)
    polling = threading.Event()
    real_sleep = time.sleep

    def poll(seconds: float) -> None:  # the wait's poll: proof that the start is waiting
        polling.set()
        real_sleep(seconds)

    monkeypatch.setattr(cores.time, "sleep", poll)
    first, second = join(tmp_path), join(tmp_path)
    assert first.start() == 2  # took both cores while alone
    with ThreadPoolExecutor(1) as pool:
        waiting = pool.submit(second.start)
        assert polling.wait(timeout=10)  # it started, found no core free, and polls
        assert not waiting.done()
        first.stop()
        assert waiting.result(timeout=5) == 1  # the first may come back within the hold: its share
    monkeypatch.setattr(cores, "MAX_WAIT_S", 0.0)
    assert first.start() == 1  # nothing free and no time to wait: one thread anyway


def test_more_instances_than_cores_run_one_thread_each(tmp_path, clock, monkeypatch):
    monkeypatch.setattr(cores, "MAX_WAIT_S", 0.0)
    shares = [join(tmp_path, cap=4, cores_=4) for _ in range(6)]
    assert [share.start() for share in shares] == [4, 1, 1, 1, 1, 1]
    for share in shares:
        share.stop()
    assert [share.start() for share in shares] == [1] * 6  # all counted busy (the hold): one each


def dead_owner(share: CoreShare, slot: int, threads: int, zombie: bool = False) -> subprocess.Popen:
    """Slot `slot` of the table, owned by a process that died in the middle of a forward pass
    (a zombie: killed, and not reaped by its parent yet)."""
    owner = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    rows = share.table.rows
    rows["pid"][slot], rows["start"][slot] = owner.pid, process_start(owner.pid)
    rows["busy_until"][slot], rows["threads"][slot] = BUSY, threads
    owner.kill()
    if not zombie:
        owner.wait()
    else:
        deadline = time.monotonic() + 10
        while process_start(owner.pid) is not None and time.monotonic() < deadline:
            time.sleep(0.01)
    return owner


@pytest.mark.parametrize("zombie", [False, True])
def test_a_dead_owners_cores_come_back_without_a_wait(tmp_path, clock, zombie):
    first = join(tmp_path)
    owner = dead_owner(first, 1, threads=2, zombie=zombie)  # it held every core
    assert first.start() == 2 and first.last_wait_ns == 0  # cleared before it would have waited
    assert first.table.rows["pid"][1] == 0
    first.stop()
    owner.wait()
    second = join(tmp_path)
    assert second.slot == 1


def test_a_dead_owner_holding_some_cores_gives_them_back_within_the_reclaim_interval(tmp_path, clock):
    first = join(tmp_path)
    first.start()
    first.stop()
    dead_owner(first, 1, threads=1)
    clock[0] += HOLD_NS + 1
    assert first.start() == 1  # the dead slot still counts until the next reclaim
    first.stop()
    clock[0] += cores.RECLAIM_EVERY_NS
    assert first.start() == 2


def test_the_last_instance_to_leave_removes_the_file(tmp_path):
    first, second = join(tmp_path), join(tmp_path)
    first.leave()
    assert second.path.exists()
    second.leave()
    assert not second.path.exists()
    third = join(tmp_path)
    third.path.unlink()  # a cleanup removed it: leaving must not fail
    third.leave()
    second.leave()  # twice is harmless


def config(count: int, threads: str | None, elastic: str | None = "true", kind: str = "KIND_CPU") -> dict:
    parameters: dict = {}
    if threads is not None:
        parameters["TORCH_NUM_THREADS"] = {"string_value": threads}
    if elastic is not None:
        parameters["ELASTIC_THREADS"] = {"string_value": elastic}
    return {
        "input": [{"name": "X", "data_type": "TYPE_FP32", "dims": [1]}],
        "output": [{"name": "Y", "data_type": "TYPE_FP32", "dims": [1]}],
        "instance_group": [{"count": count, "kind": kind}],
        "parameters": parameters,
    }


def test_only_instances_that_ask_for_more_than_the_cores_are_elastic(monkeypatch):
    def elastic(*args, **kwargs) -> bool:
        return oversubscribed(parse_model_config(config(*args, **kwargs)), cores=2)

    assert elastic(2, "2")
    assert elastic(2, None)  # threads default to every core
    assert not elastic(2, "1")
    assert not elastic(1, "8")
    assert not elastic(2, "2", elastic="false")
    assert not elastic(2, "2", elastic=None)  # off unless asked
    assert not elastic(2, "2", kind="KIND_GPU")
    with pytest.raises(ConfigError, match="TORCH_NUM_THREADS: expected an integer, got 'two'"):
        elastic(2, "two")  # as the load refuses it
    monkeypatch.setattr(settings_module, "usable_cores", lambda: 2)
    spec = parse_model_config(config(2, "2"))
    assert InstanceSettings.from_spec(spec, Placement("CPU"), lambda: False).elastic_threads
    assert not InstanceSettings.from_spec(spec, Placement("GPU"), lambda: True).elastic_threads
    assert InstanceSettings.from_spec(spec, Placement("CPU"), lambda: False).elastic_hold_us == 1000
    held = config(2, "2")
    held["parameters"]["ELASTIC_HOLD_US"] = {"string_value": "3000"}
    assert InstanceSettings.from_spec(parse_model_config(held), Placement("CPU")).elastic_hold_us == 3000
    held["parameters"]["ELASTIC_HOLD_US"] = {"string_value": "3ms"}
    with pytest.raises(ConfigError, match="ELASTIC_HOLD_US: expected an integer, got '3ms'"):
        InstanceSettings.from_spec(parse_model_config(held), Placement("CPU"))


def test_openmp_spinning_is_bounded_for_elastic_instances_unless_the_user_chose(monkeypatch):
    monkeypatch.setattr(cores, "usable_cores", lambda: 2)
    monkeypatch.delenv(cores.SPIN_VARIABLE, raising=False)
    assert prepare_openmp(config(2, "1")) is None
    assert cores.SPIN_VARIABLE not in cores.os.environ
    assert "GOMP_SPINCOUNT=20000" in (prepare_openmp(config(2, "2")) or "")
    assert cores.os.environ[cores.SPIN_VARIABLE] == "20000"
    monkeypatch.delenv(cores.SPIN_VARIABLE)
    chosen = config(2, "2")
    chosen["parameters"]["ELASTIC_SPIN_COUNT"] = {"string_value": "150000"}
    assert "GOMP_SPINCOUNT=150000" in (prepare_openmp(chosen) or "")
    assert cores.os.environ[cores.SPIN_VARIABLE] == "150000"
    monkeypatch.setenv(cores.SPIN_VARIABLE, "5")
    assert prepare_openmp(chosen) == "GOMP_SPINCOUNT=5 as set"


def niceness() -> int:
    return os.getpriority(os.PRIO_PROCESS, threading.get_native_id())


def test_an_instance_loads_at_a_lower_priority_and_serves_at_its_own():
    before = niceness()
    assert at_lower_priority(niceness, niceness=3) == min(19, before + 3)
    assert niceness() == before  # the thread that goes on to serve
    with pytest.raises(ValueError, match="bad model"):
        at_lower_priority(lambda: (_ for _ in ()).throw(ValueError("bad model")), niceness=3)


def test_loading_priority_is_full_unless_asked_and_a_bad_value_is_refused(monkeypatch):
    monkeypatch.delenv(cores.NICENESS_VARIABLE, raising=False)
    main = threading.get_native_id()
    assert at_lower_priority(threading.get_native_id, loading_niceness()) == main  # no thread of its own
    monkeypatch.setenv(cores.NICENESS_VARIABLE, "4")
    assert at_lower_priority(niceness, loading_niceness()) == min(19, niceness() + 4)
    for bad in ("fast", "-5", "20"):
        monkeypatch.setenv(cores.NICENESS_VARIABLE, bad)
        with pytest.raises(ConfigError, match="TIDEPOOL_LOADING_NICENESS must be a whole number 0-19"):
            at_lower_priority(niceness, loading_niceness())
