"""Where an instance runs (Triton's instance kind and device first), and the process-wide settings
that every instance of a process shares, reported as the process has them."""

from __future__ import annotations

import json
import os

import pytest
import torch

from tests.unit.specs import TOKENS_CONFIG, tiny_model_dir, tokens_spec
from tidepool.runtime import process
from tidepool.runtime.process import ProcessRequest, configure_process, process_state
from tidepool.runtime.settings import InstanceSettings, Placement, resolve_device
from tidepool.spec import ConfigError


def has_cuda() -> bool:
    return True


def no_cuda() -> bool:
    return False


@pytest.mark.parametrize(
    ("parameter", "placement", "cuda", "device"),
    [
        ("auto", Placement("CPU", 0), has_cuda, "cpu"),  # a KIND_CPU instance never takes the GPU
        ("auto", Placement("GPU", 1), has_cuda, "cuda:1"),  # the GPU Triton gave, not always GPU 0
        ("auto", Placement("MODEL", 0), has_cuda, "cuda:0"),
        ("auto", Placement("MODEL", 0), no_cuda, "cpu"),
        ("auto", Placement(None, 0), no_cuda, "cpu"),  # outside Triton (profiler, tests)
        ("cuda", Placement("GPU", 3), has_cuda, "cuda:3"),
        ("cpu", Placement("MODEL", 0), has_cuda, "cpu"),
    ],
)
def test_the_device_follows_tritons_instance_group(parameter, placement, cuda, device):
    assert resolve_device(parameter, placement, cuda) == device


@pytest.mark.parametrize(
    ("parameter", "placement", "cuda", "message"),
    [
        ("cpu", Placement("GPU", 0), has_cuda, "DEVICE is cpu, but the instance_group asks for KIND_GPU"),
        ("cuda", Placement("CPU", 0), has_cuda, "DEVICE is cuda, but the instance_group asks for KIND_CPU"),
        ("auto", Placement("GPU", 0), no_cuda, "torch sees no CUDA device here"),
    ],
)
def test_a_placement_that_cannot_be_met_is_refused_with_the_reason(parameter, placement, cuda, message):
    with pytest.raises(ConfigError, match=message):
        resolve_device(parameter, placement, cuda)


def test_placement_is_read_from_the_initialize_args():
    args = {
        "model_instance_kind": "GPU",
        "model_instance_device_id": "2",
        "model_name": "encoder",
        "model_instance_name": "encoder_0_0",
    }
    parent = os.getppid()  # a stub's parent is the server whose ledger its pools share
    assert Placement.from_triton_args(args) == Placement("GPU", 2, "encoder", "encoder_0_0", parent)
    assert Placement.from_triton_args({}) == Placement(None, 0, server_pid=parent)


def test_the_settings_record_the_device_index_of_a_gpu_instance():
    settings = InstanceSettings.from_spec(tokens_spec(), Placement("GPU", 1), has_cuda)
    assert settings.on_gpu and settings.device == "cuda:1" and settings.device_index == 1


def test_a_kind_cpu_instance_stays_on_the_cpu_where_torch_sees_a_gpu(pb_utils, tmp_path, monkeypatch):
    from tidepool.runtime.model import TritonPythonModel

    monkeypatch.setattr(torch.cuda, "is_available", has_cuda)  # a GPU machine, as torch sees it
    model = TritonPythonModel()
    model.initialize(
        {
            "model_config": json.dumps(TOKENS_CONFIG),
            "model_repository": str(tiny_model_dir(tmp_path)),
            "model_name": "tokens",
            "model_instance_name": "tokens_0",
            "model_instance_kind": "CPU",
            "model_instance_device_id": "0",
        }
    )
    assert model.instance.device == torch.device("cpu") and model.instance.pool.kind == "host"
    model.finalize()


@pytest.fixture
def fresh_process(monkeypatch):
    """Process settings as if no instance had configured this process yet; restored afterwards."""
    threads = torch.get_num_threads()
    monkeypatch.setattr(process, "_configured", False)
    yield
    torch.set_num_threads(threads)


def test_a_second_instance_changing_the_process_says_so_and_both_report_the_truth(fresh_process):
    first, notes = configure_process(ProcessRequest(torch_threads=1, retain_heap=False))
    assert first.torch_threads == 1 and notes == []
    second, notes = configure_process(ProcessRequest(torch_threads=2, retain_heap=False))
    assert "torch threads changed from 1 to 2 for every instance of this process" in notes
    now = process_state()
    assert now.torch_threads == second.torch_threads == 2


def test_the_attention_fast_path_is_off_for_a_block_that_asks_and_on_again_after_it():
    # Per forward pass, not per process: an int8 instance (quantized Linear has no float weights
    # for the fused kernel) must not slow an fp32 instance of the same process.
    seen = []
    for off in (True, False):
        with process.attention_fast_path_off(off):
            seen.append(torch.backends.mha.get_fastpath_enabled())
    assert seen == [False, True] and torch.backends.mha.get_fastpath_enabled()
    with pytest.raises(RuntimeError), process.attention_fast_path_off(True):
        raise RuntimeError("a failed pass")
    assert torch.backends.mha.get_fastpath_enabled()  # back on after a failure too
