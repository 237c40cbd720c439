"""Shared fixtures: the fake pb_utils for unit tests, and paths of the example models."""

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
