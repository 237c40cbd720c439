"""Where Tidepool's server time goes next to Triton's plain Python backend: on one server, in turn,
the model as committed, the same with an eager graph, the same as a fixed split of the cores with
the pool on and off, and the plain backend at that split with no delay and with its usual 2 ms;
per variant Triton's own split of each request's time (compute input / infer / output) and the
batch it ran in, so a cost of Tidepool's per execution shows as compute time at equal batch sizes.

    .venv/bin/python -m benchmarks.overhead_at_load --model encoder [--levels 1,8] [--rounds 4]
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
from benchmarks.plan_vs_grid import PLAIN_DELAY_US, plain_model
from tidepool.machine import usable_cores
from tidepool.testing import MODEL_REPOSITORY


def variants(source: Path, repository: Path, cores: int) -> dict[str, Variant]:
    """label -> variant: the committed model, Tidepool at `cores` x 1 thread (pool on, off), and
    the plain backend at `cores` x 1 thread (no delay, and the acceptance's 2 ms)."""
    split = f"{cores}x1"

    def fixed(name: str, **parameters: str) -> Variant:
        return copy_variant(
            source, repository, name, 0, cores, TORCH_NUM_THREADS="1", ELASTIC_THREADS="false", **parameters
        )

    served = {
        "committed": copy_variant(source, repository, "committed"),
        "committed, eager graph": copy_variant(source, repository, "eager", GRAPH="eager"),
        f"tidepool {split}": fixed("fixed"),
        f"tidepool {split}, pool off": fixed("fixed_nopool", POOL="off"),
    }
    for delay_us in (0, PLAIN_DELAY_US):
        name = f"plain{split}_d{delay_us}"
        plain_model(repository / name, repository / "committed", cores, 1, delay_us)
        served[f"plain {split}, delay {delay_us / 1000:g} ms"] = Variant(name)
    return served


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_in_turn_arguments(parser)
    parser.set_defaults(levels="1,8", rounds=4)
    args = parser.parse_args()
    cores = usable_cores()
    levels, served, results = serve_copies(
        args, lambda repository: variants(MODEL_REPOSITORY / args.model, repository, cores)
    )
    labels = list(served)
    print(f"\n{args.model} on {cores} cores: infer/s median (min-max) of {args.rounds} rounds, against the "
          "last variant; medians of the batch run and Triton's compute input / infer / output us per "
          "request")  # fmt: skip
    for level in levels:
        print(f"\n  c={level}")
        base = median_of(results[labels[-1]][level], "throughput")
        for label in labels:
            runs = results[label][level]
            ratio = median_of(runs, "throughput") / base
            split = "  ".join(
                f"{name} {median_of(runs, field):{width}}"
                for name, field, width in (
                    ("batch", "avg_batch", "4.2f"),
                    ("in", "compute_input_us", "5.0f"),
                    ("infer", "compute_infer_us", "6.0f"),
                    ("out", "compute_output_us", "5.0f"),
                )
            )
            print(f"  {label:>28} {spread(throughputs(runs)):>22} {ratio:5.2f}  {split}")


if __name__ == "__main__":
    main()
