"""The node ledger on fake memory: pools of several processes reserving from one budget, lending
what they hold above their floors, dead processes reclaimed, and budgets read as typed."""

from __future__ import annotations

import multiprocessing as mp
import os
import random
import signal
import threading
import time
from pathlib import Path

import pytest

from tidepool.pool import MemoryPool, OutOfMemory, PoolError, housekeeping
from tidepool.pool.budget import TierBudget, budget_for, cgroup_memory_limit, parse_budget, tier_of
from tidepool.pool.ledger import (
    BudgetDenied,
    BudgetError,
    NodeLedger,
    ledger_path,
    remove_dead_ledgers,
)
from tidepool.pool.resources import FakeResource

MiB = 2**20
SERVER = 4_000_000  # a pid no process has: the fake server whose ledger the tests share


def attach(directory: Path, budget_mib: int, server: int = SERVER) -> NodeLedger:
    return NodeLedger.attach("host", server, directory, TierBudget("host", budget_mib * MiB, "test"))


def budgeted_pool(ledger: NodeLedger, name: str, floor_mib: int = 0, arena_mib: int = 8) -> MemoryPool:
    entry = ledger.join("m", name, MemoryPool.initial_arena_bytes(floor_mib * MiB))
    return MemoryPool(
        resource=FakeResource(), budget=entry, initial_bytes=floor_mib * MiB, arena_bytes=arena_mib * MiB
    )


# -- budgets as typed --------------------------------------------------------------------------


def test_a_budget_names_tiers_with_units():
    assert parse_budget("host=2GiB, cuda:0=512MiB") == {"host": 2 * 2**30, "cuda:0": 512 * MiB}
    assert parse_budget("1GiB") == {"host": 2**30}  # a bare size is the host's


@pytest.mark.parametrize("text", ["gpu=1GiB", "host=lots", "host=0", ",", "cuda:x=1GiB"])
def test_a_bad_budget_says_what_is_wrong(text):
    with pytest.raises(PoolError, match="TIDEPOOL_MEMORY_BUDGET"):
        parse_budget(text)


def test_the_environment_sets_the_budget_else_the_machine_does(tmp_path):
    given = budget_for("host", {"TIDEPOOL_MEMORY_BUDGET": "host=3GiB"})
    assert given.nbytes == 3 * 2**30 and "TIDEPOOL_MEMORY_BUDGET" in given.why
    default = budget_for("host", {})
    assert 0 < default.nbytes and "default: 80%" in default.why
    device = budget_for("cuda:1", {"TIDEPOOL_MEMORY_BUDGET": "host=3GiB"}, device_total=lambda d: 10 * 2**30)
    assert device.nbytes == 8 * 2**30 and "cuda:1" in device.why


def test_a_containers_memory_limit_bounds_the_default(tmp_path):
    (tmp_path / "memory.max").write_text("2147483648\n")
    assert cgroup_memory_limit(tmp_path) == 2**31
    (tmp_path / "memory.max").write_text("max\n")
    assert cgroup_memory_limit(tmp_path) is None


def test_pinned_memory_counts_against_the_host():
    assert tier_of("pinned", 0) == tier_of("host", None) == "host"
    assert tier_of("cuda", 1) == "cuda:1"


# -- reserve, lend, borrow ---------------------------------------------------------------------


def test_an_idle_pool_lends_what_it_holds_above_its_floor(tmp_path):
    ledger = attach(tmp_path, budget_mib=24)
    first, second = budgeted_pool(ledger, "a", floor_mib=4), budgeted_pool(ledger, "b", floor_mib=4)
    with first.execution():
        first.allocate(10 * MiB)  # grows a 16 MiB arena: 20 MiB reserved by a, 24 in all
    assert ledger.reserved_total() == 24 * MiB
    housekeeping.watch(first.answer_trim)  # a's background check answers while b waits
    try:
        with second.execution():
            second.allocate(10 * MiB)
    finally:
        housekeeping.unwatch(first.answer_trim)
    figures = (first.stats(), second.stats(), ledger.snapshot(), ledger.trims)
    assert first.stats().reserved_bytes == 4 * MiB, figures  # its floor stays
    assert ledger.reserved_total() == 24 * MiB <= ledger.budget, figures
    assert first.stats().budget_trims == 1 and ledger.trims >= 1, figures


