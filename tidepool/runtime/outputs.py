"""A forward pass's outputs as the config declares them: named (a tensor, a tuple in output order,
or a dict by name, which a Hugging Face ModelOutput is) and of the declared shapes."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from tidepool.errors import TidepoolError
from tidepool.spec import TensorSpec, dims_match


class ModelOutputError(TidepoolError):
    """The model's outputs do not match what its config declares."""


def name_outputs(raw: Any, outputs: Sequence[TensorSpec]) -> dict[str, torch.Tensor]:
    names = [spec.name for spec in outputs]
    if isinstance(raw, dict):
        missing = [name for name in names if name not in raw]
        if missing:
            raise ModelOutputError(f"the model's output dict lacks {', '.join(missing)}")
        return raw
    values = [raw] if isinstance(raw, torch.Tensor) else list(raw)
    if len(values) != len(names):
        raise ModelOutputError(
            f"the model returned {len(values)} outputs, the config declares {len(names)} ({', '.join(names)})"
        )
    return dict(zip(names, values, strict=True))


def check_shape(spec: TensorSpec, shape: tuple[int, ...], rows: int | None) -> None:
    expected = ((rows,) if rows is not None else ()) + spec.dims
    if not dims_match(shape, expected):
        raise ModelOutputError(
            f"output {spec.name} has shape {list(shape)}, the config declares {list(expected)}"
        )
