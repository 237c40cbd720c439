"""The node budget's CUDA tier on a real GPU: two device pools share one `cuda:0` ledger, the idle
one trims what it lends (the driver gets it back: its cuMemPool's reserved memory drops) and the
other borrows it. Marked `gpu`; skipped with the reason where no CUDA device is present."""

import pytest

from tidepool.pool import MemoryPool, housekeeping
from tidepool.pool.budget import TierBudget
from tidepool.pool.ledger import NodeLedger

pytestmark = pytest.mark.gpu
MiB = 2**20


def test_device_pools_lend_and_borrow_through_the_ledger(tmp_path):
    ledger = NodeLedger.attach("cuda:0", 4_000_000, tmp_path, TierBudget("cuda:0", 96 * MiB, "test"))
    lender = MemoryPool("cuda", budget=ledger.join("m", "lender", 0), arena_bytes=64 * MiB)
    borrower = MemoryPool("cuda", budget=ledger.join("m", "borrower", 0), arena_bytes=64 * MiB)
    with lender.execution():
        lender.allocate(48 * MiB)
    assert lender.resource.upstream.attribute("RESERVED_MEM_CURRENT") >= 64 * MiB
    housekeeping.watch(lender.answer_trim)
    try:
        with borrower.execution():
            borrower.allocate(48 * MiB)  # 64 + 64 > 96: only after the lender trims
    finally:
        housekeeping.unwatch(lender.answer_trim)
    assert lender.stats().reserved_bytes == 0
    assert lender.resource.upstream.attribute("RESERVED_MEM_CURRENT") == 0
    assert ledger.reserved_total() <= ledger.budget
    borrower.close()
    lender.close()
    assert not ledger.path.exists()
