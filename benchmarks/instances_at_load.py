"""Would another number of instances serve more? On one server, in turn: the model as committed in
model_repository/ (an elastic pair on 2 cores), the same config with more instances (groups of one
with rate-limiter priorities, threads shared among the busy ones, so an instance whose batch is
ready waits for a core instead of the core waiting for its batch), and one instance with every
core and a queue delay (which pairs the requests of two clients into one batch).

    .venv/bin/python -m benchmarks.instances_at_load --model encoder [--instances 3,4]
        [--one-instance-delays-ms 1] [--levels 1,2,8,16]
"""

from __future__ import annotations

import argparse
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
from tidepool.configfile import read_config
from tidepool.machine import usable_cores
from tidepool.spec import positive_ints
from tidepool.testing import MODEL_REPOSITORY


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_in_turn_arguments(parser)
    parser.add_argument("--instances", default="3,4", help="instance counts to try beside the committed")
    parser.add_argument("--one-instance-delays-ms", default="1", help="delays of the one-instance variants")
    parser.set_defaults(levels="1,2,8,16", rounds=3)
    args = parser.parse_args()
    source = MODEL_REPOSITORY / args.model
    committed = sum(group.count for group in read_config(source / "config.pbtxt").instance_group)

    def build(repository: Path) -> dict[str, Variant]:
        variants = {f"committed, {committed} instances": copy_variant(source, repository, "committed")}
        for count in positive_ints(args.instances, "--instances"):
            variants[f"{count} instances"] = copy_variant(
                source, repository, f"i{count}", instances=count, prefer_first=True
            )
        for delay_ms in (float(text) for text in args.one_instance_delays_ms.split(",") if text):
            variants[f"1 instance, delay {delay_ms:g} ms"] = copy_variant(
                source, repository, f"one_d{round(delay_ms * 1000)}", round(delay_ms * 1000), 1,
                TORCH_NUM_THREADS=str(usable_cores()), ELASTIC_THREADS="false",
            )  # fmt: skip
        return variants

    levels, variants, results = serve_copies(args, build)
    labels = list(variants)
    print(f"\n{args.model}: infer/s median (min-max) of {args.rounds} rounds, against the committed; "
          "median p99 ms and batch")  # fmt: skip
    for level in levels:
        base = median_of(results[labels[0]][level], "throughput")
        for label in labels:
            runs = results[label][level]
            ratio = median_of(runs, "throughput") / base
            row = f"{spread(throughputs(runs)):>22} {ratio:5.2f}  {p99_and_batch(runs)}"
            print(f"  c={level:<3} {label:>26} {row}")


if __name__ == "__main__":
    main()
