"""The graph a model instance runs (the GRAPH parameter): the eager module as loaded, or its
TorchScript trace frozen (weights inlined as constants, BatchNorm folded into convolutions),
which spends less Python per forward pass. A frozen graph is checked against the eager module at
load on inputs of another batch size than it was traced at, so a trace that fixed a shape or a
branch fails the load with a message instead of serving wrong answers."""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from typing import Any

import torch

from tidepool.runtime.loader import ModelLoadError

# A frozen graph may round differently from the eager module (folding, fused kernels); what it
# must not do is compute something else. Relative to the largest eager output value.
LOAD_CHECK_TOLERANCE = 1e-2


class GraphError(ModelLoadError):
    """The model cannot run as the graph its config asks for; says why and what to set instead."""


def _flat_outputs(raw: Any) -> list[torch.Tensor]:
    """A module's outputs (a tensor, a tuple or a dict by name) as one list in a fixed order."""
    if isinstance(raw, torch.Tensor):
        return [raw]
    if isinstance(raw, dict):
        return [raw[key] for key in sorted(raw)]
    return list(raw)


def largest_difference(ours: Any, reference: Any) -> float:
    """The largest absolute difference over every output, relative to the reference's largest value."""
    worst = 0.0
    for a, b in zip(_flat_outputs(ours), _flat_outputs(reference), strict=True):
        if a.shape != b.shape:
            return float("inf")
        scale = float(b.abs().max()) if b.numel() else 0.0
        difference = float((a.float() - b.float()).abs().max()) if b.numel() else 0.0
        worst = max(worst, difference / (scale or 1.0))
    return worst


def freeze(
    module: torch.nn.Module,
    trace_inputs: Sequence[torch.Tensor],
    check_inputs: Sequence[Sequence[torch.Tensor]],
) -> tuple[torch.nn.Module, list[str]]:
    """`module` traced on `trace_inputs` and frozen, checked on each of `check_inputs` against
    the eager module; and notes for the log (what the tracer warned about)."""
    notes: list[str] = []
    with warnings.catch_warnings(record=True) as caught, torch.inference_mode(False), torch.no_grad():
        warnings.simplefilter("always", torch.jit.TracerWarning)
        try:
            traced = (
                module
                if isinstance(module, torch.jit.ScriptModule)
                else torch.jit.trace(module, tuple(trace_inputs), strict=False, check_trace=False)  # type: ignore[no-untyped-call]
            )
            frozen: torch.nn.Module = torch.jit.freeze(traced.eval())
        except Exception as exc:
            raise GraphError(
                f"GRAPH=frozen: tracing the model failed ({type(exc).__name__}: {exc}); set GRAPH=eager"
            ) from exc
    tracer_warnings = [w for w in caught if issubclass(w.category, torch.jit.TracerWarning)]
    if tracer_warnings:
        notes.append(
            f"GRAPH=frozen: the tracer warned {len(tracer_warnings)} time(s), first: "
            f"{str(tracer_warnings[0].message).splitlines()[0]}"
        )
    with torch.inference_mode():
        for inputs in check_inputs:
            try:
                difference = largest_difference(frozen(*inputs), module(*inputs))
            except Exception as exc:
                raise GraphError(
                    f"GRAPH=frozen: the frozen graph fails on inputs of shape "
                    f"{[list(t.shape) for t in inputs]} ({type(exc).__name__}: {exc}); set GRAPH=eager"
                ) from exc
            if difference > LOAD_CHECK_TOLERANCE:
                raise GraphError(
                    f"GRAPH=frozen: the frozen graph's outputs differ from the model's by {difference:.3g} "
                    f"(relative) on inputs of shape {[list(t.shape) for t in inputs]}: the trace fixed a "
                    "shape or a branch of the model; set GRAPH=eager"
                )
    return frozen, notes


def weight_tensors(module: torch.nn.Module) -> list[torch.Tensor]:
    """The tensors a module keeps: its state dict, and for a frozen graph the constants its
    weights became."""
    from torch.utils._pytree import tree_flatten

    tensors = [t for t in tree_flatten(dict(module.state_dict()))[0] if isinstance(t, torch.Tensor)]
    graph = getattr(module, "graph", None)
    if graph is not None:
        for node in graph.findAllNodes("prim::Constant"):
            value = node.output().toIValue() if node.output().type().kind() == "TensorType" else None
            # A constant typed Tensor may hold a Python number (seen in a trace of the encoder's
            # attention taken with torch's fused fast path off); it is no weight.
            if isinstance(value, torch.Tensor):
                tensors.append(value)
    return tensors
