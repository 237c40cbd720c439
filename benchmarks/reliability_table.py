"""The bad-request cases of the reliability tests, sent to a real server over HTTP and gRPC
against both example models, printed as a table of the errors seen (a shortened first line).

    .venv/bin/python -m benchmarks.reliability_table
"""

from __future__ import annotations

import tempfile
from pathlib import Path

from tidepool.clients.connection import Connection
from tidepool.launcher.server import ServerConfig, TritonServer
from tidepool.testing import linked_repository
from tidepool.testing.bad_requests import CASES, MODELS


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        config = ServerConfig.on_free_ports(linked_repository(Path(tmp)))
        with TritonServer(config) as server:
            print("| case | protocol | model | error seen |\n| --- | --- | --- | --- |")
            for case in CASES:
                for protocol, url in (("http", config.http_url), ("grpc", config.grpc_url)):
                    with Connection.open(protocol, url) as connection:
                        for model in sorted(MODELS):
                            error = " ".join(case.send(connection, model).split())[:150].replace("|", "/")
                            print(f"| {case.name} | {protocol} | {model} | {error} |")
            assert server.is_ready()


if __name__ == "__main__":
    main()
