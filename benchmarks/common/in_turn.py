"""Measuring served models side by side for the benchmarks: closed-loop sweeps on one or more
servers, level by level in turn across the models so drift falls on all of them, and how repeats
print."""

from __future__ import annotations

import argparse
import contextlib
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from tidepool.clients.connection import Connection
from tidepool.clients.sweep import LevelResult, Sweep, SweepSettings, rotated
from tidepool.configfile import copy_model, read_config, set_instances, with_parameters
from tidepool.launcher.server import ServerConfig, TritonServer

Results = dict[str, dict[int, list[LevelResult]]]  # label -> level -> one result per round


@dataclass(frozen=True)
class Target:
    """One loaded model on one server, and how it is sent requests: for a model with sequence
    inputs, the length mix (None: its LENGTH_MIX) and whether clients pad to its longest."""

    grpc_url: str
    model: str
    lengths: str | None = None
    pad_to_longest: bool = False
    metrics_url: str | None = None


@dataclass(frozen=True)
class Variant:
    """A model of the repository, and the rate-limit mode of the server that serves it (one server
    per mode)."""

    model: str
    rate_limit: str = ServerConfig.rate_limit


def copy_variant(
    source: Path,
    repository: Path,
    name: str,
    delay_us: int | None = None,
    instances: int | None = None,
    prefer_first: bool = False,
    **parameters: str,
) -> Variant:
    """A copy of the model directory `source` named `name` in `repository`, its config edited: the
    queue delay, the instance count (see set_instances) and backend parameters where given."""
    config = with_parameters(read_config(source / "config.pbtxt"), **parameters)
    if delay_us is not None:
        config.dynamic_batching.max_queue_delay_microseconds = delay_us
    if instances is not None:
        set_instances(config, instances, prefer_first)
    copy_model(source, repository / name, config)
    return Variant(name)


def sweep(target: Target, levels: Sequence[int], window_s: float, max_windows: int = 3) -> list[LevelResult]:
    """One closed-loop sweep of `target` over gRPC at each concurrency of `levels`."""
    settings = SweepSettings(
        target.model,
        url=target.grpc_url,
        concurrency=tuple(levels),
        window_s=window_s,
        warmup_s=1.0,
        max_windows=max_windows,
        lengths=target.lengths,
        pad_to_longest=target.pad_to_longest,
        metrics_url=target.metrics_url,
    )
    return Sweep(settings).run()


def in_turn(
    targets: Mapping[str, Target],
    levels: Sequence[int],
    rounds: int,
    window_s: float,
    first_round: int = 1,
) -> Results:
    """label -> level -> one result per round (numbered from `first_round`, which sets the order).
    Each round takes every level in turn, and at each level every model in turn, starting with the
    next model each time: the model measured first after a level change served less (encoder, c=1:
    the planned config 75-78/s, the same config under `dynamic_batching {}` measured second 83-96/s,
    in all 3 rounds), so no model may always be first."""
    results: Results = {label: {c: [] for c in levels} for label in targets}
    order = list(targets.items())
    for round_number in range(first_round, first_round + rounds):
        for index, level in enumerate(levels):
            for label, target in rotated(order, (round_number - 1) * len(levels) + index):
                [result] = sweep(target, [level], window_s)
                results[label][level].append(result)
                print(f"  round {round_number} c={level} {label}: {result.throughput:.1f}/s, "
                      f"p99 {result.p99_ms:.1f} ms, batch {result.avg_batch:.2f}", flush=True)  # fmt: skip
    return results


def add_in_turn_arguments(parser: argparse.ArgumentParser, models: bool = False) -> None:
    """--model (or with `models`, --models: a comma-separated list), --levels, --rounds and
    --window-s, as the side-by-side benchmarks take them."""
    if models:
        parser.add_argument("--models", default="encoder,convnet")
    else:
        parser.add_argument("--model", default="encoder")
    parser.add_argument("--levels", default="1,2,4,8,16")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--window-s", type=float, default=2.0)


def serve_in_turn(
    repository: Path,
    variants: Mapping[str, Variant],
    levels: Sequence[int],
    rounds: int,
    window_s: float,
) -> Results:
    """`in_turn` over `repository`: one server per rate-limit mode (explicit model control, all of
    them up at once), each variant loaded on its own."""
    targets: dict[str, Target] = {}
    with contextlib.ExitStack() as stack:
        servers: dict[str, tuple[ServerConfig, Connection]] = {}
        for label, variant in variants.items():
            if variant.rate_limit not in servers:
                config = ServerConfig.on_free_ports(
                    repository, extra_args=["--model-control-mode=explicit"], rate_limit=variant.rate_limit
                )
                stack.enter_context(TritonServer(config))
                http = stack.enter_context(Connection.open("http", config.http_url))
                servers[variant.rate_limit] = (config, http)
            config, http = servers[variant.rate_limit]
            http.client.load_model(variant.model)
            targets[label] = Target(config.grpc_url, variant.model)
        return in_turn(targets, levels, rounds, window_s)


def throughputs(results: Sequence[LevelResult]) -> list[float]:
    return [r.throughput for r in results]


def median_of(results: Sequence[LevelResult], field: str) -> float:
    """The median of one figure of repeated results (e.g. "p99_ms", "avg_batch")."""
    return statistics.median(getattr(r, field) for r in results)


def spread(values: Sequence[float], digits: int = 1) -> str:
    """'median (min-max)' of repeated figures; the figure alone when there is one."""
    if len(values) == 1:
        return f"{values[0]:.{digits}f}"
    return f"{statistics.median(values):.{digits}f} ({min(values):.{digits}f}-{max(values):.{digits}f})"
