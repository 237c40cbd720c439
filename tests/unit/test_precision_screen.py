"""Which lower precisions and graphs planning profiles: the screens (outputs against fp32 or eager
within the budget, then faster) on a real model, and the profiles taken from their verdicts."""

from __future__ import annotations

import pytest
import torch

from tidepool.planning import profiler, screens
from tidepool.planning.profile import Profile
from tidepool.planning.quality import QualityBudget
from tidepool.planning.screens import (
    GraphScreen,
    PrecisionScreen,
    profiles_to_plan,
    screen_graph,
    screen_precision,
)
from tidepool.runtime.graph import weight_tensors
from tidepool.testing import MODEL_REPOSITORY

ENCODER = MODEL_REPOSITORY / "encoder"


def test_a_precision_whose_outputs_are_over_the_budget_is_not_timed():
    screen = screen_precision(ENCODER, "cpu", "int8", QualityBudget(max_abs=0.0), batch=2, torch_threads=1)
    assert not screen.kept and screen.speedup == 0.0
    assert screen.output_error > 0 and "(--max-output-error 0): over the budget" in screen.reason


@pytest.mark.parametrize(("speedup", "kept"), [(1.05, True), (1.049, False), (0.9, False)])
def test_a_precision_within_the_budget_is_kept_only_from_its_threshold_speedup(monkeypatch, speedup, kept):
    """The timing is fixed (the real one is measured below): the verdict is the rule's, exactly."""
    monkeypatch.setattr(screens, "_speedup", lambda *args: speedup)
    screen = screen_precision(ENCODER, "cpu", "int8", QualityBudget(max_abs=1.0), batch=2, torch_threads=1)
    assert 0 < screen.output_error <= 1.0
    assert screen.speedup == speedup and screen.kept is kept
    assert f"{speedup:.2f}x its speed at batch 2" in screen.reason


def test_a_precision_within_the_budget_is_timed_against_fp32():
    screen = screen_precision(
        ENCODER, "cpu", "int8", QualityBudget(max_abs=1.0), batch=2, torch_threads=1, seconds=0.6
    )
    assert screen.speedup > 0  # measured: int8 against fp32, both timed in turn


@pytest.mark.parametrize(
    ("lone", "batched", "graph"),
    [(1.03, 0.98, "frozen"), (1.029, 1.5, "eager"), (1.2, 0.97, "eager")],
)
def test_a_frozen_graph_is_kept_where_it_is_faster_alone_and_not_slower_batched(
    monkeypatch, lone, batched, graph
):
    timings = iter((lone, batched))
    monkeypatch.setattr(screens, "_speedup", lambda *args: next(timings))
    screen = screen_graph(ENCODER, "cpu", max_output_error=0.0, torch_threads=1)
    assert screen.error == 0.0  # the encoder freezes bit for bit
    assert screen.speedups == (lone, batched) and screen.graph == graph
    assert screen.reason.startswith(graph) and "for a lone request" in screen.reason


def test_only_the_precisions_the_screen_keeps_are_profiled_at_every_split(monkeypatch):
    verdicts = {"bf16": False, "int8": True}
    screened: list[tuple[str, int | None]] = []

    def screen(model_dir, device, precision, quality, torch_threads=None, **_):
        screened.append((precision, torch_threads))
        return PrecisionScreen(precision, {"Y_max_abs": 0.004}, 1.5, 8, verdicts[precision], "why")

    def screen_graph(model_dir, device, max_output_error, torch_threads=None, **_):
        screened.append(("graph", torch_threads))
        return GraphScreen("frozen", 0.0, 0.0, (1.1, 1.05), "frozen: why")

    measured = []

    def measure(precision: str, threads: int, known: dict[str, float] | None, graph: str) -> Profile:
        measured.append((precision, threads, known, graph))
        return Profile("m", "cpu", precision, threads, 0, [])

    monkeypatch.setattr(screens, "screen_precision", screen)
    monkeypatch.setattr(screens, "screen_graph", screen_graph)
    quality = QualityBudget(max_abs=0.01)
    profiles, verdicts, graph = profiles_to_plan(ENCODER, [2, 1], ["fp32", "bf16", "int8"], quality, measure)
    assert screened == [("graph", 2), ("bf16", 2), ("int8", 2)]  # at the first split only
    assert [s.precision for s in verdicts] == ["bf16", "int8"] and graph.graph == "frozen"
    known = {"Y_max_abs": 0.004}
    # The frozen graph is profiled for fp32; a lower precision runs eager.
    assert measured == [
        ("fp32", 2, None, "frozen"),
        ("int8", 2, known, "eager"),
        ("fp32", 1, None, "frozen"),
        ("int8", 1, known, "eager"),
    ]
    assert [p.graph_reason for p in profiles] == ["frozen: why", "", "frozen: why", ""]
    assert [(p.precision, p.torch_threads) for p in profiles] == [
        ("fp32", 2),
        ("int8", 2),
        ("fp32", 1),
        ("int8", 1),
    ]


def test_an_int8_screen_leaves_the_fp32_profiles_after_it_as_they_serve():
    # One process screens int8 and then profiles fp32. The int8 instance used to turn torch's fused
    # attention fast path off for the whole process, so the fp32 profiles were measured without it
    # (the frozen trace recorded separate linear and attention operators) and a Tensor-typed
    # constant of that trace held a Python int, which broke the static-bytes sum.
    screen_precision(ENCODER, "cpu", "int8", QualityBudget(max_abs=0.0), batch=2, torch_threads=1)
    assert torch.backends.mha.get_fastpath_enabled()
    frozen, eager = (
        profiler.profiling_instance(ENCODER, (1, 2), "cpu", "fp32", 1, graph=graph)
        for graph in ("frozen", "eager")
    )
    try:
        operators = {node.kind() for node in frozen.module.graph.nodes()}
        assert "aten::_transformer_encoder_layer_fwd" in operators, sorted(operators)
        assert all(isinstance(t, torch.Tensor) for t in weight_tensors(frozen.module))
        # Freezing pools the four identical layers' constants (32.9 against 42.0 MiB), no more.
        assert 0.7 < profiler._static_bytes(frozen.module) / profiler._static_bytes(eager.module) <= 1.0
    finally:
        frozen.close()
        eager.close()
