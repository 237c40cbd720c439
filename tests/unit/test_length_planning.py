"""Planning for a length mix without a model: the mix as written, requests read from ragged sample
files, the fit over rows x length, and the settings chosen from it under the budgets."""

from __future__ import annotations

import json

import numpy as np
import pytest

from tests.unit.specs import text_config
from tidepool.inputs import InputFileError, load_requests
from tidepool.planning.lengths import LengthFit, plan_lengths
from tidepool.planning.plan import Budgets
from tidepool.planning.profile import BatchPoint
from tidepool.sequences import Sequences
from tidepool.spec import ConfigError, LengthMix, parse_model_config

MODEL = parse_model_config(text_config())


def test_a_mix_is_one_length_a_range_or_ranges_with_shares():
    assert LengthMix.parse("64").lengths == (64,)
    uniform = LengthMix.parse("8..120")
    assert uniform.mean == pytest.approx(64) and uniform.quantile(0.5) == 64 and uniform.longest == 120
    tail = LengthMix.parse("8..64:0.7,65..512:0.3")
    assert sum(tail.shares[: 64 - 8 + 1]) == pytest.approx(0.7) and tail.quantile(0.95) > 64
    assert set(tail.draw(200, seed=1)) <= set(range(8, 513))
    for bad in ("0..5", "9..3", "eight", "8..64:-1", ""):
        with pytest.raises(ConfigError, match="lengths"):
            LengthMix.parse(bad)


def test_ragged_samples_are_read_as_requests_of_their_own_lengths(tmp_path):
    listed = tmp_path / "samples.json"
    listed.write_text(json.dumps([{"ids": [1, 2, 3], "mask": [1, 1, 1]}, {"ids": [[4]], "mask": [[1]]}]))
    first, second = load_requests(listed, MODEL)
    assert first["ids"].shape == (1, 3) and second["ids"].shape == (1, 1) and first["ids"].dtype == np.int64
    padded = tmp_path / "samples.npz"
    np.savez(padded, ids=np.arange(12).reshape(3, 4), mask=np.ones((3, 4)), lengths=np.array([4, 1, 2]))
    assert [r["ids"].shape[1] for r in load_requests(padded, MODEL)] == [4, 1, 2]
    np.savez(padded, ids=np.arange(4).reshape(1, 4), mask=np.ones((1, 4)), lengths=np.array([5]))
    with pytest.raises(InputFileError, match=r"lengths\[0\] is 5, but ids holds 4 positions"):
        load_requests(padded, MODEL)
    listed.write_text(json.dumps([{"ids": [1]}]))
    with pytest.raises(InputFileError, match="request 0: no data for input"):
        load_requests(listed, MODEL)


def points(fixed: float, per_token: float, per_square: float) -> list[BatchPoint]:
    """Exact points of latency = fixed + per_token x tokens + per_square x rows x L^2 (ms)."""
    made = []
    for length in (16, 64, 128):
        for rows in (1, 2, 4, 8, 16):
            ms = fixed + per_token * rows * length + per_square * rows * length**2
            made.append(
                BatchPoint(rows, rows * length * 16, rows * length * 4096, ms, ms * 1.1, 0.0, length=length)
            )
    return made


def test_the_fit_finds_a_passs_own_cost_its_tokens_and_attentions_square():
    fit = LengthFit.of(points(1.0, 0.05, 2e-5))
    assert fit.fixed_ms == pytest.approx(1.0, rel=1e-3) and fit.per_token_ms == pytest.approx(0.05, rel=1e-3)
    assert fit.per_token_length_ms == pytest.approx(2e-5, rel=1e-2) and fit.error < 1e-6
    assert fit.pass_cost_tokens(64) == round(1.0 / (0.05 + 2e-5 * 64))
    assert fit.tensor_per_token == pytest.approx(4096, rel=1e-6) and fit.io_per_token == pytest.approx(16)


def plan(fixed: float, latency_ms: float):
    sequences = Sequences.of(MODEL)
    assert sequences is not None
    budgets = Budgets(memory_bytes=2**30, latency_ms=latency_ms, cores=2)
    return plan_lengths(points(fixed, 0.05, 2e-5), LengthMix.parse("8..120"), sequences, budgets, 16, 0)


def test_the_token_budget_fits_two_passes_at_the_longest_length_in_the_latency_budget():
    generous, tight = plan(0.5, 400.0), plan(0.5, 20.0)
    assert generous.max_batch_tokens > tight.max_batch_tokens
    for chosen, budget in ((generous, 400.0), (tight, 20.0)):
        rows = max(1, chosen.max_batch_tokens // 120)
        assert 2 * (0.5 + rows * 120 * (0.05 + 2e-5 * 120)) <= budget
    assert tight.max_batch_size < 16  # the played executions' p99 overran half the budget
    assert "MAX_BATCH_TOKENS" in generous.reasons and generous.header()[0].startswith("Planned for")


def test_a_dear_pass_makes_lengths_share_passes_and_a_cheap_one_keeps_them_apart():
    dear, cheap = plan(20.0, 1000.0), plan(0.0, 1000.0)
    assert dear.pass_cost_tokens > 100 and cheap.pass_cost_tokens == 0
    assert dear.played.padding > 0.01 and cheap.played.padding == 0.0
    assert dear.bucket in (8, 16, 32, 64)
