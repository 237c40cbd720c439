"""GRAPH=frozen: the instance runs its model traced and frozen, with the eager module's answers, and
a model that cannot be frozen faithfully fails the load with a message instead of serving."""

from __future__ import annotations

import copy
import textwrap

import numpy as np
import pytest
import torch

from tests.unit.specs import TOKENS_CONFIG, tiny_model_dir
from tidepool.inputs import random_inputs
from tidepool.runtime.graph import GraphError, freeze, weight_tensors
from tidepool.runtime.instance import ModelInstance


def config(graph: str, factory: str = "tiny:build") -> dict:
    result = copy.deepcopy(TOKENS_CONFIG)
    result["parameters"]["GRAPH"] = {"string_value": graph}
    result["parameters"]["MODEL_FACTORY"] = {"string_value": factory}
    return result


def test_a_frozen_instance_answers_as_the_eager_one(tmp_path):
    model_dir = tiny_model_dir(tmp_path)
    eager = ModelInstance.load(config("eager"), model_dir)
    frozen = ModelInstance.load(config("frozen"), model_dir)
    assert isinstance(frozen.module, torch.jit.ScriptModule) and "frozen graph" in frozen.describe()
    requests = [random_inputs(eager.model, batch=rows, seed=rows) for rows in (1, 3)]
    expected = [{k: np.array(v) for k, v in r.items()} for r in eager.execute(requests).results]
    got = frozen.execute(requests).results
    for ours, reference in zip(got, expected, strict=True):
        np.testing.assert_array_equal(ours["OUT"], reference["OUT"])
    eager.close()
    frozen.close()


# Runs another computation for a batch of one: a trace at batch 2 records only the batched branch.
SHAPE_BRANCH = textwrap.dedent(
    """
    import torch

    class Branchy(torch.nn.Module):
        def forward(self, ids, scale):
            if ids.shape[0] == 1:
                return ids.float() * scale * 2
            return ids.float() * scale

    def build():
        return Branchy()
    """
)

NOT_TRACEABLE = textwrap.dedent(
    """
    import torch

    class WithNote(torch.nn.Module):
        def forward(self, ids, scale):
            return {"OUT": ids.float() * scale, "note": "not a tensor"}

    def build():
        return WithNote()
    """
)


@pytest.mark.parametrize(
    ("source", "message"),
    [
        (SHAPE_BRANCH, "the trace fixed a shape or a branch"),
        (NOT_TRACEABLE, "tracing the model failed"),
    ],
)
def test_a_model_that_cannot_be_frozen_faithfully_fails_the_load_and_says_so(tmp_path, source, message):
    model_dir = tiny_model_dir(tmp_path)
    (model_dir / "odd.py").write_text(source)
    with pytest.raises(GraphError, match=message) as caught:
        ModelInstance.load(config("frozen", "odd:build"), model_dir)
    assert "set GRAPH=eager" in str(caught.value)
    ModelInstance.load(config("eager", "odd:build"), model_dir).close()  # eager still serves it


def test_a_frozen_graphs_weights_are_its_constants():
    module = torch.nn.Sequential(torch.nn.Linear(8, 4), torch.nn.ReLU()).eval()
    frozen, notes = freeze(module, [torch.randn(2, 8)], [[torch.randn(1, 8)]])
    assert notes == [] and dict(frozen.state_dict()) == {}  # the weights left the state dict ...
    sizes = sorted(t.numel() for t in weight_tensors(frozen))
    assert sizes == [4, 32]  # ... and became constants: bias and weight of the Linear
