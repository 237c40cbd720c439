"""Which lower precisions planning profiles: the screen (outputs against fp32 within the budget,
then faster than fp32) on a real model, and the profiles taken from its verdicts."""

from __future__ import annotations

from tidepool.planning import profiler
from tidepool.planning.profile import Profile
from tidepool.planning.profiler import PrecisionScreen, profiles_to_plan, screen_precision
from tidepool.testing import MODEL_REPOSITORY

ENCODER = MODEL_REPOSITORY / "encoder"


def test_a_precision_whose_outputs_are_over_the_budget_is_not_timed():
    screen = screen_precision(ENCODER, "cpu", "int8", max_output_error=0.0, batch=2, torch_threads=1)
    assert not screen.kept and screen.speedup == 0.0
    assert screen.output_error > 0 and "> --max-output-error 0.0" in screen.reason


def test_a_precision_within_the_budget_is_timed_against_fp32():
    screen = screen_precision(
        ENCODER, "cpu", "int8", max_output_error=1.0, batch=2, torch_threads=1, seconds=0.6
    )
    assert 0 < screen.output_error <= 1.0 and screen.speedup > 0
    assert screen.kept == (screen.speedup >= profiler.SPEEDUP_TO_KEEP)
    assert f"{screen.speedup:.2f}x its speed at batch 2" in screen.reason


def test_only_the_precisions_the_screen_keeps_are_profiled_at_every_split(monkeypatch):
    verdicts = {"bf16": False, "int8": True}
    screened: list[tuple[str, int | None]] = []

    def screen(model_dir, device, precision, max_output_error, torch_threads=None, **_):
        screened.append((precision, torch_threads))
        return PrecisionScreen(precision, {"Y_max_abs": 0.004}, 1.5, 8, verdicts[precision], "why")

    measured = []

    def measure(precision: str, threads: int, known: dict[str, float] | None) -> Profile:
        measured.append((precision, threads, known))
        return Profile("m", "cpu", precision, threads, 0, [])

    monkeypatch.setattr(profiler, "screen_precision", screen)
    profiles, screens = profiles_to_plan(ENCODER, [2, 1], ["fp32", "bf16", "int8"], 0.01, measure)
    assert screened == [("bf16", 2), ("int8", 2)]  # at the first split only
    assert [s.precision for s in screens] == ["bf16", "int8"]
    known = {"Y_max_abs": 0.004}
    assert measured == [("fp32", 2, None), ("int8", 2, known), ("fp32", 1, None), ("int8", 1, known)]
    assert [(p.precision, p.torch_threads) for p in profiles] == [
        ("fp32", 2),
        ("int8", 2),
        ("fp32", 1),
        ("int8", 1),
    ]
