"""The baseline Tidepool is measured against: a model served by Triton's plain Python backend the
way people write one by hand (concatenate the requests, one forward pass, split), with no pool,
no validation and no planning. Copied as <model>/1/model.py by plain_backend.plain_model.

Parameters: FACTORY ('module:function' in the model directory), TORCH_NUM_THREADS."""

import importlib.util
import json
import os

import numpy as np
import torch
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        parameters = {key: value["string_value"] for key, value in config.get("parameters", {}).items()}
        torch.set_num_threads(int(parameters.get("TORCH_NUM_THREADS", "1")))
        module_name, function = parameters["FACTORY"].split(":")
        directory = os.path.join(args["model_repository"], "")
        if not os.path.isfile(os.path.join(directory, module_name + ".py")):
            directory = os.path.join(args["model_repository"], args["model_name"])
        spec = importlib.util.spec_from_file_location(
            module_name, os.path.join(directory, module_name + ".py")
        )
        assert spec is not None and spec.loader is not None, f"cannot load {module_name}.py"
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        self.model = getattr(module, function)().eval()
        self.inputs = [entry["name"] for entry in config["input"]]
        self.output = config["output"][0]["name"]

    def execute(self, requests):
        arrays = [
            [pb_utils.get_input_tensor_by_name(r, name).as_numpy() for name in self.inputs] for r in requests
        ]
        rows = [request_arrays[0].shape[0] for request_arrays in arrays]
        batch = [torch.from_numpy(np.concatenate([a[i] for a in arrays])) for i in range(len(self.inputs))]
        with torch.inference_mode():
            output = self.model(*batch).numpy()
        responses, start = [], 0
        for count in rows:
            tensor = pb_utils.Tensor(self.output, np.ascontiguousarray(output[start : start + count]))
            responses.append(pb_utils.InferenceResponse(output_tensors=[tensor]))
            start += count
        return responses
