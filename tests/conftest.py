"""Shared fixtures: paths of the example models, repositories built from them, the GPU skip."""

import shutil
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parent.parent
MODEL_REPOSITORY = REPO_ROOT / "model_repository"
TEST_MODELS = REPO_ROOT / "tests" / "integration" / "models"


def linked_repository(root: Path) -> Path:
    """The example models plus the test models, linked into one repository at `root`."""
    for model in [*MODEL_REPOSITORY.iterdir(), *TEST_MODELS.iterdir()]:
        if (model / "config.pbtxt").is_file():
            (root / model.name).symlink_to(model.resolve(), target_is_directory=True)
    return root


def model_variant(source: Path, target_root: Path, name: str, **parameters: str) -> Path:
    """A copy of the model at `source` named `name`, with backend parameters overridden."""
    from google.protobuf import text_format
    from tritonclient.grpc import model_config_pb2

    target = target_root / name
    shutil.copytree(source, target, ignore=shutil.ignore_patterns("__pycache__"))
    config = text_format.Parse((source / "config.pbtxt").read_text(), model_config_pb2.ModelConfig())
    config.name = name
    for key, text in parameters.items():
        config.parameters[key].string_value = text
    (target / "config.pbtxt").write_text(text_format.MessageToString(config))
    return target


def cuda_available() -> bool:
    try:
        import torch

        return torch.cuda.is_available()
    except Exception:
        return False


def pytest_collection_modifyitems(config, items):
    if cuda_available():
        return
    skip = pytest.mark.skip(
        reason="no CUDA device on this machine (run benchmarks/gpu_check.sh on a GPU host)"
    )
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
