"""Model specs and tiny model directories shared by the unit tests."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

from tidepool.spec import ModelSpec, parse_model_config

TOKENS_CONFIG = {
    "name": "tokens",
    "max_batch_size": 4,
    "input": [
        {"name": "IDS", "data_type": "TYPE_INT32", "dims": [6]},
        {"name": "SCALE", "data_type": "TYPE_FP32", "dims": [1]},
    ],
    "output": [{"name": "OUT", "data_type": "TYPE_FP32", "dims": [6]}],
    "parameters": {
        "MODEL_FACTORY": {"string_value": "tiny:build"},
        "range.IDS": {"string_value": "0,99"},
        "TORCH_NUM_THREADS": {"string_value": "1"},
    },
}

# OUT = IDS * SCALE, row by row: easy to check that every request gets its own rows back.
TINY_MODEL = textwrap.dedent(
    """
    import torch

    class Scale(torch.nn.Module):
        def forward(self, ids, scale):
            return ids.float() * scale

    def build():
        return Scale()

    class OutOfDeviceMemory(torch.nn.Module):
        # As torch on a full device: a pass of more than `most` rows (any, with `most` 0) fails.
        def __init__(self, most):
            super().__init__()
            self.most = most

        def forward(self, ids, scale):
            if ids.shape[0] > self.most:
                raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
            return ids.float() * scale

    def build_oom_above_two():
        return OutOfDeviceMemory(2)

    def build_oom_always():
        return OutOfDeviceMemory(0)
    """
)


def tokens_spec() -> ModelSpec:
    return parse_model_config(json.dumps(TOKENS_CONFIG))


def tiny_model_dir(root: Path) -> Path:
    model_dir = root / "tokens"
    model_dir.mkdir(parents=True, exist_ok=True)
    (model_dir / "tiny.py").write_text(TINY_MODEL)
    return model_dir


TEXT_CONFIG = {
    "name": "text",
    "max_batch_size": 8,
    "input": [
        {"name": "ids", "data_type": "TYPE_INT64", "dims": [-1], "allow_ragged_batch": True},
        {"name": "mask", "data_type": "TYPE_INT64", "dims": [-1], "allow_ragged_batch": True},
    ],
    "output": [
        {"name": "hidden", "data_type": "TYPE_FP32", "dims": [-1, 4]},
        {"name": "pooled", "data_type": "TYPE_FP32", "dims": [4]},
    ],
    "parameters": {
        "MODEL_FACTORY": {"string_value": "text:build"},
        "range.ids": {"string_value": "0,49"},
        "range.mask": {"string_value": "1,1"},
        "shape.ids": {"string_value": "8"},
        "shape.mask": {"string_value": "8"},
        "MAX_SEQUENCE_LENGTH": {"string_value": "40"},
        "LENGTH_BUCKET": {"string_value": "8"},
        "TORCH_NUM_THREADS": {"string_value": "1"},
    },
}

# A text model in miniature: every token sees the masked mean of the sequence (as attention would),
# so padding with a 0 mask changes nothing; `build_unmasked` ignores the mask (padding shows), and
# `build_halving` returns a token output half as long as its input (as a strided convolution does).
TEXT_MODEL = textwrap.dedent(
    """
    import torch

    class Text(torch.nn.Module):
        def __init__(self, masked=True, halving=False):
            super().__init__()
            torch.manual_seed(0)
            self.embed = torch.nn.Embedding(50, 4)
            self.masked, self.halving = masked, halving

        def forward(self, ids, mask):
            weights = (mask if self.masked else torch.ones_like(mask)).unsqueeze(-1).float()
            tokens = self.embed(ids)
            pooled = (tokens * weights).sum(1) / weights.sum(1)
            hidden = tokens + pooled.unsqueeze(1)
            if self.halving:
                hidden = hidden[:, ::2]
            return {"hidden": hidden, "pooled": pooled}

    def build():
        return Text()

    def build_unmasked():
        return Text(masked=False)

    def build_halving():
        return Text(halving=True)
    """
)


def text_config(**parameters: str) -> dict:
    """TEXT_CONFIG with these parameters set (a fresh copy)."""
    config = json.loads(json.dumps(TEXT_CONFIG))
    config["parameters"].update({key: {"string_value": value} for key, value in parameters.items()})
    return config


def text_model_dir(root: Path) -> Path:
    model_dir = root / "text"
    model_dir.mkdir(parents=True, exist_ok=True)
    (model_dir / "text.py").write_text(TEXT_MODEL)
    return model_dir
