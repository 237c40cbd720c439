"""benchmarks/gpu_check.sh's device steps (benchmarks/common/gpu_check.py) on the simulated device,
so that the one script run when a GPU is lent cannot rot before: each step passes here as it must
there, and the script parses."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

from benchmarks.common import gpu_check
from tests.sim_link import SimulatedLink
from tidepool.runtime.instance import ModelInstance
from tidepool.testing import REPO_ROOT


def simulated(device) -> gpu_check.Device:
    kept: list = []

    def write(block, value, stream):
        source = np.full(block.nbytes, value, np.uint8)
        kept.append(source)
        device.cuMemcpyHtoDAsync(block.ptr, source.ctypes.data, block.nbytes, stream)

    return gpu_check.Device(
        "simulated",
        lambda config, path: ModelInstance.load(config, path, cuda_available=lambda: True,
                                                link=SimulatedLink(device, 0)),
        lambda: device.new_stream(non_blocking=True),
        lambda stream: device.launch(stream, lambda: None),
        write,
        lambda block: device.device_array(block.ptr, block.nbytes).copy(),
        device.cuCtxSynchronize,
        kept,
    )  # fmt: skip


@pytest.mark.parametrize("step", list(gpu_check.STEPS))
def test_each_device_step_passes_on_the_simulated_device(sim, step):
    verdict = gpu_check.STEPS[step](simulated(sim()))
    assert verdict and "\n" not in verdict


def test_the_runner_prints_one_verdict_a_step_and_says_whether_all_passed(sim, capsys, monkeypatch):
    device = simulated(sim())
    assert gpu_check.run(device, ["reserved", "oom"])
    lines = capsys.readouterr().out.splitlines()
    assert [line.split()[:2] for line in lines] == [["reserved", "ok:"], ["oom", "ok:"]]
    monkeypatch.setitem(gpu_check.STEPS, "oom", lambda device: gpu_check.rows(1, 1)["missing"])
    assert not gpu_check.run(device, ["oom"])
    assert "oom           FAILED: KeyError: 'missing'" in capsys.readouterr().out


def test_the_gpu_check_script_parses_and_its_steps_are_named():
    assert subprocess.run(["bash", "-n", str(REPO_ROOT / "benchmarks" / "gpu_check.sh")]).returncode == 0
    done = subprocess.run([sys.executable, "-m", "benchmarks.common.gpu_check", "nosuch"], cwd=REPO_ROOT,
                          capture_output=True, text=True)  # fmt: skip
    assert done.returncode == 1 and "unknown step(s) nosuch; the steps: staging, cross-stream" in done.stderr
