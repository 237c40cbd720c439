"""Measuring served models side by side for the benchmarks: closed-loop sweeps on one server,
level by level in turn across the models so drift falls on all of them, and how repeats print."""

from __future__ import annotations

import argparse
import statistics
from collections.abc import Mapping, Sequence
from pathlib import Path

from tidepool.clients.connection import Connection
from tidepool.clients.sweep import LevelResult, Sweep, SweepSettings, rotated
from tidepool.launcher.server import ServerConfig, TritonServer


def sweep(
    server: TritonServer, model: str, levels: Sequence[int], window_s: float, max_windows: int = 3
) -> list[LevelResult]:
    """One closed-loop sweep of `model` over gRPC at each concurrency of `levels`."""
    settings = SweepSettings(
        model,
        url=server.config.grpc_url,
        concurrency=tuple(levels),
        window_s=window_s,
        warmup_s=1.0,
        max_windows=max_windows,
    )
    return Sweep(settings).run()


def in_turn(
    server: TritonServer,
    models: Mapping[str, str],
    levels: Sequence[int],
    rounds: int,
    window_s: float,
) -> dict[str, dict[int, list[LevelResult]]]:
    """label -> level -> one result per round; `models` maps each label to a loaded model's name.
    Each round takes every level in turn, and at each level every model in turn, starting with the
    next model each time: the model measured first after a level change served less (encoder, c=1:
    the planned config 75-78/s, the same config under `dynamic_batching {}` measured second 83-96/s,
    in all 3 rounds), so no model may always be first."""
    results: dict[str, dict[int, list[LevelResult]]] = {label: {c: [] for c in levels} for label in models}
    order = list(models.items())
    for round_number in range(1, rounds + 1):
        for index, level in enumerate(levels):
            for label, name in rotated(order, (round_number - 1) * len(levels) + index):
                [result] = sweep(server, name, [level], window_s)
                results[label][level].append(result)
                print(f"  round {round_number}/{rounds} c={level} {label}: {result.throughput:.1f}/s, "
                      f"p99 {result.p99_ms:.1f} ms, batch {result.avg_batch:.2f}", flush=True)  # fmt: skip
    return results


def add_in_turn_arguments(parser: argparse.ArgumentParser) -> None:
    """--model, --levels, --rounds and --window-s, as the side-by-side benchmarks take them."""
    parser.add_argument("--model", default="encoder")
    parser.add_argument("--levels", default="1,2,4,8,16")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--window-s", type=float, default=2.0)


def serve_in_turn(
    repository: Path,
    models: Mapping[str, str],
    levels: Sequence[int],
    rounds: int,
    window_s: float,
    server_args: Sequence[str] = (),
) -> dict[str, dict[int, list[LevelResult]]]:
    """`in_turn` on a server of its own over `repository`, with every model of `models` loaded."""
    explicit = ["--model-control-mode=explicit", *server_args]
    config = ServerConfig.on_free_ports(repository, extra_args=explicit)
    with TritonServer(config) as server, Connection.open("http", config.http_url) as http:
        for name in models.values():
            http.client.load_model(name)
        return in_turn(server, models, levels, rounds, window_s)


def throughputs(results: Sequence[LevelResult]) -> list[float]:
    return [r.throughput for r in results]


def spread(values: Sequence[float], digits: int = 1) -> str:
    """'median (min-max)' of repeated figures; the figure alone when there is one."""
    if len(values) == 1:
        return f"{values[0]:.{digits}f}"
    return f"{statistics.median(values):.{digits}f} ({min(values):.{digits}f}-{max(values):.{digits}f})"
