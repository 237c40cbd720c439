"""A benchmark script of several measurements: `python -m benchmarks.NAME WHAT [flags]` runs the
one named, each parsing its own flags."""

from __future__ import annotations

import sys
from collections.abc import Callable


def run_subcommand(commands: dict[str, Callable[[], None]], usage: str) -> None:
    """Run the measurement sys.argv[1] names; `usage` (the script's docstring) when none does."""
    if len(sys.argv) < 2 or sys.argv[1] not in commands:
        raise SystemExit(usage)
    command = sys.argv.pop(1)
    sys.argv[0] = f"{sys.argv[0]} {command}"  # its own --help then names it
    commands[command]()
