"""The shipped configs under either launcher: each example model served by plain tritonserver (the
bundled server with only --model-repository, --backend-directory from `tidepool install-backend`
and loopback addresses: no rate limiter) and by `tidepool serve` (with it), both servers up at once
and measured in turn, level by level, for --rounds rounds. Per launcher and level it prints the
shipped config's throughput and p99 against the best of: one instance with every core and
`dynamic_batching {}`, and the alternatives its plan was chosen over (the config header's "Chosen
over:" line), with the ratio of medians and its spread over the rounds. A second copy of the shipped
config is measured too, as the control: shipped again / shipped is what the same config scores
against itself on this machine, the noise any other ratio must be read against.

    .venv/bin/python -m benchmarks.launchers [--models encoder,convnet] [--levels 1,2,4,8,16]
        [--rounds 3] [--window-s 2] [--fresh-servers]
"""

from __future__ import annotations

import argparse
import contextlib
import re
import statistics
import tempfile
from pathlib import Path

from benchmarks.common.in_turn import (
    Results,
    Target,
    add_in_turn_arguments,
    in_turn,
    median_of,
    spread,
    throughputs,
)
from tidepool.clients.sweep import LevelResult
from tidepool.configfile import ModelConfig, copy_model, read_config, set_instances
from tidepool.launcher.install import install_backend
from tidepool.launcher.server import ServerConfig, TritonServer
from tidepool.machine import usable_cores
from tidepool.spec import positive_ints
from tidepool.testing import MODEL_REPOSITORY

LAUNCHERS = ("plain tritonserver", "tidepool serve")
CONTROL = "shipped again"  # the shipped config once more: the noise between identical configs
LABEL = re.compile(r"(\d+)x(\d+)(?:-(\d+))? (\w+)(?: (\w+))? b(\d+) d([\d.]+)ms")


def labelled_config(base: ModelConfig, label: str) -> ModelConfig:
    """`base` as the config a plan label names ('2x1-2 fp32 frozen b4 d0ms': 2 elastic instances of
    1 to 2 threads, fp32, frozen graph, max_batch_size 4, no queue delay), written as the planner
    writes it (an elastic plan's instances as groups of one with rate-limiter priorities)."""
    found = LABEL.fullmatch(label)
    if found is None:
        raise SystemExit(f"not a plan label: {label!r}")
    instances, threads, elastic_max, precision, graph, batch, delay_ms = found.groups()
    config = ModelConfig()
    config.CopyFrom(base)
    config.max_batch_size = int(batch)
    config.dynamic_batching.Clear()
    config.dynamic_batching.SetInParent()
    config.dynamic_batching.max_queue_delay_microseconds = round(float(delay_ms) * 1000)
    set_instances(config, int(instances), prefer_first=elastic_max is not None)
    config.parameters["TORCH_NUM_THREADS"].string_value = elastic_max or threads
    config.parameters.pop("ELASTIC_THREADS", None)
    if elastic_max is not None:
        config.parameters["ELASTIC_THREADS"].string_value = "true"
    config.parameters["PRECISION"].string_value = precision
    config.parameters["GRAPH"].string_value = graph or "eager"
    return config


def alternatives(model_dir: Path, cores: int) -> dict[str, ModelConfig]:
    """label -> config: one instance with every core and `dynamic_batching {}` (same precision,
    graph and max_batch_size as shipped), then the plan's alternatives from the config header."""
    shipped = read_config(model_dir / "config.pbtxt")
    parameters = shipped.parameters
    one = labelled_config(
        shipped,
        f"1x{cores} {parameters['PRECISION'].string_value or 'fp32'} "
        f"{parameters['GRAPH'].string_value or 'eager'} b{shipped.max_batch_size} d0ms",
    )
    found = {f"1x{cores} dynamic_batching {{}}": one}
    header = next((line for line in (model_dir / "config.pbtxt").read_text().splitlines()
                   if line.startswith("# Chosen over:")), "")  # fmt: skip
    for label in LABEL.finditer(header):
        config = labelled_config(shipped, label.group(0))
        if all(config != other for other in found.values()):
            found[label.group(0)] = config
    return found


