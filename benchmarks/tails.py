"""Tails: the shipped config of each example model beside Triton's plain Python backend serving the
same model (same total torch threads, a 2 ms queue delay, each split of the cores), on one server
per rate-limit mode, levels taken in turn, --rounds rounds. Prints per level throughput, p50 and p99
of the shipped config under the rate limiter (`tidepool serve`) and without it (as plain
tritonserver serves it), and of the best plain Python backend there (by throughput), with the
ratios p99 shipped / p99 plain and throughput shipped / plain, and a lone request's p99 / p50.

    .venv/bin/python -m benchmarks.tails [--models encoder,convnet] [--levels 1,2,4,8,16] [--rounds 3]
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

from benchmarks.in_turn import Variant, add_in_turn_arguments, copy_variant, median_of, serve_in_turn, spread
from benchmarks.plan_vs_grid import PLAIN_DELAY_US, plain_model
from tidepool.machine import usable_cores
from tidepool.planning.candidates import thread_splits
from tidepool.spec import positive_ints
from tidepool.testing import MODEL_REPOSITORY

SHIPPED = {"serve": "execution_count", "plain": "off"}  # label -> the server's rate-limit mode


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_in_turn_arguments(parser, models=True)
    args = parser.parse_args()
    levels = positive_ints(args.levels, "--levels")
    cores = usable_cores()
    with tempfile.TemporaryDirectory() as tmp:
        repository = Path(tmp)
        variants: dict[str, Variant] = {}
        plains: dict[str, list[str]] = {}
        for model in args.models.split(","):
            source = MODEL_REPOSITORY / model
            for label, mode in SHIPPED.items():
                variants[f"{model} {label}"] = Variant(
                    copy_variant(source, repository, f"{model}_{label}").model, mode
                )
            plains[model] = []
            for threads in thread_splits(cores):
                name = f"{model}_plain{cores // threads}x{threads}"
                plain_model(repository / name, source, cores // threads, threads, PLAIN_DELAY_US)
                variants[name] = Variant(name, "off")
                plains[model].append(name)
        results = serve_in_turn(repository, variants, levels, args.rounds, args.window_s)
    for model, names in plains.items():
        print(f"\n{model}: median (min-max) of {args.rounds} rounds; plain = the plain Python backend's best "
              f"split there ({PLAIN_DELAY_US / 1000:g} ms delay)")  # fmt: skip
        print("| c | launcher | infer/s | p50 ms | p99 ms | plain infer/s | plain p50 | plain p99 "
              "| p99 / plain | infer/s / plain | p99 / p50 |")  # fmt: skip
        print("| --- " * 11 + "|")
        for level in levels:
            best = max(names, key=lambda name: median_of(results[name][level], "throughput"))
            plain = results[best][level]
            for label in SHIPPED:
                ours = results[f"{model} {label}"][level]
                rates, p99s = [r.throughput for r in ours], [r.p99_ms for r in ours]
                cells = [
                    str(level), label, spread(rates), f"{median_of(ours, 'p50_ms'):.1f}", spread(p99s),
                    f"{spread([r.throughput for r in plain])} {best.split('_')[-1]}",
                    f"{median_of(plain, 'p50_ms'):.1f}", spread([r.p99_ms for r in plain]),
                    f"{median_of(ours, 'p99_ms') / median_of(plain, 'p99_ms'):.2f}",
                    f"{median_of(ours, 'throughput') / median_of(plain, 'throughput'):.2f}",
                    f"{median_of(ours, 'p99_ms') / median_of(ours, 'p50_ms'):.2f}",
                ]  # fmt: skip
                print("| " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