def test_a_busy_pool_answers_at_its_next_execution(tmp_path):
    ledger = attach(tmp_path, budget_mib=20)
    lender, borrower = budgeted_pool(ledger, "a"), budgeted_pool(ledger, "b")
    with lender.execution():
        lender.allocate(12 * MiB)
    done = threading.Event()

    def borrow():
        with borrower.execution():
            borrower.allocate(12 * MiB)
        done.set()

    thread = threading.Thread(target=borrow)
    thread.start()
    deadline = time.monotonic() + 2
    while not done.is_set() and time.monotonic() < deadline:
        lender.answer_trim()  # what the lender's housekeeping does as its execution ends
        time.sleep(0.01)
    thread.join()
    assert done.is_set() and lender.stats().reserved_bytes == 0


def test_a_request_larger_than_the_budget_fails_at_once_and_names_it(tmp_path):
    ledger = attach(tmp_path, budget_mib=16)
    pool, other = budgeted_pool(ledger, "a"), budgeted_pool(ledger, "b", floor_mib=4)
    began = time.monotonic()
    with pytest.raises(OutOfMemory) as raised, pool.execution():
        pool.allocate(40 * MiB)
    assert time.monotonic() - began < 0.5  # nobody lends that much: no waiting
    assert raised.value.node_budget
    message = str(raised.value)
    assert "node's host memory budget is 16.0 MiB" in message and "b (pid" in message
    assert ledger.denials >= 1 and pool.stats().budget_denials >= 1
    with pool.execution():
        pool.allocate(8 * MiB)  # the next request that fits is served
    assert ledger.reserved_total() <= ledger.budget
    other.close()


def test_a_pool_that_does_not_answer_is_waited_for_a_bounded_time(tmp_path):
    ledger = attach(tmp_path, budget_mib=16)
    silent, asking = budgeted_pool(ledger, "a"), budgeted_pool(ledger, "b")
    with silent.execution():
        silent.allocate(12 * MiB)
    began = time.monotonic()
    with pytest.raises(BudgetDenied, match="did not trim in 0.2 s"):
        asking.budget.reserve(8 * MiB, wait=0.2)
    assert 0.2 <= time.monotonic() - began < 1.0
    assert asking.budget.reserved == 0


def test_floors_are_never_trimmed(tmp_path):
    ledger = attach(tmp_path, budget_mib=64)
    pool = budgeted_pool(ledger, "a", floor_mib=8)
    with pool.execution():
        pool.allocate(20 * MiB)
    ledger._entries["trim_wanted"][pool.budget.slot] = 10**12  # asked for everything
    pool.answer_trim()
    assert pool.stats().reserved_bytes == pool.budget.floor == 8 * MiB
    assert pool.budget.trim_wanted() == 0


def test_a_budget_smaller_than_the_floors_is_refused_at_load(tmp_path):
    ledger = attach(tmp_path, budget_mib=16)
    budgeted_pool(ledger, "encoder_0", floor_mib=8)
    with pytest.raises(BudgetError) as raised:
        ledger.join("convnet", "convnet_0", 16 * MiB)
    message = str(raised.value)
    assert "16.0 MiB" in message and "floors" in message and "encoder_0" in message
    assert "TIDEPOOL_MEMORY_BUDGET" in message


def test_the_last_pool_out_removes_the_file(tmp_path):
    ledger = attach(tmp_path, budget_mib=16)
    pool = budgeted_pool(ledger, "a")
    assert ledger.path.exists()
    pool.close()
    assert not ledger.path.exists()


# -- several processes -------------------------------------------------------------------------


