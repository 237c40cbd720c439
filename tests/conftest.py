"""Shared fixtures: the fake pb_utils and the simulated CUDA device for unit tests, and the GPU skip."""

import pytest

from tests import fake_pb_utils
from tests.sim_cuda import SimDevice
from tidepool.pool.resources import driver as cuda_driver
from tidepool.testing import cuda_available


@pytest.fixture
def pb_utils(tmp_path, monkeypatch):
    """A fresh fake of triton_python_backend_utils, installed for this test only. The node ledgers
    of the instances it serves live in the test's own directory, as if each test were a server."""
    monkeypatch.setattr("tidepool.pool.ledger.SHM_DIRECTORY", tmp_path)
    yield from fake_pb_utils.installed()


@pytest.fixture
def sim(monkeypatch):
    """Install a simulated device as cuda-python's driver module, for this test only:
    `device = sim(version=12040, bindings=12, progress=0.0, seed=0)` (tests/sim_cuda.py)."""

    def install(version: int = 12040, bindings: int = 12, **options) -> SimDevice:
        device = SimDevice(version, bindings, **options)
        device.cuCtxSetCurrent(("context", 0))  # the test's thread, as torch's runtime leaves it
        monkeypatch.setattr(cuda_driver, "bindings", lambda: device)
        cuda_driver.cuda_status.cache_clear()
        return device

    yield install
    cuda_driver.cuda_status.cache_clear()


def pytest_collection_modifyitems(config, items):
    if cuda_available():
        return
    skip = pytest.mark.skip(
        reason="no CUDA device on this machine (run benchmarks/gpu_check.sh on a GPU host)"
    )
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
