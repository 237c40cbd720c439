"""Elastic threads with Triton's rate limiter preferring one instance: does a lone client then stay
on one instance, as on one instance with every core? On one server started with
`--rate-limit=execution_count`, in turn: one instance with every core (1xC), C elastic instances
(up to C threads each), and the same C instances as C groups of one with rate-limiter priorities
1, 100, 200, ... (the lower, the more scheduling chances: an idle first instance takes a lone
request). No queue delay; levels in turn across the variants, --rounds rounds.

    .venv/bin/python -m benchmarks.instance_priority --model encoder [--levels 1,2,4,8,16] [--rounds 3]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
from pathlib import Path

from benchmarks.in_turn import add_in_turn_arguments, serve_in_turn, spread, throughputs
from tidepool.configfile import copy_model, read_config, with_parameters
from tidepool.machine import usable_cores
from tidepool.spec import positive_ints
from tidepool.testing import MODEL_REPOSITORY

LOW_PRIORITY_STEP = 100  # priorities 1, 100, 200: each later instance gets far fewer chances


def variants(source: Path, repository: Path, cores: int) -> dict[str, str]:
    """label -> model name, each a copy of `source` with no queue delay."""
    shapes = {
        f"1x{cores}": (1, "false", False),
        f"{cores}x(1-{cores}) elastic": (cores, "true", False),
        f"{cores}x(1-{cores}) elastic, priorities": (cores, "true", True),
    }
    names = {}
    for index, (label, (instances, elastic, prioritized)) in enumerate(shapes.items()):
        config = with_parameters(
            read_config(source / "config.pbtxt"), TORCH_NUM_THREADS=str(cores), ELASTIC_THREADS=elastic
        )
        config.name = f"v{index}"
        config.dynamic_batching.max_queue_delay_microseconds = 0
        group = config.instance_group[0]
        if prioritized:
            group.count = 1
            group.rate_limiter.priority = 1
            for rank in range(1, instances):
                later = config.instance_group.add()
                later.CopyFrom(group)
                later.rate_limiter.priority = rank * LOW_PRIORITY_STEP
        else:
            group.count = instances
        copy_model(source, repository / config.name, config)
        names[label] = config.name
    return names


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_in_turn_arguments(parser)
    args = parser.parse_args()
    levels = positive_ints(args.levels, "--levels")
    cores = usable_cores()
    with tempfile.TemporaryDirectory() as tmp:
        repository = Path(tmp)
        names = variants(MODEL_REPOSITORY / args.model, repository, cores)
        rate_limited = ["--rate-limit=execution_count"]
        results = serve_in_turn(repository, names, levels, args.rounds, args.window_s, rate_limited)
    labels = list(names)
    print(f"\n{args.model} on {cores} cores, --rate-limit=execution_count: infer/s, median (min-max) "
          f"of {args.rounds} rounds; median p99 ms; each variant against 1x{cores}")  # fmt: skip
    print(f"{'c':>4}" + "".join(f"{label:>40}" for label in labels) + "  ratios")
    for level in levels:
        medians = {label: statistics.median(throughputs(results[label][level])) for label in labels}
        cells = "".join(
            f"{spread(throughputs(results[label][level]))} p99 "
            f"{statistics.median(r.p99_ms for r in results[label][level]):.0f}".rjust(40)
            for label in labels
        )
        ratios = " ".join(f"{medians[label] / medians[labels[0]]:.3f}" for label in labels[1:])
        print(f"{level:>4}{cells}  {ratios}")


if __name__ == "__main__":
    main()
