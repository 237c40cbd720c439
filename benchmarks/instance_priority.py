"""Elastic threads with Triton's rate limiter preferring one instance: does a lone client then stay
on one instance, as on one instance with every core, and what does the rate limiter cost the
configs that set no priorities? Two servers over one repository, one plain and one started with
`--rate-limit=execution_count`; in turn: one instance with every core (1xC) and C elastic instances
(up to C threads each) on both, and on the rate-limited one also the same C instances as C groups
of one with rate-limiter priorities 1, 1000, ... (tidepool.configfile.set_instances: an idle first
instance takes a lone request). No queue delay; levels in turn, --rounds rounds.

    .venv/bin/python -m benchmarks.instance_priority --model encoder [--levels 1,2,4,8,16] [--rounds 3]
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
from tidepool.spec import positive_ints
from tidepool.testing import MODEL_REPOSITORY


def variants(source: Path, repository: Path, cores: int) -> dict[str, Variant]:
    """label -> variant, each a copy of `source` with no queue delay."""
    shapes = {"fixed": (1, "false", False), "elastic": (cores, "true", False), "prio": (cores, "true", True)}
    models = {
        shape: copy_variant(
            source,
            repository,
            f"v{index}",
            delay_us=0,
            instances=instances,
            prefer_first=prioritized,
            TORCH_NUM_THREADS=str(cores),
            ELASTIC_THREADS=elastic,
        ).model
        for index, (shape, (instances, elastic, prioritized)) in enumerate(shapes.items())
    }
    elastic = f"{cores}x(1-{cores}) elastic"
    return {
        f"1x{cores}": Variant(models["fixed"], rate_limit="off"),
        elastic: Variant(models["elastic"], rate_limit="off"),
        f"1x{cores}, rate-limited": Variant(models["fixed"], rate_limit="execution_count"),
        f"{elastic}, rate-limited": Variant(models["elastic"], rate_limit="execution_count"),
        f"{elastic}, priorities, rate-limited": Variant(models["prio"], rate_limit="execution_count"),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_in_turn_arguments(parser)
    args = parser.parse_args()
    levels = positive_ints(args.levels, "--levels")
    cores = usable_cores()
    with tempfile.TemporaryDirectory() as tmp:
        repository = Path(tmp)
        served = variants(MODEL_REPOSITORY / args.model, repository, cores)
        results = serve_in_turn(repository, served, levels, args.rounds, args.window_s)
    labels = list(served)
    print(f"\n{args.model} on {cores} cores: infer/s, median (min-max) of {args.rounds} rounds; median "
          "p99 ms and server compute us per request; each variant's median against the first")  # fmt: skip
    for label in labels:
        print(f"\n  {label}")
        for level in levels:
            runs, first = results[label][level], results[labels[0]][level]
            ratio = statistics.median(throughputs(runs)) / statistics.median(throughputs(first))
            p99 = statistics.median(r.p99_ms for r in runs)
            compute = statistics.median(r.compute_infer_us for r in runs)
            figures = f"{spread(throughputs(runs)):>22}  p99 {p99:5.0f}  compute {compute:6.0f}"
            print(f"  c={level:<3} {figures}  {ratio:.3f}")


if __name__ == "__main__":
    main()
