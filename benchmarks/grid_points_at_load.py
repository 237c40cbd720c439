"""Re-measure the committed config against chosen grid points on one server, in turn, with more
rounds than the grid gives each point (the grid's best at a level is the best of one noisy window).
A point is INSTANCESxTHREADS:bMAX_BATCH:dDELAY_MS, built as the grid of benchmarks.plan_vs_grid
builds it (a fixed split; no elastic threads, priorities, preferred or pool sizes), e.g. 2x1:b4:d2.

    .venv/bin/python -m benchmarks.grid_points_at_load --model convnet --points 2x1:b4:d2,2x1:b8:d0
        [--levels 8,16] [--rounds 3]
"""

from __future__ import annotations

import argparse
import re
from pathlib import Path

from benchmarks.in_turn import (
    Variant,
    add_in_turn_arguments,
    copy_variant,
    median_of,
    p99_and_batch,
    serve_copies,
    spread,
    throughputs,
)
from benchmarks.plan_vs_grid import grid_point
from tidepool.configfile import copy_model, read_config
from tidepool.testing import MODEL_REPOSITORY

POINT = re.compile(r"^(\d+)x(\d+):b(\d+):d([\d.]+)$")


def grid_variant(source: Path, repository: Path, text: str) -> Variant:
    """The committed config as the grid measures the point `text` (see the module doc)."""
    match = POINT.match(text)
    if match is None:
        raise SystemExit(f"--points: expected INSTANCESxTHREADS:bMAX_BATCH:dDELAY_MS, got {text!r}")
    instances, threads, batch, delay_ms = match.groups()
    config = grid_point(
        read_config(source / "config.pbtxt"),
        int(instances),
        int(threads),
        int(batch),
        round(float(delay_ms) * 1000),
    )
    name = "p_" + re.sub(r"\W", "_", text)
    copy_model(source, repository / name, config)
    return Variant(name)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_in_turn_arguments(parser)
    parser.add_argument("--points", required=True, help="comma-separated grid points, e.g. 2x1:b4:d2")
    parser.set_defaults(levels="8,16", rounds=3)
    args = parser.parse_args()
    source = MODEL_REPOSITORY / args.model

    def build(repository: Path) -> dict[str, Variant]:
        variants = {"committed": copy_variant(source, repository, "committed")}
        return variants | {point: grid_variant(source, repository, point) for point in args.points.split(",")}

    levels, variants, results = serve_copies(args, build)
    print(f"\n{args.model}: infer/s median (min-max) of {args.rounds} rounds, committed against each; "
          "median p99 ms and batch")  # fmt: skip
    for level in levels:
        committed = median_of(results["committed"][level], "throughput")
        for label in variants:
            runs = results[label][level]
            ratio = committed / median_of(runs, "throughput")
            print(f"  c={level:<3} {label:>14} {spread(throughputs(runs)):>22}  committed/this {ratio:5.2f}  "
                  f"{p99_and_batch(runs)}")  # fmt: skip


if __name__ == "__main__":
    main()
