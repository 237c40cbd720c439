"""Why two instances lose to one at concurrency 1 on a CPU: forward passes that alternate between
two processes (as Triton hands a lone client's requests to two instances in turn), each with every
core, against one process taking every pass, at several values of libgomp's GOMP_SPINCOUNT (how
long idle OpenMP workers spin before they sleep). No server: the encoder's frozen graph in worker
processes driven over pipes, so only the processes' interplay is measured. Prints per-pass p50, p99
and mean, and the ratio of p50 against one process at libgomp's default spin measured in the same round.

    .venv/bin/python -m benchmarks.openmp_alternation [--rounds 2] [--passes 1500] [--spins default,20000,0]
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import statistics
import sys
import time
from multiprocessing.connection import Connection

from tidepool.machine import usable_cores
from tidepool.testing import MODEL_REPOSITORY

GAP_S = 0.0005  # between passes, as a round trip to the client leaves one


def worker(pipe: Connection, spin: str | None, threads: int) -> None:
    if spin is not None:
        os.environ["GOMP_SPINCOUNT"] = spin  # libgomp reads it once, as torch loads
    import torch

    sys.path.insert(0, str(MODEL_REPOSITORY / "encoder"))
    import encoder_model  # type: ignore[import-not-found]  # the example model's file, on sys.path above

    from tidepool.runtime.graph import freeze

    torch.set_num_threads(threads)
    ids = torch.randint(0, 30000, (1, 128), dtype=torch.int32)
    model, _ = freeze(encoder_model.build().eval(), [ids], [[ids]])
    with torch.inference_mode():
        for _ in range(30):
            model(ids)
        pipe.send("ready")
        while pipe.recv():
            began = time.perf_counter()
            model(ids)
            pipe.send(time.perf_counter() - began)


def passes_ms(processes: int, spin: str | None, passes: int) -> list[float]:
    context = mp.get_context("spawn")
    pipes, children = [], []
    for _ in range(processes):
        ours, theirs = context.Pipe()
        child = context.Process(target=worker, args=(theirs, spin, usable_cores()))
        child.start()
        pipes.append(ours)
        children.append(child)
    for pipe in pipes:
        assert pipe.recv() == "ready"
    times = []
    for index in range(passes):
        pipe = pipes[index % processes]
        pipe.send(True)
        times.append(pipe.recv() * 1000)
        time.sleep(GAP_S)
    for pipe, child in zip(pipes, children, strict=True):
        pipe.send(False)
        child.join()
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--passes", type=int, default=1500)
    parser.add_argument("--spins", default="default,20000,0")
    args = parser.parse_args()
    spins = [None if s == "default" else s for s in args.spins.split(",")]
    print(f"{usable_cores()} cores; each process runs {usable_cores()} torch threads")
    for round_index in range(args.rounds):
        baseline = statistics.median(passes_ms(1, None, args.passes))
        print(f"round {round_index + 1}: one process, default spin: p50 {baseline:.2f} ms")
        for processes in (1, 2):
            for spin in spins:
                times = passes_ms(processes, spin, args.passes)
                p50 = statistics.median(times)
                p99 = statistics.quantiles(times, n=100)[98]
                print(
                    f"  {'one process ' if processes == 1 else 'two, in turn'} spin {spin or 'default':>7}: "
                    f"p50 {p50:5.2f} ms, p99 {p99:5.2f} ms, mean {statistics.fmean(times):5.2f} ms, "
                    f"{p50 / baseline:.2f}x",
                    flush=True,
                )


if __name__ == "__main__":
    main()
