"""What the node budget costs a served model: the shipped config with NODE_BUDGET on (its pools
reserve from the server's shared ledger, answer trim requests, report in-use bytes after every
execution) against the same config with NODE_BUDGET off, on one server, levels in turn, --rounds
rounds. Prints infer/s and p99 per level and the ratio of medians on/off.

    .venv/bin/python -m benchmarks.node_budget [--model encoder] [--levels 1,2,4,8,16] [--rounds 3]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
from pathlib import Path

from benchmarks.in_turn import add_in_turn_arguments, copy_variant, serve_in_turn, spread, throughputs
from tidepool.spec import positive_ints
from tidepool.testing import MODEL_REPOSITORY


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_in_turn_arguments(parser)
    args = parser.parse_args()
    levels = positive_ints(args.levels, "--levels")
    with tempfile.TemporaryDirectory() as tmp:
        repository = Path(tmp)
        source = MODEL_REPOSITORY / args.model
        variants = {
            "budget on": copy_variant(source, repository, "budget_on", NODE_BUDGET="on"),
            "budget off": copy_variant(source, repository, "budget_off", NODE_BUDGET="off"),
        }
        results = serve_in_turn(repository, variants, levels, args.rounds, args.window_s)
    print(f"\n{args.model}: infer/s, median (min-max) of {args.rounds} rounds; median p99 ms")
    print(f"{'c':>4}{'budget on':>30}{'budget off':>30}  on/off")
    for level in levels:
        on, off = (throughputs(results[label][level]) for label in variants)
        p99 = [statistics.median(r.p99_ms for r in results[label][level]) for label in variants]
        print(
            f"{level:>4}{spread(on) + f' p99 {p99[0]:.1f}':>30}{spread(off) + f' p99 {p99[1]:.1f}':>30}"
            f"  {statistics.median(on) / statistics.median(off):.3f}"
        )


if __name__ == "__main__":
    main()
