"""`tidepool load`: a headless Locust run with reports and a verdict."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from tidepool.commands.common import URL_HELP, add_lengths_option, add_samples_option, duration


def add(commands: Any) -> None:
    load = commands.add_parser("load", help="a headless Locust load test with CSV and HTML reports")
    load.add_argument("model")
    load.add_argument("--users", type=int, default=32)
    load.add_argument("--spawn-rate", type=float, default=8.0, help="users started per second")
    load.add_argument("--duration", type=duration, default=60.0, help="e.g. 60s, 5m (default: 60s)")
    load.add_argument("--protocol", choices=["http", "grpc"], default="grpc")
    load.add_argument(
        "--url",
        help=URL_HELP,
    )
    load.add_argument("--p99-ms", type=float, help="fail when p99 latency is above this bound")
    load.add_argument(
        "--workers", type=int, default=0, help="run Locust distributed: one master and N worker processes"
    )
    load.add_argument("--report-dir", help="default: a new timestamped folder under ./reports/")
    load.add_argument("--batch", type=int, default=1, help="rows per request")
    add_samples_option(load)
    add_lengths_option(load)
    load.add_argument(
        "--step-users",
        metavar="N|U1,U2,...",
        help="step load: N adds N users every --step-seconds (4 steps); a list gives the users of each step",
    )
    load.add_argument(
        "--step-seconds", "--step", dest="step_seconds", type=duration, default=10.0,
        help="length of one step, e.g. 10s (default: %(default)s s)",
    )  # fmt: skip
    load.add_argument(
        "--request-log",
        action="store_true",
        help="also keep every request (finished at, response time, ok) in requests-<pid>.csv",
    )
    load.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from tidepool.clients.locust_run import LoadSettings, run_load

    summary = run_load(
        LoadSettings(
            model=args.model,
            users=args.users,
            spawn_rate=args.spawn_rate,
            duration=f"{max(1, round(args.duration))}s",
            protocol=args.protocol,
            url=args.url,
            p99_ms=args.p99_ms,
            workers=args.workers,
            report_dir=Path(args.report_dir) if args.report_dir else None,
            batch=args.batch,
            input_data=args.input_data,
            step_users=args.step_users,
            step_seconds=args.step_seconds,
            request_log=args.request_log,
            lengths=args.lengths,
        )
    )
    print(
        f"\n{args.model} over {args.protocol}: {summary.requests} requests answered, "
        f"{summary.failures} failed, "
        f"{summary.requests_per_s:.1f} req/s, p50 {summary.p50_ms:.0f} ms, p99 {summary.p99_ms:.0f} ms"
    )
    if summary.tokens_per_s:
        print(
            f"{summary.tokens_per_s:.0f} tokens/s; p99 of short requests {summary.p99_short_ms:.0f} ms, "
            f"of long ones {summary.p99_long_ms:.0f} ms"
        )
    if summary.by_worker:
        print("requests per worker: " + ", ".join(f"{k[:12]} {v}" for k, v in summary.by_worker.items()))
    print(f"reports: {summary.report_dir}/report.html and {summary.report_dir}/locust_*.csv")
    problems = summary.verdict(args.p99_ms)
    for problem in problems:
        print(f"tidepool load: FAILED: {problem}", file=sys.stderr)
    return 1 if problems else 0
