"""Shared fixtures: the fake pb_utils for unit tests, and the GPU skip."""

import pytest

from tests import fake_pb_utils
from tidepool.testing import cuda_available


@pytest.fixture
def pb_utils(tmp_path, monkeypatch):
    """A fresh fake of triton_python_backend_utils, installed for this test only. The node ledgers
    of the instances it serves live in the test's own directory, as if each test were a server."""
    monkeypatch.setattr("tidepool.pool.ledger.SHM_DIRECTORY", tmp_path)
    yield from fake_pb_utils.installed()


def pytest_collection_modifyitems(config, items):
    if cuda_available():
        return
    skip = pytest.mark.skip(
        reason="no CUDA device on this machine (run benchmarks/gpu_check.sh on a GPU host)"
    )
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
