"""`python -m benchmarks.pool budget`: what the node budget costs a served model: the shipped config
with NODE_BUDGET on (its pools reserve from the server's shared ledger, answer trim requests, report
in-use bytes after every execution) against the same config with NODE_BUDGET off, under Triton's
rate limiter (as `tidepool serve` starts the server) and without it (as plain tritonserver serves),
levels in turn, --rounds rounds. Prints infer/s and p99 per level and the ratio of medians on/off."""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

from benchmarks.common.in_turn import (
    Variant,
    add_in_turn_arguments,
    copy_variant,
    median_of,
    serve_in_turn,
    spread,
    throughputs,
)
from tidepool.spec import positive_ints
from tidepool.testing import MODEL_REPOSITORY

MODES = {"rate limiter": "execution_count", "no rate limiter": "off"}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_in_turn_arguments(parser)


def run(args: argparse.Namespace) -> None:
    levels = positive_ints(args.levels, "--levels")
    with tempfile.TemporaryDirectory() as tmp:
        repository = Path(tmp)
        source = MODEL_REPOSITORY / args.model
        variants: dict[str, Variant] = {}
        for index, (mode, rate_limit) in enumerate(MODES.items()):
            for switch in ("on", "off"):
                copied = copy_variant(source, repository, f"budget_{switch}_{index}", NODE_BUDGET=switch)
                variants[f"{mode}, budget {switch}"] = Variant(copied.model, rate_limit)
        results = serve_in_turn(repository, variants, levels, args.rounds, args.window_s)
    print(f"\n{args.model}: infer/s, median (min-max) of {args.rounds} rounds; p99 ms, median (min-max)")
    print("| server | c | budget on | budget off | on/off infer/s | on/off p99 |")
    print("| --- | --- | --- | --- | --- | --- |")
    for mode in MODES:
        for level in levels:
            on, off = (results[f"{mode}, budget {switch}"][level] for switch in ("on", "off"))
            cells = [
                f"{spread(throughputs(runs))}, p99 {spread([r.p99_ms for r in runs])}" for runs in (on, off)
            ]
            rate = median_of(on, "throughput") / median_of(off, "throughput")
            tail = median_of(on, "p99_ms") / median_of(off, "p99_ms")
            print(f"| {mode} | {level} | {cells[0]} | {cells[1]} | {rate:.2f} | {tail:.2f} |")
