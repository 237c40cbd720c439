"""What a forward pass costs when two processes take turns serving a lone client, against one
process serving every request, without Triton: the elastic pair at concurrency 1 in isolation.

Each process builds the model (fixed seed) with every core as torch threads and the spin count
elastic instances run with; the parent sends one batch-1 pass at a time, with a short pause between
passes (the client's turn-around), to one process ("one") or to both in turn ("alternating"). With
--shared-weights a second pair maps the weights from one file, so that both processes read the
same physical pages (one copy in the shared last-level cache). Both processes exist in either mode,
so a --spin-count long enough to outlast a pass has the idle one's threads spinning on the cores
the other computes on, even in "one process".

    .venv/bin/python -m benchmarks.alternating_processes --model encoder [--passes 300] [--rounds 3]
        [--pause-ms 0.6] [--shared-weights] [--spin-count 20000]
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import statistics
import tempfile
import time
from multiprocessing.connection import Connection
from pathlib import Path

from tidepool.configfile import as_dict, read_config
from tidepool.machine import usable_cores
from tidepool.runtime.cores import ELASTIC_SPIN_COUNT, SPIN_VARIABLE
from tidepool.spec import ModelSpec, parse_model_config
from tidepool.testing import MODEL_REPOSITORY

WARM_UP_PASSES = 5
SKIPPED_PASSES = 20  # the first passes of a measurement are left out of its median


def model_spec(model_dir: Path) -> ModelSpec:
    return parse_model_config(as_dict(read_config(model_dir / "config.pbtxt")))


def serve(connection: Connection, model_dir: Path, weights: Path | None, spin_count: str) -> None:
    """One serving process: a pass per message, answering the seconds it took; None ends it."""
    os.environ[SPIN_VARIABLE] = spin_count  # before torch loads
    import torch

    from tidepool.runtime.loader import load_model

    torch.set_num_threads(usable_cores())
    spec = model_spec(model_dir)
    model = load_model(model_dir, spec)
    if weights is not None:
        model.load_state_dict(torch.load(weights, mmap=True, weights_only=True), assign=True)
    [first_input] = spec.inputs[:1]
    shape = first_input.shape(1)
    known = first_input.value_range
    # Token ids: in the declared range, and no higher than 999 (the figures were measured so).
    batch = (
        torch.randint(int(known.low), int(min(known.high, 999)) + 1, shape, dtype=torch.int32)
        if known
        else torch.randn(shape)
    )
    with torch.inference_mode():
        for _ in range(WARM_UP_PASSES):
            model(batch)
        connection.send("ready")
        while connection.recv() is not None:
            began = time.perf_counter()
            model(batch)
            connection.send(time.perf_counter() - began)


def median_pass_ms(
    model_dir: Path, weights: Path | None, alternating: bool, args: argparse.Namespace
) -> float:
    context = multiprocessing.get_context("spawn")
    ends, processes = [], []
    for _ in range(2):
        ours, theirs = context.Pipe()
        process = context.Process(target=serve, args=(theirs, model_dir, weights, args.spin_count))
        process.start()
        ends.append(ours)
        processes.append(process)
    try:
        for end in ends:
            end.recv()
        seconds = []
        for index in range(args.passes):
            end = ends[index % 2] if alternating else ends[0]
            end.send(True)
            seconds.append(end.recv())
            time.sleep(args.pause_ms / 1e3)
    finally:
        for end in ends:
            end.send(None)
        for process in processes:
            process.join()
    return statistics.median(seconds[SKIPPED_PASSES:]) * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="encoder")
    parser.add_argument("--passes", type=int, default=300)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--pause-ms", type=float, default=0.6)
    parser.add_argument("--shared-weights", action="store_true")
    parser.add_argument(
        "--spin-count", default=ELASTIC_SPIN_COUNT, help=f"{SPIN_VARIABLE} (default: as elastic instances)"
    )
    args = parser.parse_args()
    if args.passes <= SKIPPED_PASSES:
        parser.error(f"--passes must be over {SKIPPED_PASSES}")
    model_dir = MODEL_REPOSITORY / args.model
    with tempfile.TemporaryDirectory() as tmp:
        weights = None
        if args.shared_weights:
            import torch

            from tidepool.runtime.loader import load_model

            weights = Path(tmp) / "weights.pt"
            torch.save(load_model(model_dir, model_spec(model_dir)).state_dict(), weights)
        variants = {"one process": (None, False), "alternating": (None, True)}
        if weights is not None:
            variants["alternating, shared weights"] = (weights, True)
        figures: dict[str, list[float]] = {label: [] for label in variants}
        for round_number in range(1, args.rounds + 1):
            for label, (shared, alternating) in variants.items():
                ms = median_pass_ms(model_dir, shared, alternating, args)
                figures[label].append(ms)
                print(f"  round {round_number}/{args.rounds} {label}: {ms:.2f} ms per pass", flush=True)
    alone = statistics.median(figures["one process"])
    print(f"\n{args.model}, batch 1, {usable_cores()} torch threads, {SPIN_VARIABLE}={args.spin_count}, "
          f"{args.pause_ms:g} ms between passes: "
          f"median ms per pass (min-max of {args.rounds} rounds), against one process")  # fmt: skip
    for label, values in figures.items():
        print(f"  {label:<30}{statistics.median(values):6.2f} ({min(values):.2f}-{max(values):.2f})"
              f"  {statistics.median(values) / alone:.3f}")  # fmt: skip


if __name__ == "__main__":
    main()
