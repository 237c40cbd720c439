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
    """
)


def tokens_spec() -> ModelSpec:
    return parse_model_config(json.dumps(TOKENS_CONFIG))


def tiny_model_dir(root: Path) -> Path:
    model_dir = root / "tokens"
    model_dir.mkdir(parents=True, exist_ok=True)
    (model_dir / "tiny.py").write_text(TINY_MODEL)
    return model_dir
