"""`tidepool sweep`: throughput and latency of any Triton server, level by level."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from tidepool.commands.common import (
    URL_HELP,
    add_lengths_option,
    add_samples_option,
    duration,
    progress_printer,
)


def add(commands: Any) -> None:
    sweep = commands.add_parser(
        "sweep", help="measure throughput and latency level by level (closed-loop or open-loop)"
    )
    sweep.add_argument("model")
    sweep.add_argument("--protocol", choices=["http", "grpc"], default="grpc")
    sweep.add_argument(
        "--url",
        help=URL_HELP,
    )
    sweep.add_argument(
        "--concurrency",
        default="1:32:x2",
        help="closed-loop levels: START:STOP:xFACTOR, START:STOP:+STEP or 1,4,8 (default: %(default)s)",
    )
    sweep.add_argument(
        "--request-rate",
        metavar="R1,R2,...",
        help="open-loop mode: requests per second per level, instead of concurrency",
    )
    sweep.add_argument("--batch", type=int, default=1, help="rows per request (default: %(default)s)")
    sweep.add_argument(
        "--duration", "--duration-s", dest="duration_s", type=duration, default=10.0,
        help="one measurement window, e.g. 10s (default: %(default)s s)",
    )  # fmt: skip
    sweep.add_argument(
        "--warmup", "--warmup-s", dest="warmup_s", type=duration, default=2.0,
        help="before each level, e.g. 2s (default: %(default)s s)",
    )  # fmt: skip
    sweep.add_argument(
        "--max-windows",
        type=int,
        default=5,
        help="windows per level until two agree within 10%% (default: %(default)s)",
    )
    add_samples_option(sweep)
    add_lengths_option(sweep)
    sweep.add_argument(
        "--metrics-url",
        help="the server's /metrics, for the padding of a model with sequence inputs (default: port 8002 "
        "of the first address's host)",
    )
    sweep.add_argument(
        "--shared-memory",
        action="store_true",
        help="send inputs and receive outputs through system shared memory",
    )
    sweep.add_argument("--out", metavar="results.csv", help="write CSV, and JSON and PNG beside it")
    sweep.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from tidepool.clients.sweep import Sweep, SweepSettings, parse_levels
    from tidepool.clients.sweep_report import format_table, write_reports

    rates = tuple(float(r) for r in args.request_rate.split(",")) if args.request_rate else ()
    settings = SweepSettings(
        model=args.model,
        protocol=args.protocol,
        url=args.url,
        batch=args.batch,
        concurrency=tuple(parse_levels(args.concurrency)),
        request_rates=rates,
        window_s=args.duration_s,
        warmup_s=args.warmup_s,
        max_windows=args.max_windows,
        shared_memory=args.shared_memory,
        input_file=args.input_data,
        lengths=args.lengths,
        metrics_url=args.metrics_url,
    )
    results = Sweep(settings, progress=progress_printer).run()
    print(f"\n{args.model} over {args.protocol}, batch {args.batch}:")
    print(format_table(results))
    if args.out:
        title = f"{args.model} ({args.protocol}, batch {args.batch})"
        written = write_reports(results, Path(args.out), title)
        print("wrote " + ", ".join(str(p) for p in written))
    return 0
