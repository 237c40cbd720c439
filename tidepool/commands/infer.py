"""`tidepool infer`: one valid request to a running server, and what came back."""

from __future__ import annotations

import argparse
from typing import Any


def add(commands: Any) -> None:
    infer = commands.add_parser("infer", help="send one valid random request and print the result")
    infer.add_argument("model")
    infer.add_argument("--protocol", choices=["http", "grpc"], default="http")
    infer.add_argument(
        "--url", help="server address (default: 127.0.0.1:8000 for HTTP, 127.0.0.1:8001 for gRPC)"
    )
    infer.add_argument("--seed", type=int, default=0, help="seed of the random input")
    infer.add_argument(
        "--inputs", metavar="FILE", help="send these inputs (.npz, or JSON of input name -> rows) instead"
    )
    infer.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from tidepool.clients.infer import infer_once

    result = infer_once(args.model, protocol=args.protocol, url=args.url, seed=args.seed, inputs=args.inputs)
    print(result.describe())
    return 0
