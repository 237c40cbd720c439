"""Planning for text traffic, pure: a profile over rows x length fitted as latency and memory
functions of rows and tokens (and tokens x length, attention's quadratic part), and the settings
that serve a length mix best under the budgets: the bucket step, the token budget of one pass, what
a pass costs in tokens, and the rows per execution. The mix is played through the same pass
grouping the instances run (runtime/lengths.py), so the prediction sees their padding."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from tidepool import parameters as param
from tidepool.planning.choose import POOL_HEADROOM
from tidepool.planning.plan import MIB, Budgets, Plan
from tidepool.planning.profile import BatchPoint
from tidepool.runtime.lengths import plan_passes
from tidepool.sequences import Sequences
from tidepool.spec import LengthMix

BUCKETS = (8, 16, 32, 64)  # bucket steps tried
TOKEN_BUDGETS = tuple(2**n for n in range(7, 16))  # 128 .. 32768 padded tokens a pass
BUCKET_TIE = 0.02  # a larger bucket (fewer shapes) wins within this share of the best tokens/s
PLAYED_REQUESTS = 2048  # requests drawn from the mix for each prediction
MEASURED_LENGTHS = 4  # lengths of the mix a profile measures (its quantiles)
MOST_PROFILED_TOKENS = 8192  # rows double at each length until a pass holds this many tokens


def lengths_to_measure(mix: LengthMix, step: int = 8) -> list[int]:
    """The mix's 10th, 50th, 90th percentiles and its longest, rounded up to `step`."""
    quantiles = [mix.quantile(q) for q in (0.1, 0.5, 0.9)] + [mix.longest]
    rounded = {min(mix.longest, -(-n // step) * step) for n in quantiles}
    return sorted(rounded)[:MEASURED_LENGTHS]


@dataclass(frozen=True)
class LengthFit:
    """latency(rows, L) = fixed + per_token x rows x L + per_token_length x rows x L^2 (ms), and
    the same form for bytes: torch's activations and the pool's blocks (inputs and outputs)."""

    fixed_ms: float
    per_token_ms: float
    per_token_length_ms: float
    tensor_per_token: float
    tensor_per_token_length: float
    io_per_token: float
    io_per_row: float
    error: float  # the latency fit's largest relative error over the measured points

    @classmethod
    def of(cls, points: Sequence[BatchPoint]) -> LengthFit:
        rows = np.array([p.batch for p in points], dtype=float)
        length = np.array([p.length for p in points], dtype=float)
        latency = np.array([p.latency_p50_ms for p in points])
        tokens, squared = rows * length, rows * length**2
        ones = np.ones_like(rows)
        # Relative errors: a pass of one short request counts as much as one of 64 long ones.
        weight = 1.0 / latency
        fixed, per_token, per_square = _nonnegative(
            [c * weight for c in (ones, tokens, squared)], latency * weight
        )
        _, tensor_token, tensor_square = _nonnegative(
            [ones, tokens, squared], np.array([p.tensor_bytes for p in points])
        )
        io_token, io_row = _nonnegative([tokens, rows], np.array([p.io_bytes for p in points]))
        predicted = fixed + per_token * tokens + per_square * squared
        return cls(
            fixed, per_token, per_square, tensor_token, tensor_square, io_token, io_row,
            float(np.max(np.abs(predicted - latency) / latency)),
        )  # fmt: skip

    def pass_ms(self, rows: int, length: int) -> float:
        return self.fixed_ms + rows * length * (self.per_token_ms + self.per_token_length_ms * length)

    def pass_bytes(self, rows: int, length: int) -> float:
        """torch's activations and the pool's blocks of one pass."""
        tokens = rows * length
        return tokens * (
            self.tensor_per_token + self.tensor_per_token_length * length + self.io_per_token
        ) + (rows * self.io_per_row)

    def pass_cost_tokens(self, length: float) -> int:
        """A pass's own time in tokens at `length`: what padding may cost before two passes are cheaper."""
        per_token = self.per_token_ms + self.per_token_length_ms * length
        return int(round(self.fixed_ms / per_token)) if per_token > 0 else 0


def _nonnegative(columns: list[np.ndarray], target: np.ndarray) -> list[float]:
    """Least squares with every coefficient at least 0 (a negative one is dropped, the rest refitted)."""
    kept = list(range(len(columns)))
    while True:
        matrix = np.stack([columns[i] for i in kept], axis=1)
        solution, *_ = np.linalg.lstsq(matrix, target.astype(float), rcond=None)
        if (solution >= 0).all() or len(kept) == 1:
            coefficients = [0.0] * len(columns)
            for index, value in zip(kept, solution, strict=True):
                coefficients[index] = max(0.0, float(value))
            return coefficients
        kept.pop(int(np.argmin(solution)))


@dataclass(frozen=True)
class Played:
    """What a mix played through the pass grouping predicts: tokens/s of one busy instance, the
    share of padded positions, and the 99th percentile of an execution's time."""

    tokens_per_s: float
    padding: float
    p99_execution_ms: float


def play(mix: LengthMix, sequences: Sequences, fit: LengthFit, rows_per_execution: int) -> Played:
    """The mix's requests in arrival order, max_batch_size to an execution, grouped into passes as
    an instance groups them, each pass timed by the fit."""
    lengths = [min(n, sequences.max_length or n) for n in mix.draw(PLAYED_REQUESTS, seed=11)]
    real = padded = 0
    times = []
    for start in range(0, len(lengths), rows_per_execution):
        chunk = lengths[start : start + rows_per_execution]
        ones = [1] * len(chunk)
        passes = plan_passes(chunk, ones, [()] * len(chunk), sequences, pad=True)
        times.append(sum(fit.pass_ms(len(p.members), p.length) for p in passes))
        real += sum(chunk)
        padded += sum(len(p.members) * p.length for p in passes)
    seconds = sum(times) / 1e3
    return Played(real / seconds, (padded - real) / padded, float(np.percentile(times, 99)))


@dataclass(frozen=True)
class LengthPlan:
    """The settings written for a length mix (its sequence inputs take ragged batches), and why."""

    inputs: tuple[str, ...]  # the sequence inputs
    mix: LengthMix
    bucket: int
    max_batch_tokens: int
    pass_cost_tokens: int
    max_batch_size: int
    played: Played
    pool_bytes: int  # the pool's blocks of the largest execution the settings allow
    reasons: dict[str, str]  # by parameter name

    def settings(self) -> list[tuple[param.Parameter[Any], Any]]:
        """The parameters written, with their values."""
        return [
            (param.LENGTH_BUCKET, self.bucket),
            (param.MAX_BATCH_TOKENS, self.max_batch_tokens),
            (param.PASS_COST_TOKENS, self.pass_cost_tokens),
            (param.LENGTH_MIX, self.mix),
        ]

    def header(self) -> list[str]:
        p = self.played
        return [
            f"Planned for sequence lengths {self.mix.describe()}, {', '.join(self.inputs)} taking ragged "
            f"batches: predicted {p.tokens_per_s:.0f} tokens/s an instance, padding {p.padding:.1%}, p99 of "
            f"an execution {p.p99_execution_ms:.1f} ms.",
            *(f"{key}: {reason}" for key, reason in self.reasons.items()),
        ]


def plan_lengths(
    points: Sequence[BatchPoint],
    mix: LengthMix,
    sequences: Sequences,
    budgets: Budgets,
    max_batch_size: int,
    static_bytes: int,
) -> LengthPlan:
    """The token budget: the most padded tokens a pass at the mix's longest length may hold with
    its time (twice: one waited for, one run) inside the latency budget and its memory inside the
    memory budget. The pass cost: the fit's fixed time in tokens at the mean length. The bucket:
    the step whose played mix serves the most tokens/s (a larger one within BUCKET_TIE). The rows
    per execution: max_batch_size, halved while the p99 execution overruns half the latency budget."""
    fit = LengthFit.of(points)
    longest = min(mix.longest, sequences.max_length or mix.longest)
    usable = budgets.usable_bytes - static_bytes
    fitting = [
        budget
        for budget in TOKEN_BUDGETS
        if 2 * fit.pass_ms(max(1, budget // longest), longest) <= budgets.latency_ms
        and fit.pass_bytes(max(1, budget // longest), longest) <= usable
    ]
    token_budget = max(fitting, default=max(longest, TOKEN_BUDGETS[0]))
    cost = fit.pass_cost_tokens(mix.mean)
    base = replace(sequences, max_batch_tokens=token_budget, pass_cost_tokens=cost)
    rows = max_batch_size
    played = {step: play(mix, replace(base, bucket=step), fit, rows) for step in BUCKETS if step <= longest}
    played = played or {longest: play(mix, replace(base, bucket=longest), fit, rows)}
    best = max(p.tokens_per_s for p in played.values())
    bucket = max(step for step, p in played.items() if p.tokens_per_s >= (1 - BUCKET_TIE) * best)
    chosen = replace(base, bucket=bucket)
    outcome = played[bucket]
    while rows > 1 and outcome.p99_execution_ms * 2 > budgets.latency_ms:
        rows //= 2
        outcome = play(mix, chosen, fit, rows)
    largest_tokens = rows * longest
    pool_bytes = int(largest_tokens * fit.io_per_token + rows * fit.io_per_row)
    return LengthPlan(
        inputs=sequences.names,
        mix=mix,
        bucket=bucket,
        max_batch_tokens=token_budget,
        pass_cost_tokens=cost,
        max_batch_size=rows,
        played=outcome,
        pool_bytes=pool_bytes,
        reasons={
            param.MAX_BATCH_TOKENS.name: (
                f"a pass of {token_budget} tokens at length {longest} takes "
                f"{fit.pass_ms(max(1, token_budget // longest), longest):.1f} ms (fit within "
                f"{fit.error:.0%} of {len(points)} points), twice that within {budgets.latency_ms} ms, "
                f"{fit.pass_bytes(max(1, token_budget // longest), longest) / MIB:.1f} MiB"
            ),
            param.PASS_COST_TOKENS.name: f"a pass's own {fit.fixed_ms:.2f} ms in tokens at the mean length "
            f"{mix.mean:.0f}",
            param.LENGTH_BUCKET.name: "predicted tokens/s by step: "
            + ", ".join(
                f"{step} {p.tokens_per_s:.0f} (padding {p.padding:.1%})" for step, p in played.items()
            ),
            "max_batch_size (lengths)": (
                f"{rows} requests an execution: its p99 {outcome.p99_execution_ms:.1f} ms, twice that within "
                f"{budgets.latency_ms} ms"
            ),
        },
    )


def with_lengths(plan: Plan, lengths: LengthPlan) -> Plan:
    """`plan` serving a length mix: its sequence inputs ragged, its executions at most the rows the
    mix allows, and its pool's floor covering the largest execution those settings allow."""
    rows = min(plan.max_batch_size, lengths.max_batch_size)
    floor = min(plan.pool_limit_bytes, max(plan.pool_initial_bytes, int(POOL_HEADROOM * lengths.pool_bytes)))
    reasons = dict(plan.reasons)
    if rows < plan.max_batch_size:
        reasons["max_batch_size"] += f"; {lengths.reasons['max_batch_size (lengths)']}"
    if floor > plan.pool_initial_bytes:
        reasons["pool_initial_bytes"] = (
            f"the pool's blocks of the largest execution of the length mix ({rows} requests at the longest "
            f"length) + {POOL_HEADROOM - 1:.0%}"
        )
    return replace(plan, lengths=lengths, max_batch_size=rows, pool_initial_bytes=floor, reasons=reasons)
