"""The `tidepool` backend as Triton loads it (installed as <backends>/tidepool/model.py): a thin
TritonPythonModel that turns pb_utils objects into numpy and back around backend.instance."""

from __future__ import annotations

import json

import triton_python_backend_utils as pb_utils

from backend.instance import ModelInstance
from backend.validation import RequestError


def error_response(error: RequestError):
    code = getattr(pb_utils.TritonError, error.code, pb_utils.TritonError.INTERNAL)
    return pb_utils.InferenceResponse(error=pb_utils.TritonError(str(error), code))


class TritonPythonModel:
    def initialize(self, args: dict) -> None:
        config = json.loads(args["model_config"])
        # For a model served by a named Python-based backend, model_repository is the model's
        # own directory (the one that holds config.pbtxt).
        self.instance = ModelInstance.load(config, args["model_repository"])
        self.name = args["model_name"]

    def execute(self, requests: list) -> list:
        inputs = [{tensor.name(): tensor.as_numpy() for tensor in r.inputs()} for r in requests]
        responses = []
        for result in self.instance.execute(inputs):
            if isinstance(result, RequestError):
                responses.append(error_response(result))
            else:
                tensors = [pb_utils.Tensor(name, array) for name, array in result.items()]
                responses.append(pb_utils.InferenceResponse(output_tensors=tensors))
        return responses

    def finalize(self) -> None:
        self.instance = None
