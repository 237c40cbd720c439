"""The fake pb_utils refuses what the real stub refuses (python_backend r24.10), so that a unit test
passing on the fake says something about the real server."""

from __future__ import annotations

import numpy as np
import pytest

from tests.fake_pb_utils import TritonModelException


def test_metrics_take_buckets_exactly_when_the_real_stub_does(pb_utils):
    histogram = pb_utils.MetricFamily("h", "a histogram", pb_utils.MetricFamily.HISTOGRAM)
    gauge = pb_utils.MetricFamily("g", "a gauge", pb_utils.MetricFamily.GAUGE)
    with pytest.raises(TritonModelException, match="Missing required buckets"):
        histogram.Metric(labels={"model": "m"})
    with pytest.raises(TritonModelException, match="Unexpected buckets found"):
        gauge.Metric(labels={"model": "m"}, buckets=[1.0])
    with pytest.raises(TritonModelException, match="Buckets must be a list"):
        histogram.Metric(labels={}, buckets=(1, 2))
    histogram.Metric(labels={"model": "m"}, buckets=[1, 2]).observe(1)


def test_requests_are_made_with_the_real_constructors_arguments(pb_utils):
    tensor = pb_utils.Tensor("X", np.zeros((1, 2), np.float32))
    with pytest.raises(TypeError):
        pb_utils.InferenceRequest([tensor])  # the first positional argument is the request id
    request = pb_utils.InferenceRequest(inputs=[tensor], requested_output_names=["Y"], model_name="m")
    assert request.inputs() == [tensor]


def test_a_dlpack_tensor_on_the_host_reads_as_numpy(pb_utils):
    import torch

    made = pb_utils.Tensor.from_dlpack("Y", torch.arange(4, dtype=torch.float32))
    assert made.is_cpu() and made.as_numpy().tolist() == [0.0, 1.0, 2.0, 3.0]
    with pytest.raises(TritonModelException, match="not supported"):
        pb_utils.Tensor.from_dlpack("Y", [1, 2])


def test_from_dlpack_shares_the_memory_and_refuses_what_the_real_stub_refuses(pb_utils):
    import torch

    source = torch.arange(6, dtype=torch.float32).reshape(2, 3)
    tensor = pb_utils.Tensor.from_dlpack("OUT", source)
    source[0, 0] = 42.0  # written after the call: the stub reads the memory later, so it sees it
    assert tensor.read()[0, 0] == 42.0 and tensor.as_numpy()[0, 0] == 42.0
    with pytest.raises(pb_utils.TritonModelException, match="not contiguous"):
        pb_utils.Tensor.from_dlpack("OUT", source.t())
