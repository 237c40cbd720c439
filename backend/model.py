"""The `tidepool` backend as Triton loads it (installed as <backends>/tidepool/model.py): a thin
TritonPythonModel that turns pb_utils objects into numpy and back around backend.instance."""

from __future__ import annotations

import json
import os

# torch reads its allocator backend at CUDA initialisation: with cudaMallocAsync, a model's own
# GPU allocations come from the device's current pool, which the instance sets to its own.
os.environ.setdefault("PYTORCH_CUDA_ALLOC_CONF", "backend:cudaMallocAsync")

import numpy as np  # noqa: E402
import triton_python_backend_utils as pb_utils  # noqa: E402

from backend.instance import ModelInstance  # noqa: E402
from backend.metrics import InstanceMetrics  # noqa: E402
from backend.validation import RequestError  # noqa: E402


def error_response(error: RequestError):
    code = getattr(pb_utils.TritonError, error.code, pb_utils.TritonError.INTERNAL)
    return pb_utils.InferenceResponse(error=pb_utils.TritonError(str(error), code))


def output_tensor(name: str, value):
    if isinstance(value, np.ndarray):
        # Host outputs are views of pool blocks that go back to the pool when execute returns.
        # The stub copies them into its shared memory right after execute returns, before this
        # instance runs anything else, so nothing can write to those blocks in between.
        return pb_utils.Tensor(name, value)
    from torch.utils.dlpack import to_dlpack

    return pb_utils.Tensor.from_dlpack(name, to_dlpack(value))  # GPU: no copy back to the host


class TritonPythonModel:
    def initialize(self, args: dict) -> None:
        config = json.loads(args["model_config"])
        # For a model served by a named Python-based backend, model_repository is the model's
        # own directory (the one that holds config.pbtxt).
        self.instance = ModelInstance.load(config, args["model_repository"])
        self.metrics = InstanceMetrics(pb_utils, args["model_name"], args["model_instance_name"])
        pool = self.instance.pool
        pb_utils.Logger.log_info(
            f"tidepool {args['model_instance_name']}: "
            + (f"pool {pool.kind} ({pool.kind_reason})" if pool else "pool off (POOL=off)")
            + f"; C heap: {self.instance.heap_retention.reason}"
        )
        self._record()

    def execute(self, requests: list) -> list:
        inputs = [{tensor.name(): tensor.as_numpy() for tensor in r.inputs()} for r in requests]
        responses = []
        for result in self.instance.execute(inputs):
            if isinstance(result, RequestError):
                responses.append(error_response(result))
            else:
                tensors = [output_tensor(name, value) for name, value in result.items()]
                responses.append(pb_utils.InferenceResponse(output_tensors=tensors))
        self._record()
        return responses

    def _record(self) -> None:
        for rows in self.instance.batches_run:
            self.metrics.record_batch(rows)
        self.metrics.record_page_faults(self.instance.page_faults)
        if self.instance.pool is not None:
            self.metrics.record_pool(self.instance.pool.stats())

    def finalize(self) -> None:
        self.instance.close()
