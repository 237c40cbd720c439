"""Tails: the shipped config of each example model beside Triton's plain Python backend serving the
same model (same total torch threads, a 2 ms queue delay, each split of the cores), on one server
per rate-limit mode, levels taken in turn, --rounds rounds. Prints per level throughput, p50 and p99
of the shipped config under the rate limiter (`tidepool serve`) and without it (as plain
tritonserver serves it), and of the best plain Python backend there (by throughput), with the
ratios p99 shipped / p99 plain and throughput shipped / plain, and a lone request's p99 / p50. Then
round by round: each round's ratios against the plain backend of the same round, and in how many
rounds the shipped config's p99 was at or under it (and its throughput at or over), which the
drift between rounds does not sway.

With --sources, also what the tail comes from, under plain tritonserver: the shipped config beside
itself with fixed threads (elastic threads off, the cores split among its instances) and one
instance with every core (no second instance to take turns with), p50, p90 and p99 per level.

    .venv/bin/python -m benchmarks.tails [--models encoder,convnet] [--levels 1,2,4,8,16] [--rounds 3]
        [--sources]
"""

from __future__ import annotations

import argparse
import tempfile
from collections.abc import Sequence
from pathlib import Path

from benchmarks.common.in_turn import (
    Results,
    Variant,
    add_in_turn_arguments,
    copy_variant,
    median_of,
    serve_in_turn,
    spread,
)
from benchmarks.common.plain_backend import PLAIN_DELAY_US, plain_model
from tidepool.clients.sweep import LevelResult
from tidepool.configfile import read_config
from tidepool.machine import usable_cores
from tidepool.planning.candidates import thread_splits
from tidepool.spec import positive_ints
from tidepool.testing import MODEL_REPOSITORY

SHIPPED = {"serve": "execution_count", "plain": "off"}  # label -> the server's rate-limit mode


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_in_turn_arguments(parser, models=True)
    parser.add_argument("--sources", action="store_true", help="also fixed threads and one instance")
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
            if args.sources:
                variants.update(source_variants(source, repository, model, cores))
            plains[model] = []
            for threads in thread_splits(cores):
                name = f"{model}_plain{cores // threads}x{threads}"
                plain_model(repository / name, source, cores // threads, threads, PLAIN_DELAY_US)
                variants[name] = Variant(name, "off")
                plains[model].append(name)
        results = serve_in_turn(repository, variants, levels, args.rounds, args.window_s)
    for model, names in plains.items():
        best = {c: max(names, key=lambda name: median_of(results[name][c], "throughput")) for c in levels}
        print(f"\n{model}: median (min-max) of {args.rounds} rounds; plain = the plain Python backend's best "
              f"split there ({PLAIN_DELAY_US / 1000:g} ms delay)")  # fmt: skip
        print("| c | launcher | infer/s | p50 ms | p99 ms | plain infer/s | plain p50 | plain p99 "
              "| p99 / plain | infer/s / plain | p99 / p50 |")  # fmt: skip
        print("| --- " * 11 + "|")
        for level in levels:
            plain = results[best[level]][level]
            for label in SHIPPED:
                ours = results[f"{model} {label}"][level]
                rates, p99s = [r.throughput for r in ours], [r.p99_ms for r in ours]
                cells = [
                    str(level), label, spread(rates), f"{median_of(ours, 'p50_ms'):.1f}", spread(p99s),
                    f"{spread([r.throughput for r in plain])} {best[level].split('_')[-1]}",
                    f"{median_of(plain, 'p50_ms'):.1f}", spread([r.p99_ms for r in plain]),
                    f"{median_of(ours, 'p99_ms') / median_of(plain, 'p99_ms'):.2f}",
                    f"{median_of(ours, 'throughput') / median_of(plain, 'throughput'):.2f}",
                    f"{median_of(ours, 'p99_ms') / median_of(ours, 'p50_ms'):.2f}",
                ]  # fmt: skip
                print("| " + " | ".join(cells) + " |")
        print(f"\n{model}, round by round against the plain backend of the same round (best split as above)")
        print("| c | launcher | p99 / plain: median (min-max) | rounds p99 <= plain "
              "| infer/s / plain: median (min-max) | rounds infer/s >= plain |")  # fmt: skip
        print("| --- " * 6 + "|")
        for level in levels:
            for label in SHIPPED:
                cells = [
                    str(level),
                    label,
                    *paired(results[f"{model} {label}"][level], results[best[level]][level]),
                ]
                print("| " + " | ".join(cells) + " |")
        if args.sources:
            print_sources(results, [f"{model} plain", f"{model} fixed", f"{model} one", *names], levels)


def source_variants(source: Path, repository: Path, model: str, cores: int) -> dict[str, Variant]:
    """The shipped config with fixed threads (its instances split the cores) and as one instance
    with every core, both as plain tritonserver serves them (no rate limiter)."""
    instances = sum(group.count for group in read_config(source / "config.pbtxt").instance_group) or 1
    fixed = copy_variant(
        source, repository, f"{model}_fixed",
        ELASTIC_THREADS="false", TORCH_NUM_THREADS=str(max(1, cores // instances)),
    )  # fmt: skip
    one = copy_variant(source, repository, f"{model}_one", instances=1, TORCH_NUM_THREADS=str(cores))
    return {f"{model} fixed": Variant(fixed.model, "off"), f"{model} one": Variant(one.model, "off")}


def print_sources(results: Results, labels: Sequence[str], levels: Sequence[int]) -> None:
    print("\nwhat the tail comes from (no rate limiter): median of the rounds")
    print("| c | variant | infer/s | p50 ms | p90 ms | p99 ms | p99 / p50 |")
    print("| --- " * 7 + "|")
    for level in levels:
        for label in labels:
            rounds = results[label][level]
            name = f"{label.split()[0]} shipped" if label.endswith(" plain") else label  # as users run it
            cells = [str(level), name, spread([r.throughput for r in rounds]),
                     *(f"{median_of(rounds, f):.1f}" for f in ("p50_ms", "p90_ms", "p99_ms")),
                     f"{median_of(rounds, 'p99_ms') / median_of(rounds, 'p50_ms'):.2f}"]  # fmt: skip
            print("| " + " | ".join(cells) + " |")


def paired(ours: Sequence[LevelResult], plain: Sequence[LevelResult]) -> list[str]:
    """Each round of ours against the plain backend's of the same round, measured seconds apart,
    which the drift between rounds does not sway: the p99 ratio's median (min-max), in how many
    rounds ours was at or under, and the same for throughput (at or over)."""
    pairs = list(zip(ours, plain, strict=True))
    tails = [a.p99_ms / b.p99_ms for a, b in pairs]
    rates = [a.throughput / b.throughput for a, b in pairs]
    return [
        spread(tails, 2), f"{sum(t <= 1 for t in tails)}/{len(pairs)}",
        spread(rates, 2), f"{sum(r >= 1 for r in rates)}/{len(pairs)}",
    ]  # fmt: skip


if __name__ == "__main__":
    main()
