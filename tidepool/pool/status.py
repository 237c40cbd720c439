"""`tidepool status`: the node ledgers of running servers as tables, read from the shared files."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from pathlib import Path

from tidepool.pool.errors import PoolError
from tidepool.pool.ledger import NodeLedger
from tidepool.processes import alive
from tidepool.spec import mib

COLUMNS = ("model", "instance", "pid", "floor MiB", "reserved MiB", "in use MiB")


def describe_ledgers(paths: Sequence[Path]) -> Iterator[str]:
    if not paths:
        yield "no node ledger: no server with tidepool models runs on this machine"
        return
    for path in paths:
        try:
            ledger = NodeLedger.open_existing(path)
        except (OSError, PoolError) as exc:
            yield f"{path}: {exc}"
            continue
        try:
            views = ledger.snapshot()
            state = "running" if alive(ledger.server_pid) else "gone"
            yield (
                f"server pid {ledger.server_pid} ({state}), tier {ledger.tier}: budget "
                f"{mib(ledger.budget)}, reserved {mib(ledger.reserved_total())}, "
                f"{ledger.trims} trim request(s), {ledger.denials} denial(s)"
            )
            rows = [
                (
                    v.model,
                    v.instance,
                    str(v.pid),
                    *(mib(size, unit=False) for size in (v.floor, v.reserved, v.in_use)),
                )
                for v in sorted(views, key=lambda v: (v.model, v.instance))
            ]
            widths = [max(len(text) for text in column) for column in zip(COLUMNS, *rows, strict=False)]
            for row in (COLUMNS, *rows):
                yield "  " + "  ".join(text.ljust(width) for text, width in zip(row, widths, strict=True))
        finally:
            ledger.close()
