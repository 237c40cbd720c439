"""Text traffic: a variable-length text model (the DistilBERT of tests/real_models) under length
mixes, three ways side by side on one server (as plain tritonserver serves; `--rate-limit
execution_count`: as `tidepool serve` starts it), levels and variants taken in turn, --rounds rounds:

  (a) equal shapes: the config `tidepool plan --lengths MIX --write` writes, with its ragged
      settings taken out: Triton batches only requests of one length (today's way);
  (b) clients pad: the same config, every request padded by its client to the mix's longest
      length (masks 0), so that every request has one shape;
  (c) across lengths: the planned config: requests of every length batched together, padded to
      buckets under a token budget by the instance;
  and (c) sent one length, the mix's mean: what (c) reaches at one length (the acceptance figure).

Per mix and level: tokens/s (real tokens; median and min-max of the rounds), p50, p99 of short
(at most the median length) and long (at least the 90th percentile) requests, the mean batch, the
padding (c: the server's /metrics; b: the client's) and tokens/s against (a).

    .venv/bin/python -m benchmarks.text [--mixes '8..120;8..512;8..64:0.7,65..256:0.25,257..512:0.05']
        [--levels 1,8,16] [--rounds 2] [--window-s 5] [--latency-budget-ms 400]
        [--rate-limit off|execution_count]
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from benchmarks.common.in_turn import Target, in_turn, median_of, spread
from tidepool import parameters as param
from tidepool.clients.sweep import LevelResult
from tidepool.configfile import copy_model, read_config
from tidepool.launcher.server import ServerConfig, TritonServer
from tidepool.spec import LengthMix, positive_ints
from tidepool.testing import REPO_ROOT

MODEL = REPO_ROOT / "tests" / "real_models" / "distilbert"
MIXES = "8..120;8..512;8..64:0.7,65..256:0.25,257..512:0.05"
RAGGED_SETTINGS = (param.LENGTH_BUCKET, param.MAX_BATCH_TOKENS, param.PASS_COST_TOKENS, param.LENGTH_GROUPING)


def plan(repository: Path, mix: str, latency_budget_ms: float) -> tuple[str, str]:
    """The model planned for `mix` (`across`), and that config without its ragged settings (`equal`)."""
    source = repository / "planned"
    shutil.copytree(MODEL, source)
    command = [sys.executable, "-m", "tidepool.cli", "plan", str(source), "--lengths", mix, "--memory-budget",
               "2GiB", "--latency-budget-ms", str(latency_budget_ms), "--write"]  # fmt: skip
    print(f"planning for {mix}: {' '.join(command[3:])}", flush=True)
    done = subprocess.run(command, check=True, stdin=subprocess.DEVNULL, capture_output=True, text=True)
    print("\n".join(line for line in done.stdout.splitlines() if line.startswith(("lengths:", "plan for"))))
    config = read_config(source / "config.pbtxt")
    copy_model(source, repository / "across", config)
    for tensor in config.input:
        tensor.allow_ragged_batch = False
    for setting in RAGGED_SETTINGS:
        config.parameters.pop(setting.name, None)
    copy_model(source, repository / "equal", config)
    shutil.rmtree(source)
    return "across", "equal"


def padding(result: LevelResult, longest: int, client_pads: bool) -> float:
    """The padded share of the positions run: the server's, or where clients pad, theirs."""
    if client_pads:
        return 1 - result.tokens_per_s / (result.throughput * longest)
    return result.padding


def measure(
    mix: str, levels: list[int], rounds: int, window_s: float, latency_budget_ms: float, rate_limit: str
) -> None:
    lengths = LengthMix.parse(mix, "--mixes")
    mean = str(round(lengths.mean))
    with tempfile.TemporaryDirectory(prefix="tidepool-text-") as tmp:
        repository = Path(tmp)
        across, equal = plan(repository, mix, latency_budget_ms)
        config = ServerConfig.on_free_ports(repository, rate_limit=rate_limit)
        with TritonServer(config):  # both loaded as it starts
            url, metrics = config.grpc_url, config.metrics_url
            targets = {
                "(a) equal shapes": Target(url, equal, mix, metrics_url=metrics),
                "(b) clients pad": Target(url, equal, mix, pad_to_longest=True, metrics_url=metrics),
                "(c) across lengths": Target(url, across, mix, metrics_url=metrics),
                f"(c) at one length, {mean}": Target(url, across, mean, metrics_url=metrics),
            }
            results = in_turn(targets, levels, rounds, window_s)
    server = (
        "tidepool serve's rate limiter" if rate_limit != "off" else "plain tritonserver (no rate limiter)"
    )
    print(f"\n{mix} under {server}: {lengths.describe()}; tokens/s median (min-max) of {rounds} rounds, "
          "p50 and p99 ms medians; short: at most the median length, long: at least the 90th "
          "percentile")  # fmt: skip
    print("| c | variant | tokens/s | / (a) | p50 | p99 short | p99 long | mean batch | padding |")
    print("| --- " * 9 + "|")
    for level in levels:
        base = median_of(results["(a) equal shapes"][level], "tokens_per_s")
        for label, target in targets.items():
            runs = results[label][level]
            cells = [
                str(level), label, spread([r.tokens_per_s for r in runs], 0),
                f"{median_of(runs, 'tokens_per_s') / base:.2f}",
                *(f"{median_of(runs, field):.1f}" for field in ("p50_ms", "p99_short_ms", "p99_long_ms")),
                f"{median_of(runs, 'avg_batch'):.2f}",
                f"{statistics.median(padding(r, lengths.longest, target.pad_to_longest) for r in runs):.1%}",
            ]  # fmt: skip
            print("| " + " | ".join(cells) + " |", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mixes", default=MIXES, help="length mixes separated by ';' (default: %(default)s)")
    parser.add_argument("--levels", default="1,8,16")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--window-s", type=float, default=5.0)
    parser.add_argument(
        "--latency-budget-ms", type=float, default=400.0, help="what each mix is planned with"
    )
    parser.add_argument(
        "--rate-limit", choices=["off", "execution_count"], default="off",
        help="off: as plain tritonserver serves; execution_count: as `tidepool serve` does (default: off)",
    )  # fmt: skip
    args = parser.parse_args()
    levels = positive_ints(args.levels, "--levels")
    for mix in args.mixes.split(";"):
        measure(mix, levels, args.rounds, args.window_s, args.latency_budget_ms, args.rate_limit)


if __name__ == "__main__":
    main()
