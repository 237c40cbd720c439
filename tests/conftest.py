"""Shared fixtures: the fake pb_utils for unit tests, and the GPU skip."""

import pytest

from tests import fake_pb_utils
from tidepool.testing import cuda_available


@pytest.fixture
def pb_utils():
    """A fresh fake of triton_python_backend_utils, installed for this test only."""
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
