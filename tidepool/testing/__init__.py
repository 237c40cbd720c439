"""Helpers that tests and benchmarks share, so that no benchmark imports the tests: the checkout's
example and test models, repositories built from them, variants of a model with other
parameters. They need a checkout of the repository, not just the installed package."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from tidepool.clients.connection import Connection
from tidepool.configfile import copy_model, read_config, with_parameters
from tidepool.inputs import random_inputs

REPO_ROOT = Path(__file__).resolve().parents[2]
MODEL_REPOSITORY = REPO_ROOT / "model_repository"
TEST_MODELS = REPO_ROOT / "tests" / "integration" / "models"


def linked_repository(root: Path, *sources: Path) -> Path:
    """Models linked into `root`: each source is a model directory or a directory of models
    (default: the example and the test models)."""
    for source in sources or (MODEL_REPOSITORY, TEST_MODELS):
        models = [source] if (source / "config.pbtxt").is_file() else list(source.iterdir())
        for model in models:
            if (model / "config.pbtxt").is_file():
                (root / model.name).symlink_to(model.resolve(), target_is_directory=True)
    return root


def model_variant(source: Path, target_root: Path, name: str, **parameters: str) -> Path:
    """A copy of the model at `source` named `name`, with backend parameters overridden."""
    return copy_model(
        source, target_root / name, with_parameters(read_config(source / "config.pbtxt"), **parameters)
    )


def unexplained_tracebacks(log_lines: list[str] | tuple[str, ...]) -> list[str]:
    """The tracebacks in a server's log that are not a model's own failure, which the backend logs
    on purpose ("the model failed:" on the line before, its client told only type and message)."""
    lines = list(log_lines)  # tritonserver writes a message's newlines as \\n, on one line
    return [
        line for index, line in enumerate(lines)
        if "Traceback" in line and "the model failed:" not in line
        and not (index and "the model failed:" in lines[index - 1])
    ]  # fmt: skip


def cuda_available() -> bool:
    try:
        import torch

        return bool(torch.cuda.is_available())
    except Exception:
        return False


EXAMPLE_MODELS = ("encoder", "convnet")


def check_examples_answer(connection: Connection, seed: int = 0) -> None:
    """Each example model answers a valid batch of 2 with outputs of its config's shape, all finite;
    AssertionError otherwise."""
    for model in EXAMPLE_MODELS:
        spec = connection.model_spec(model)
        [output] = spec.outputs
        served = connection.infer(model, random_inputs(spec, batch=2, seed=seed), spec)
        assert served[output.name].shape == (2, *output.dims), (model, served[output.name].shape)
        assert np.isfinite(served[output.name]).all(), model
