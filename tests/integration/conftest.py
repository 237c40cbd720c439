"""A real tritonserver on free loopback ports, started once for the integration tests."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tidepool.clients.connection import Connection
from tidepool.launcher.server import ServerConfig, TritonServer
from tidepool.pool.ledger import WAIT_VARIABLE
from tidepool.runtime.metrics import INTERVAL_VARIABLE
from tidepool.testing import MODEL_REPOSITORY, TEST_MODELS, linked_repository, model_variant

from .flushed import TEST_INTERVAL_S

# Every server these tests start inherits them: /metrics is current a few intervals after a
# request, and a pool waits long enough for others to lend even where a busy core starves them.
os.environ[INTERVAL_VARIABLE] = str(TEST_INTERVAL_S)
os.environ[WAIT_VARIABLE] = "5"


def server_config(repository=MODEL_REPOSITORY) -> ServerConfig:
    return ServerConfig.on_free_ports(repository)


def pytest_collection_modifyitems(items):
    for item in items:
        if "tests/integration" in str(item.fspath):
            item.add_marker(pytest.mark.integration)


@pytest.fixture(scope="session")
def repository(tmp_path_factory) -> Path:
    root = linked_repository(tmp_path_factory.mktemp("repository"))
    model_variant(TEST_MODELS / "scratch", root, "scratch_pool_off", POOL="off")  # the baseline
    return root


@pytest.fixture(scope="session")
def server(repository):
    with TritonServer(server_config(repository)) as running:
        yield running
        log_tail = "\n".join(running.log_tail)
    assert "Traceback" not in log_tail, log_tail


@pytest.fixture(params=["http", "grpc"])
def connection(request, server):
    url = server.config.http_url if request.param == "http" else server.config.grpc_url
    with Connection.open(request.param, url) as opened:
        yield opened
