"""What several commands share: argparse types, progress on stderr, the measuring flags of
`profile` and `plan`."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from tidepool.errors import TidepoolError
from tidepool.spec import LengthMix, parse_bytes, parse_duration, positive_ints

if TYPE_CHECKING:
    from tidepool.planning.run import Measuring


URL_HELP = (
    "server address, or several separated by commas, which the connections take in turn "
    "(default: 127.0.0.1:8001 gRPC, :8000 HTTP)"
)


def add_samples_option(parser: argparse.ArgumentParser) -> None:
    """--inputs FILE (alias --input-data) of the load tools, into `args.input_data`."""
    parser.add_argument(
        "--inputs", "--input-data", dest="input_data", metavar="FILE",
        help="real samples (.npz, or JSON of input name -> rows) instead of inputs generated from the config",
    )  # fmt: skip


LENGTHS_HELP = (
    "sequence lengths to send, for a model with sequence inputs: 64, 8..512 (uniform) or shares, "
    "8..64:0.7,65..512:0.3 (default: the config's LENGTH_MIX, else its shape.<INPUT>)"
)


def add_lengths_option(parser: argparse.ArgumentParser, help_text: str = LENGTHS_HELP) -> None:
    """--lengths MIX, checked as it is parsed, into `args.lengths` (its text)."""
    parser.add_argument("--lengths", metavar="MIX", type=length_mix, help=help_text)


def length_mix(text: str) -> str:
    """An argparse type: a length mix (spec.LengthMix), kept as its text."""
    try:
        LengthMix.parse(text, "--lengths")
    except TidepoolError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return text


def progress_printer(text: str) -> None:
    """Progress of long work on stderr: one line rewritten in place on a terminal."""
    end = "\r" if sys.stderr.isatty() else "\n"
    print(f"{text:<90}", end=end, file=sys.stderr, flush=True)


def duration(text: str) -> float:
    """An argparse type: '10s', '500ms', '5m' or a plain number of seconds -> seconds."""
    try:
        return parse_duration(text, "duration")
    except TidepoolError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def int_list(text: str) -> list[int]:
    """An argparse type: '1,2,4' -> [1, 2, 4], each at least 1."""
    try:
        return positive_ints(text, "a list", example="1,2,4")
    except TidepoolError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def add_measuring_options(parser: argparse.ArgumentParser) -> None:
    from tidepool.planning.profile import PROFILE_BATCH_SIZES, SECONDS_PER_POINT

    parser.add_argument(
        "--batch-sizes",
        type=int_list,
        default=list(PROFILE_BATCH_SIZES),
        metavar="B1,B2",
        help=f"default: {','.join(map(str, PROFILE_BATCH_SIZES))}",
    )
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    parser.add_argument("--max-latency-ms", type=float, help="stop doubling past this p99")
    parser.add_argument("--memory-limit", help="stop doubling past this total, e.g. 4GiB")
    parser.add_argument(
        "--inputs",
        metavar="FILE",
        help="real samples to measure on (.npz, or JSON of input name -> rows): their values and "
        "lengths (default: inputs generated within the config's range.<INPUT> and shape.<INPUT>)",
    )
    add_lengths_option(
        parser,
        "the sequence lengths traffic has, for a model with sequence inputs: 64, 8..512 (uniform) or "
        "shares, 8..64:0.7,65..512:0.3; profiled over rows x length and planned for (default: the "
        "config's LENGTH_MIX, else the lengths of --inputs' samples, else one length: shape.<INPUT>)",
    )
    parser.add_argument(
        "--seconds-per-point",
        type=float,
        default=SECONDS_PER_POINT,
        help="time each batch size for about this long, at least 10 passes (default: %(default)s)",
    )


def measuring(args: argparse.Namespace) -> Measuring:
    from tidepool.planning.run import Measuring

    return Measuring(
        batch_sizes=tuple(args.batch_sizes),
        device=args.device,
        seconds_per_point=args.seconds_per_point,
        max_latency_ms=args.max_latency_ms,
        memory_limit_bytes=parse_bytes(args.memory_limit, "--memory-limit") if args.memory_limit else None,
        inputs=Path(args.inputs) if args.inputs else None,
        lengths=args.lengths,
    )
