"""Would the committed config serve more under load with a queue delay? On one server, in turn:
the model as committed in model_repository/, the same with a delay, and Triton's plain Python
backend at each split of the cores with that delay (benchmarks.plan_vs_grid's baseline); the
median batch each formed says whether the delay packed fuller batches, the throughput whether
that paid.

    .venv/bin/python -m benchmarks.delay_at_load --model encoder [--delay-ms 2] [--levels 1,8] [--rounds 4]
"""

from __future__ import annotations

import argparse
from pathlib import Path

from benchmarks.in_turn import (
    Variant,
    add_in_turn_arguments,
    copy_variant,
    median_of,
    serve_copies,
    spread,
    throughputs,
)
from benchmarks.plan_vs_grid import PLAIN_DELAY_US, baseline_dirs
from tidepool.machine import usable_cores
from tidepool.testing import MODEL_REPOSITORY


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_in_turn_arguments(parser)
    parser.add_argument("--delay-ms", type=float, default=PLAIN_DELAY_US / 1000)
    parser.set_defaults(levels="1,8", rounds=4)
    args = parser.parse_args()
    delay_us = round(args.delay_ms * 1000)
    source = MODEL_REPOSITORY / args.model

    def build(repository: Path) -> dict[str, Variant]:
        variants = {
            "committed": copy_variant(source, repository, "committed"),
            f"committed, delay {args.delay_ms:g} ms": copy_variant(source, repository, "delayed", delay_us),
        }
        _, plains = baseline_dirs(repository, repository / "committed", usable_cores(), delay_us)
        return variants | {
            f"plain {name.removeprefix('plain')}, delay {args.delay_ms:g} ms": Variant(name)
            for name in plains
        }

    levels, variants, results = serve_copies(args, build)
    print(f"\n{args.model}: infer/s, median (min-max) of {args.rounds} rounds; median batch formed")
    for label in variants:
        for level in levels:
            runs = results[label][level]
            batch = median_of(runs, "avg_batch")
            print(f"{label:>32} c={level:<3} {spread(throughputs(runs)):>22}  batch {batch:.2f}")


if __name__ == "__main__":
    main()
