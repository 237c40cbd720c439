"""Re-measure the committed config against chosen grid points on one server, in turn, with more
rounds than the grid gives each point (the grid's best at a level is the best of one noisy window).
A point is INSTANCESxTHREADS:bMAX_BATCH:dDELAY_MS, a fixed split (no elastic threads, no
priorities) of the committed config, e.g. 2x1:b4:d2.

    .venv/bin/python -m benchmarks.grid_points_at_load --model convnet --points 2x1:b4:d2,2x1:b8:d0
        [--levels 8,16] [--rounds 3]
"""

from __future__ import annotations

import argparse
import re
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
from tidepool.configfile import copy_model, read_config, set_instances, with_parameters
from tidepool.spec import positive_ints
from tidepool.testing import MODEL_REPOSITORY

POINT = re.compile(r"^(\d+)x(\d+):b(\d+):d([\d.]+)$")


def grid_point(source: Path, repository: Path, text: str) -> Variant:
    """The committed config at the grid point `text` (see the module doc), in `repository`."""
    match = POINT.match(text)
    if match is None:
        raise SystemExit(f"--points: expected INSTANCESxTHREADS:bMAX_BATCH:dDELAY_MS, got {text!r}")
    instances, threads, batch, delay_ms = match.groups()
    config = with_parameters(
        read_config(source / "config.pbtxt"), TORCH_NUM_THREADS=threads, ELASTIC_THREADS="false"
    )
    config.max_batch_size = int(batch)
    config.dynamic_batching.max_queue_delay_microseconds = round(float(delay_ms) * 1000)
    set_instances(config, int(instances))
    name = "p_" + re.sub(r"\W", "_", text)
    copy_model(source, repository / name, config)
    return Variant(name)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_in_turn_arguments(parser)
    parser.add_argument("--points", required=True, help="comma-separated grid points, e.g. 2x1:b4:d2")
    parser.set_defaults(levels="8,16", rounds=3)
    args = parser.parse_args()
    levels = positive_ints(args.levels, "--levels")
    source = MODEL_REPOSITORY / args.model
    with tempfile.TemporaryDirectory() as tmp:
        repository = Path(tmp)
        variants = {"committed": copy_variant(source, repository, "committed")}
        variants |= {point: grid_point(source, repository, point) for point in args.points.split(",")}
        results = serve_in_turn(repository, variants, levels, args.rounds, args.window_s)
    print(f"\n{args.model}: infer/s median (min-max) of {args.rounds} rounds, committed against each; "
          "median p99 ms and batch")  # fmt: skip
    for level in levels:
        committed = statistics.median(throughputs(results["committed"][level]))
        for label in variants:
            runs = results[label][level]
            ratio = committed / statistics.median(throughputs(runs))
            p99 = statistics.median(r.p99_ms for r in runs)
            batch = statistics.median(r.avg_batch for r in runs)
            print(f"  c={level:<3} {label:>14} {spread(throughputs(runs)):>22}  committed/this {ratio:5.2f}  "
                  f"p99 {p99:5.0f}  batch {batch:4.2f}")  # fmt: skip


if __name__ == "__main__":
    main()
