"""`tidepool serve`: start tritonserver on a model repository, supervised, on loopback by default."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any


def add(commands: Any) -> None:
    from tidepool.launcher.server import DEFAULT_GRACE_S, ServerConfig

    defaults = ServerConfig()
    serve = commands.add_parser("serve", help="start tritonserver on a model repository")
    serve.add_argument(
        "--model-repository",
        default=str(defaults.model_repository),
        metavar="DIR",
        help="models to serve (default: %(default)s)",
    )
    serve.add_argument(
        "--host",
        default=defaults.host,
        help="address to listen on for HTTP, gRPC and metrics (default: "
        "%(default)s, loopback only; 0.0.0.0 listens on every interface)",
    )
    serve.add_argument("--http-port", type=int, default=defaults.http_port)
    serve.add_argument("--grpc-port", type=int, default=defaults.grpc_port)
    serve.add_argument("--metrics-port", type=int, default=defaults.metrics_port)
    serve.add_argument(
        "--tritonserver",
        metavar="PATH",
        help="tritonserver binary (default: $TRITONSERVER, PATH, then the nvidia-pytriton wheel)",
    )
    serve.add_argument(
        "--backend-config",
        action="append",
        default=[],
        metavar="BACKEND,K=V",
        help="passed to tritonserver, e.g. python,shm-default-byte-size=33554432",
    )
    serve.add_argument("--log-verbose", type=int, default=defaults.log_verbose)
    serve.add_argument(
        "--model-control",
        choices=["none", "explicit"],
        default=defaults.model_control,
        help="explicit: load every model at start and allow reloads with a new config "
        "(tidepool plan --from-server --apply)",
    )
    serve.add_argument(
        "--rate-limit",
        choices=["execution_count", "off"],
        default=defaults.rate_limit,
        help="Triton's rate limiter; execution_count lets the rate-limiter priorities of an elastic "
        "plan keep a lone client on one instance (default: %(default)s)",
    )
    serve.add_argument(
        "--memory-budget",
        metavar="TIER=SIZE,...",
        help="what the pools of every model share, e.g. host=8GiB,cuda:0=20GiB (sets "
        "TIDEPOOL_MEMORY_BUDGET for the server; default: 80%% of the machine's or device's memory)",
    )
    serve.add_argument(
        "--grace-s",
        type=float,
        default=DEFAULT_GRACE_S,
        help="on SIGTERM or Ctrl-C, drain for up to this long, then kill (default: %(default)s, "
        "inside Kubernetes' 30 s default)",
    )
    serve.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from tidepool.launcher.serve import serve
    from tidepool.launcher.server import ServerConfig
    from tidepool.pool.budget import BUDGET_VARIABLE, budget_for, format_budget, parse_budget

    environment = {}
    if args.memory_budget:
        environment[BUDGET_VARIABLE] = format_budget(parse_budget(args.memory_budget, "--memory-budget"))
    host = budget_for("host", {**os.environ, **environment})
    print(f"tidepool: node memory budget host={host.nbytes / 2**30:.2f}GiB ({host.why})", file=sys.stderr)
    return serve(
        ServerConfig(
            model_repository=Path(args.model_repository),
            host=args.host,
            http_port=args.http_port,
            grpc_port=args.grpc_port,
            metrics_port=args.metrics_port,
            tritonserver=args.tritonserver,
            backend_config=args.backend_config,
            log_verbose=args.log_verbose,
            grace_s=args.grace_s,
            model_control=args.model_control,
            rate_limit=args.rate_limit,
            environment=environment,
        )
    )
