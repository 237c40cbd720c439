"""`tidepool profile`: memory and latency of a model per batch size, as JSON, a report and plots."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from tidepool.commands.common import add_measuring_options, measuring, progress_printer


def add(commands: Any) -> None:
    profile = commands.add_parser("profile", help="measure memory and latency per batch size")
    profile.add_argument("model_dir", help="a model directory (with config.pbtxt)")
    add_measuring_options(profile)
    profile.add_argument(
        "--out",
        help="profile JSON (default: profiles/MODEL-DEVICE-PRECISION.json, -frozen added for --graph "
        "frozen); report and plots are written beside it",
    )
    profile.add_argument("--trace", metavar="FILE", help="also write a Chrome trace of one batch")
    profile.add_argument("--precision", choices=["fp32", "bf16", "fp16", "int8"], default="fp32")
    profile.add_argument(
        "--graph",
        choices=["eager", "frozen"],
        default="eager",
        help="run the module as loaded, or traced and frozen (the GRAPH parameter; default: eager)",
    )
    profile.add_argument(
        "--threads", type=int, help="torch threads (default: the config's TORCH_NUM_THREADS)"
    )
    profile.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from tidepool.planning.report import format_report, write_report

    model_dir = Path(args.model_dir)
    trace = Path(args.trace) if args.trace else None
    measured = measuring(args)
    mix = measured.mix(model_dir)
    profile = measured.profile(
        model_dir, args.precision, args.threads, args.graph, trace=trace, progress=progress_printer,
        length=round(mix.mean) if mix else None,
    )  # fmt: skip
    if mix is not None:  # and over rows x length, for the mix
        from tidepool.planning.lengths import lengths_to_measure
        from tidepool.planning.profiler import profile_lengths

        latency_ms = args.max_latency_ms or float("inf")
        profile = profile_lengths(
            model_dir, profile, lengths_to_measure(mix), latency_ms, args.seconds_per_point, progress_printer
        )
    print(file=sys.stderr)
    graph = "" if args.graph == "eager" else f"-{args.graph}"
    out = Path(args.out or f"profiles/{model_dir.name}-{args.device}-{args.precision}{graph}.json")
    written = write_report(profile, out)
    print(format_report(profile))
    print("wrote " + ", ".join(str(p) for p in written) + (f", {args.trace}" if args.trace else ""))
    return 0
