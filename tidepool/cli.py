"""`tidepool` subcommands; each parses its flags and calls into backend/ or clients/."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def _serve(args: argparse.Namespace) -> int:
    from backend.server import ServerConfig, serve

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
        )
    )


def _infer(args: argparse.Namespace) -> int:
    from clients.infer import infer_once

    result = infer_once(args.model, protocol=args.protocol, url=args.url, seed=args.seed)
    print(result.describe())
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="tidepool",
        description="Serve PyTorch models on Triton through a reusable memory pool, and measure them.",
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    serve = commands.add_parser("serve", help="start tritonserver on a model repository")
    serve.add_argument(
        "--model-repository",
        default="model_repository",
        metavar="DIR",
        help="models to serve (default: %(default)s)",
    )
    serve.add_argument(
        "--host",
        default="127.0.0.1",
        help="address to listen on for HTTP, gRPC and metrics (default: "
        "%(default)s, loopback only; 0.0.0.0 listens on every interface)",
    )
    serve.add_argument("--http-port", type=int, default=8000)
    serve.add_argument("--grpc-port", type=int, default=8001)
    serve.add_argument("--metrics-port", type=int, default=8002)
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
    serve.add_argument("--log-verbose", type=int, default=0)
    serve.set_defaults(run=_serve)

    infer = commands.add_parser("infer", help="send one valid random request and print the result")
    infer.add_argument("model")
    infer.add_argument("--protocol", choices=["http", "grpc"], default="http")
    infer.add_argument(
        "--url", help="server address (default: 127.0.0.1:8000 for HTTP, 127.0.0.1:8001 for gRPC)"
    )
    infer.add_argument("--seed", type=int, default=0, help="seed of the random input")
    infer.set_defaults(run=_infer)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.run(args)
    except KeyboardInterrupt:
        return 130
    except Exception as exc:  # every failure ends with one clear line, not a traceback
        from backend.server import ServerError

        known = (ServerError, ConnectionError, OSError, ValueError)
        if not isinstance(exc, known) and type(exc).__module__.split(".")[0] != "tritonclient":
            raise
        print(f"tidepool {args.command}: error: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