def reserve_and_release(directory: str, rounds: int, seed: int, errors: mp.Queue) -> None:
    ledger = attach(Path(directory), budget_mib=64)
    entry = ledger.join("m", f"proc{seed}", 0)
    generator = random.Random(seed)
    held = 0
    try:
        for _ in range(rounds):
            if held and generator.random() < 0.5:
                entry.release(held)
                held = 0
            else:
                size = generator.randint(1, 24) * MiB
                try:
                    entry.reserve(size, wait=0.0)
                    held += size
                except BudgetDenied:
                    pass
            total = sum(view.reserved for view in ledger.snapshot())  # under the ledger's lock
            if total > ledger.budget:
                errors.put(f"reserved {total} above {ledger.budget}")
        entry.release(held)
    finally:
        entry.leave()
        ledger.close()


def test_processes_reserving_at_once_never_pass_the_budget(tmp_path):
    context = mp.get_context("spawn")
    errors = context.Queue()
    keeper = attach(tmp_path, budget_mib=64)  # keeps the file while the children come and go
    work = [(str(tmp_path), 300, seed, errors) for seed in range(4)]
    children = [context.Process(target=reserve_and_release, args=args) for args in work]
    for child in children:
        child.start()
    for child in children:
        child.join(60)
        assert child.exitcode == 0
    assert errors.empty(), errors.get()
    assert keeper.reserved_total() == 0 and keeper.snapshot() == []


def hold_and_wait(directory: str, ready: mp.Event) -> None:
    ledger = attach(Path(directory), budget_mib=64)
    ledger.join("m", "doomed", 0).reserve(40 * MiB)
    ready.set()
    time.sleep(60)


def test_a_killed_process_bytes_come_back_at_the_next_reservation(tmp_path):
    context = mp.get_context("spawn")
    ready = context.Event()
    child = context.Process(target=hold_and_wait, args=(str(tmp_path), ready))
    child.start()
    assert ready.wait(30)
    ledger = attach(tmp_path, budget_mib=64)
    entry = ledger.join("m", "survivor", 0)
    assert ledger.reserved_total() == 40 * MiB
    os.kill(child.pid, signal.SIGKILL)
    child.join()
    began = time.monotonic()
    entry.reserve(50 * MiB)  # only fits once the dead process's 40 MiB are reclaimed
    assert time.monotonic() - began < 1.0
    assert [view.instance for view in ledger.snapshot()] == ["survivor"]
    assert ledger.reserved_total() == 50 * MiB


def test_a_reused_pid_does_not_keep_a_dead_entry(tmp_path):
    ledger = attach(tmp_path, budget_mib=64)
    entry = ledger.join("m", "old", 0)
    entry.reserve(10 * MiB)
    ledger._entries["start"][entry.slot] -= 1  # the same pid, started at another time
    assert ledger.snapshot() == [] and ledger.reserved_total() == 0


def test_ledgers_of_servers_that_are_gone_are_removed(tmp_path):
    gone = ledger_path(SERVER, "host", tmp_path)
    gone.write_bytes(b"")
    mine = ledger_path(os.getpid(), "host", tmp_path)
    mine.write_bytes(b"")
    assert remove_dead_ledgers(tmp_path) == [gone]
    assert mine.exists()


def test_a_pool_outside_a_budget_is_unchanged():
    pool = MemoryPool(resource=FakeResource())
    assert pool.answer_trim() == 0 and pool.stats().floor_bytes == 0
    assert pool.budget is None


def test_a_killed_process_its_parent_has_not_reaped_counts_as_gone():
    import subprocess

    from tidepool.processes import process_start

    child = subprocess.Popen(["sleep", "60"])
    assert process_start(child.pid) is not None
    os.kill(child.pid, signal.SIGKILL)
    deadline = time.monotonic() + 5
    while process_start(child.pid) is not None and time.monotonic() < deadline:
        time.sleep(0.01)  # a zombie until waited for, as a killed stub is until tritonserver reaps it
    assert process_start(child.pid) is None
    child.wait()
