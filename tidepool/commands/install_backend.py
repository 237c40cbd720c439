"""`tidepool install-backend`: lay out the backend for a tritonserver of the user's own."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any


def add(commands: Any) -> None:
    install = commands.add_parser(
        "install-backend",
        help="lay out the tidepool backend in a tritonserver backend directory, for plain tritonserver",
        description="Write DIR/tidepool/model.py (and, where DIR has no Python backend, Triton's "
        "Python backend for this interpreter), then print the tritonserver command line that serves "
        "a model repository with it. In NVIDIA's container: DIR is /opt/tritonserver/backends.",
    )
    install.add_argument("directory", metavar="DIR", help="the backend directory (created where missing)")
    install.add_argument(
        "--tritonserver",
        metavar="PATH",
        help="the tritonserver to serve with (default: $TRITONSERVER, PATH, then the nvidia-pytriton wheel)",
    )
    install.add_argument(
        "--model-repository",
        default="model_repository",
        metavar="DIR",
        help="the repository the printed command line serves (default: %(default)s)",
    )
    install.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from tidepool.launcher.install import install_backend

    installation = install_backend(Path(args.directory), args.tritonserver)
    print(installation.describe(args.model_repository))
    return 0