def measure_model(
    model: str, backends: Path, levels: list[int], rounds: int, window_s: float, fresh: bool
) -> None:
    cores = usable_cores()
    with tempfile.TemporaryDirectory() as tmp:
        repository = Path(tmp)
        source = MODEL_REPOSITORY / model
        copy_model(source, repository / "shipped")
        copy_model(source, repository / "control")
        names = {"shipped": "shipped", CONTROL: "control"}
        for index, (label, config) in enumerate(alternatives(source, cores).items()):
            config.name = f"alt{index}"
            copy_model(source, repository / config.name, config)
            names[label] = config.name
        print(f"\n{model}: {len(names)} configs x {len(LAUNCHERS)} launchers, {rounds} rounds"
              + (", fresh servers each round" if fresh else ""), flush=True)  # fmt: skip
        # (first round, rounds) per pair of servers: one pair for every round, or a new pair for each.
        spells = [(number, 1) for number in range(1, rounds + 1)] if fresh else [(1, rounds)]
        results: Results = {}
        for first_round, count in spells:
            measured = serve_both(repository, backends, names, levels, count, window_s, first_round)
            for label, by_level in measured.items():
                for level, found in by_level.items():
                    results.setdefault(label, {}).setdefault(level, []).extend(found)
    report(model, list(names), levels, results, rounds)


def serve_both(
    repository: Path,
    backends: Path,
    names: dict[str, str],
    levels: list[int],
    rounds: int,
    window_s: float,
    first_round: int,
) -> Results:
    """Both launchers' servers over `repository`, every config measured in turn."""
    with contextlib.ExitStack() as stack:
        plain = ServerConfig.on_free_ports(repository, backend_directory=backends, plain=True)
        servers = dict(zip(LAUNCHERS, (plain, ServerConfig.on_free_ports(repository)), strict=True))
        targets = {}
        for launcher, config in servers.items():
            stack.enter_context(TritonServer(config))
            for label, name in names.items():
                targets[f"{launcher} / {label}"] = Target(config.grpc_url, name)
        return in_turn(targets, levels, rounds, window_s, first_round)


def report(model: str, labels: list[str], levels: list[int], results: Results, rounds: int) -> None:
    print(f"\n{model}: infer/s median (min-max) of {rounds} rounds; p99 ms median; shipped / best other "
          f"and {CONTROL} / shipped (ratios of medians, and min-max of the per-round ratios)")  # fmt: skip
    for launcher in LAUNCHERS:
        print(f"\n  {launcher}")
        for level in levels:
            shipped = results[f"{launcher} / shipped"][level]
            control = results[f"{launcher} / {CONTROL}"][level]
            others = {label: results[f"{launcher} / {label}"][level] for label in labels if label not in
                      ("shipped", CONTROL)}  # fmt: skip
            best = max(others, key=lambda label: statistics.median(throughputs(others[label])))
            print(
                f"  c={level:<3} shipped {spread(throughputs(shipped)):>20} "
                f"p99 {median_of(shipped, 'p99_ms'):5.1f} | best other {best:<28} "
                f"{spread(throughputs(others[best])):>20} p99 {median_of(others[best], 'p99_ms'):5.1f} | "
                f"{ratio_text(shipped, others[best])} | control {ratio_text(control, shipped)}"
            )


def ratio_text(a: list[LevelResult], b: list[LevelResult]) -> str:
    """'median(a) / median(b) (min-max of the per-round ratios)' of throughput."""
    per_round = [x / y for x, y in zip(throughputs(a), throughputs(b), strict=True)]
    ratio = statistics.median(throughputs(a)) / statistics.median(throughputs(b))
    return f"{ratio:.2f} ({min(per_round):.2f}-{max(per_round):.2f})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_in_turn_arguments(parser, models=True)
    parser.add_argument(
        "--fresh-servers",
        action="store_true",
        help="start both servers anew for each round: a config's stubs can serve a few percent apart "
        "from an identical config's for a whole run (see the control), which only new processes average out",
    )
    args = parser.parse_args()
    levels = positive_ints(args.levels, "--levels")
    with tempfile.TemporaryDirectory() as backends:
        print(install_backend(Path(backends)).describe("<repository>"), flush=True)
        for model in args.models.split(","):
            measure_model(model, Path(backends), levels, args.rounds, args.window_s, args.fresh_servers)


if __name__ == "__main__":
    main()
