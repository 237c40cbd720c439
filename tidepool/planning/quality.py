"""Whether a lower precision's outputs are close enough to fp32's, in the terms its users judge a
model by: the largest absolute difference (`--max-output-error`), the cosine similarity of an
output's rows (`--min-cosine`, for embeddings) or the share of rows whose top-1 class agrees
(`--min-top1`, for classifiers). Numpy only: the planner's choosing side never loads torch."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class QualityBudget:
    """What a lower precision must keep. Each budget given must hold; without a cosine or top-1
    budget the max-abs one decides (0: fp32 only)."""

    max_abs: float = 0.0
    min_cosine: float | None = None
    min_top1: float | None = None
    output: str | None = None  # the output the cosine and top-1 budgets judge (default: every one)

    @property
    def allows_lower_precision(self) -> bool:
        return self.max_abs > 0 or self.min_cosine is not None or self.min_top1 is not None

    def describe(self) -> str:
        given = [f"max abs {self.max_abs:g}"] if self.max_abs > 0 or not self.allows_lower_precision else []
        given += [f"cosine >= {self.min_cosine:g}"] if self.min_cosine is not None else []
        given += [f"top-1 agreement >= {self.min_top1:g}"] if self.min_top1 is not None else []
        return ", ".join(given) + (f" (output {self.output})" if self.output else "")


def row_measures(ours: np.ndarray, reference: np.ndarray) -> dict[str, float]:
    """Per output: the worst cosine similarity of a row (each row flattened), and where rows end
    in classes (a last dimension over 1), the share of rows whose argmax agrees."""
    a = ours.reshape(len(ours), -1) if ours.ndim > 1 else ours.reshape(-1, 1)
    b = reference.reshape(len(reference), -1) if reference.ndim > 1 else reference.reshape(-1, 1)
    norms = np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1)
    cosine = np.where(norms > 0, (a * b).sum(axis=1) / np.where(norms > 0, norms, 1.0), 1.0)
    measures = {"cosine_min": float(cosine.min()) if cosine.size else 1.0}
    if ours.ndim >= 2 and ours.shape[-1] > 1:
        measures["top1"] = float((ours.argmax(axis=-1) == reference.argmax(axis=-1)).mean())
    return measures


def judge(difference: Mapping[str, float], budget: QualityBudget) -> tuple[bool, str]:
    """Whether measured differences (profiler.compare_outputs' keys) meet the budget, and what
    was measured against what."""
    outputs = sorted(key.removesuffix("_max_abs") for key in difference if key.endswith("_max_abs"))
    judged: Sequence[str] = [budget.output] if budget.output else outputs
    checks = []
    if budget.min_cosine is not None:
        worst = min(difference.get(f"{name}_cosine_min", -1.0) for name in judged)
        checks.append(
            (worst >= budget.min_cosine, f"cosine {worst:.5f} (--min-cosine {budget.min_cosine:g})")
        )
    if budget.min_top1 is not None:
        agreement = min(difference.get(f"{name}_top1", 0.0) for name in judged)
        checks.append(
            (agreement >= budget.min_top1, f"top-1 {agreement:.4f} (--min-top1 {budget.min_top1:g})")
        )
    if budget.max_abs > 0 or not checks:
        error = max((v for k, v in difference.items() if k.endswith("_max_abs")), default=0.0)
        checks.append(
            (error <= budget.max_abs, f"max abs {error:.3g} (--max-output-error {budget.max_abs:g})")
        )
    return all(ok for ok, _ in checks), "; ".join(text for _, text in checks)
