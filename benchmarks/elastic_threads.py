"""Elastic threads against the two fixed splits of the cores, on one real server in one run: one
instance with every core (1xC), one instance per core (Cx1), and C instances that share the cores
among those busy (ELASTIC_THREADS, up to C threads each; one such variant per ELASTIC_HOLD_US of
--holds-us). Every variant has the model's max_batch_size and no queue delay; levels are taken in
turn across variants, --rounds rounds.

    .venv/bin/python -m benchmarks.elastic_threads --model encoder [--levels 1,2,4,8,16]
        [--rounds 3] [--window-s 2] [--holds-us 1000,3000]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
from pathlib import Path

from benchmarks.in_turn import (
    Variant,
    add_in_turn_arguments,
    copy_variant,
    serve_in_turn,
    spread,
    throughputs,
)
from tidepool.machine import usable_cores
from tidepool.runtime.cores import DEFAULT_HOLD_US
from tidepool.spec import positive_ints
from tidepool.testing import MODEL_REPOSITORY


def variants(source: Path, repository: Path, cores: int, holds_us: list[int]) -> dict[str, Variant]:
    """label -> variant, each a copy of `source` with its split of the cores and no queue delay."""
    splits = {
        f"1x{cores} fixed": (1, cores, "false", DEFAULT_HOLD_US),
        f"{cores}x1 fixed": (cores, 1, "false", DEFAULT_HOLD_US),
        **{f"{cores}x(1-{cores}) elastic {hold}us": (cores, cores, "true", hold) for hold in holds_us},
    }
    return {
        label: copy_variant(
            source,
            repository,
            f"v{index}",
            delay_us=0,
            instances=instances,
            TORCH_NUM_THREADS=str(threads),
            ELASTIC_THREADS=elastic,
            ELASTIC_HOLD_US=str(hold),
        )
        for index, (label, (instances, threads, elastic, hold)) in enumerate(splits.items())
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_in_turn_arguments(parser)
    parser.add_argument(
        "--holds-us", default=str(DEFAULT_HOLD_US), help="ELASTIC_HOLD_US of each elastic variant"
    )
    args = parser.parse_args()
    levels = positive_ints(args.levels, "--levels")
    cores = usable_cores()
    with tempfile.TemporaryDirectory() as tmp:
        repository = Path(tmp)
        names = variants(
            MODEL_REPOSITORY / args.model, repository, cores, positive_ints(args.holds_us, "--holds-us")
        )
        results = serve_in_turn(repository, names, levels, args.rounds, args.window_s)
    figures = {label: {c: throughputs(r) for c, r in runs.items()} for label, runs in results.items()}
    p99 = {label: {c: [x.p99_ms for x in r] for c, r in runs.items()} for label, runs in results.items()}
    elastic = [label for label in names if "elastic" in label]
    fixed = [label for label in names if label not in elastic]
    print(f"\n{args.model} on {cores} cores: infer/s, median (min-max) of {args.rounds} rounds; median p99")
    print(f"{'c':>4}" + "".join(f"{label:>34}" for label in names) + "  elastic/best fixed")
    for level in levels:
        cells = "".join(
            f"{spread(figures[label][level]) + f' p99 {statistics.median(p99[label][level]):.0f}':>34}"
            for label in names
        )
        best_fixed = max(statistics.median(figures[label][level]) for label in fixed)
        ratios = " ".join(f"{statistics.median(figures[label][level]) / best_fixed:.3f}" for label in elastic)
        print(f"{level:>4}{cells}  {ratios}")


if __name__ == "__main__":
    main()
