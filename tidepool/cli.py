"""The `tidepool` command: its subcommands (tidepool/commands/, one module each) wired into one
parser, and the rule that any TidepoolError (or an unreachable server) ends as one line on stderr,
never a traceback."""

from __future__ import annotations

import argparse
import http.client
import os
import sys

from tidepool import commands
from tidepool.errors import TidepoolError


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="tidepool",
        description="Serve PyTorch models on Triton through a reusable memory pool, and measure them.",
    )
    subcommands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for command in commands.ALL:
        command.add(subcommands)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return int(args.run(args))
    except KeyboardInterrupt:
        return 130
    except TidepoolError as exc:
        print(f"tidepool {args.command}: error: {exc}", file=sys.stderr)
        return 1
    except Exception as exc:  # a server that cannot be reached, or a bug: still one line
        expected = server_error(exc)
        if expected is None and os.environ.get("TIDEPOOL_DEBUG"):
            raise
        unexpected = (
            f"unexpected error: {type(exc).__name__}: {exc} "
            "(a bug in Tidepool; TIDEPOOL_DEBUG=1 shows the traceback)"
        )
        print(f"tidepool {args.command}: {expected or unexpected}", file=sys.stderr)
        return 1


def server_error(exc: Exception) -> str | None:
    """The line for a server that could not be reached or did not speak the protocol, else None."""
    from tritonclient.utils import InferenceServerException

    if isinstance(exc, (OSError, InferenceServerException)):
        return f"error: {exc}"
    if isinstance(exc, http.client.HTTPException):  # e.g. an HTTP client sent to a gRPC port
        return (
            f"error: the server did not answer in HTTP ({exc}); is that its gRPC port? "
            "(--protocol grpc speaks gRPC)"
        )
    return None


if __name__ == "__main__":
    sys.exit(main())
