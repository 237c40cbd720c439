"""`tidepool status`: the node memory budget of each running server, from the shared ledgers."""

from __future__ import annotations

import argparse
from typing import Any


def add(commands: Any) -> None:
    status = commands.add_parser(
        "status",
        help="the node memory budget: what each model's pool holds, read from the servers' shared ledgers",
        description="Print each running server's node ledger per tier (budget, reserved, trims, "
        "denials) and a line per pool: model, instance, pid, floor, reserved, in use. Reads the "
        "shared files directly: no server call.",
    )
    status.add_argument("--server-pid", type=int, help="only this tritonserver's ledgers")
    status.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from tidepool.pool.ledger import ledger_paths
    from tidepool.pool.status import describe_ledgers

    for line in describe_ledgers(ledger_paths(server_pid=args.server_pid)):
        print(line)
    return 0
