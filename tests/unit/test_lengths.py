"""Requests of different lengths: how passes are chosen, how a pass is padded and its outputs cut
back, what the load-time check decides, and an instance serving a mix exactly as each request alone,
with its bad requests refused one by one and no upstream allocation after warm-up."""

from __future__ import annotations

import itertools
from dataclasses import replace

import numpy as np
import pytest

from tests.unit.specs import text_config, text_model_dir
from tidepool.runtime.batching import numpy_allocate
from tidepool.runtime.instance import ModelInstance
from tidepool.runtime.lengths import LengthBatcher, Pass, pass_length, plan_passes
from tidepool.runtime.validation import RequestError
from tidepool.sequences import Sequences
from tidepool.spec import ConfigError, parse_model_config


def sequences(**parameters: str) -> Sequences:
    found = Sequences.of(parse_model_config(text_config(**parameters)))
    assert found is not None
    return found


def request(length: int, seed: int = 0, rows: int = 1) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {"ids": rng.integers(0, 50, (rows, length)), "mask": np.ones((rows, length), dtype=np.int64)}


def cost(passes: list[Pass], rows: list[int], pass_cost: int) -> int:
    return sum(pass_cost + sum(rows[m] for m in p.members) * p.length for p in passes)


def brute_force(lengths: list[int], seqs: Sequences) -> int:
    """The least cost over every split of the requests, sorted by length, into runs of neighbours."""
    order = sorted(range(len(lengths)), key=lambda i: lengths[i])
    best = None
    for cuts in itertools.product([False, True], repeat=len(order) - 1):
        runs, run = [], [order[0]]
        for index, cut in zip(order[1:], cuts, strict=True):
            if cut:
                runs.append(run)
                run = []
            run.append(index)
        runs.append(run)
        if seqs.max_batch_tokens and any(
            len(r) > 1 and len(r) * pass_length([lengths[i] for i in r], seqs) > seqs.max_batch_tokens
            for r in runs
        ):
            continue
        total = sum(seqs.pass_cost_tokens + len(r) * pass_length([lengths[i] for i in r], seqs) for r in runs)
        best = total if best is None else min(best, total)
    assert best is not None
    return best


@pytest.mark.parametrize("seed", range(12))
def test_passes_cost_what_the_best_split_of_neighbours_costs(seed):
    rng = np.random.default_rng(seed)
    lengths = [int(n) for n in rng.integers(1, 41, size=7)]
    seqs = sequences(
        PASS_COST_TOKENS=str(int(rng.integers(0, 64))), MAX_BATCH_TOKENS=str(int(rng.integers(40, 200)))
    )
    passes = plan_passes(lengths, [1] * 7, [()] * 7, seqs, pad=True)
    assert sorted(m for p in passes for m in p.members) == list(range(7))
    assert cost(passes, [1] * 7, seqs.pass_cost_tokens) == brute_force(lengths, seqs)


def test_a_pass_holds_at_most_the_token_budget_but_one_long_request_always_runs():
    seqs = sequences(MAX_BATCH_TOKENS="64", PASS_COST_TOKENS="1000")
    passes = plan_passes([40, 8, 8, 8, 30], [1] * 5, [()] * 5, seqs, pad=True)
    for planned in passes:
        assert len(planned.members) == 1 or len(planned.members) * planned.length <= 64
    assert any(p.members == (0,) and p.length == 40 for p in passes)  # over the budget with anyone else


def test_lengths_share_a_pass_at_the_bucket_one_length_alone_or_together_runs_as_it_came():
    seqs = sequences(PASS_COST_TOKENS="1000")  # passes are dear: everything shares one
    [together] = plan_passes([3, 9, 5], [1, 1, 1], [()] * 3, seqs, pad=True)
    assert together.length == 16  # 9 padded to the bucket of 8
    assert plan_passes([5, 5], [1, 1], [()] * 2, seqs, pad=True) == [Pass((0, 1), 5)]
    assert plan_passes([5], [1], [()], seqs, pad=True) == [Pass((0,), 5)]
    assert pass_length([33, 40], sequences(MAX_SEQUENCE_LENGTH="36", LENGTH_BUCKET="8")) == 36  # capped


def test_without_padding_or_with_other_dims_requests_share_a_pass_only_where_they_agree():
    seqs = sequences(PASS_COST_TOKENS="1000")
    exact = plan_passes([4, 7, 4], [1] * 3, [()] * 3, seqs, pad=False)
    assert sorted(p.members for p in exact) == [(0, 2), (1,)]
    shaped = plan_passes([4, 4, 4], [1] * 3, [(3,), (5,), (3,)], seqs, pad=True)
    assert sorted(p.members for p in shaped) == [(0, 2), (1,)]


def test_a_padded_batch_holds_each_request_on_the_right_of_its_pad_values():
    model = parse_model_config(text_config(**{"pad.ids": "7"}))
    batcher = LengthBatcher(Sequences.of(model), pad=True, token_axes={"hidden": 0})  # type: ignore[arg-type]
    short, long = request(3, seed=1), request(6, seed=2, rows=2)
    batch = batcher.gather([short, long], [1, 2], [3, 6], 8, model, numpy_allocate)
    assert batch["ids"].shape == (3, 8)
    np.testing.assert_array_equal(batch["ids"][0], [*short["ids"][0], 7, 7, 7, 7, 7])
    np.testing.assert_array_equal(batch["mask"][0], [1, 1, 1, 0, 0, 0, 0, 0])
    np.testing.assert_array_equal(batch["ids"][1:, :6], long["ids"])


def test_token_outputs_are_cut_back_to_each_length_as_views_where_they_can_be():
    batcher = LengthBatcher(sequences(), pad=True, token_axes={"hidden": 0})
    outputs = {"hidden": np.arange(4 * 8 * 4, dtype=np.float32).reshape(4, 8, 4), "pooled": np.zeros((4, 4))}
    copies = []

    def allocate(shape, dtype):
        copies.append(np.empty(shape, dtype=dtype))
        return copies[-1]

    one, two = batcher.cut(outputs, [1, 2, 1], [3, 5, 8], allocate)[:2]
    assert one["hidden"].shape == (1, 3, 4) and np.shares_memory(one["hidden"], outputs["hidden"])
    assert two["hidden"].shape == (2, 5, 4) and two["hidden"] is copies[0]  # two rows: not contiguous
    np.testing.assert_array_equal(two["hidden"], outputs["hidden"][1:3, :5])
    assert two["pooled"].shape == (2, 4)


@pytest.fixture
def text_dir(tmp_path):
    return text_model_dir(tmp_path)


def test_the_check_at_load_pads_a_masked_model_and_cuts_its_token_outputs(text_dir):
    instance = ModelInstance.load(text_config(), text_dir)
    assert instance.lengths is not None and instance.lengths.pad
    assert instance.lengths.token_axes == {"hidden": 0}
    assert "padded together to multiples of 8" in instance.describe()


@pytest.mark.parametrize(
    ("factory", "grouping", "why"),
    [
        ("text:build_unmasked", "auto", "padding changed output"),
        ("text:build_halving", "auto", "output hidden's length does not follow the input's"),
    ],
)
def test_the_check_at_load_runs_each_length_apart_where_padding_would_show(text_dir, factory, grouping, why):
    instance = ModelInstance.load(text_config(MODEL_FACTORY=factory, LENGTH_GROUPING=grouping), text_dir)
    assert instance.lengths is not None and not instance.lengths.pad
    assert why in instance.describe()
    served = instance.execute([request(3, 1), request(9, 2)]).results
    assert [len(instance.execute([r]).results) for r in (request(3, 1), request(9, 2))] == [1, 1]
    assert not any(isinstance(result, RequestError) for result in served)


def test_padding_asked_for_on_a_model_whose_output_length_does_not_follow_fails_the_load(text_dir):
    with pytest.raises(ConfigError, match="LENGTH_GROUPING=pad: output hidden's length does not follow"):
        ModelInstance.load(text_config(MODEL_FACTORY="text:build_halving", LENGTH_GROUPING="pad"), text_dir)


def kept(result):
    assert not isinstance(result, Exception), result
    return {name: np.array(value) for name, value in result.items()}


def test_a_mix_of_lengths_is_served_together_exactly_as_each_request_alone(text_dir):
    instance = ModelInstance.load(text_config(PASS_COST_TOKENS="64"), text_dir)
    requests = [request(n, seed=n) for n in (1, 40, 5, 17, 8, 8, 33)] + [request(12, seed=3, rows=2)]
    alone = [kept(instance.execute([r]).results[0]) for r in requests]
    with instance.execute(requests) as execution:
        together = [kept(result) for result in execution.results]
        assert len(execution.batches) < len(requests)  # they shared passes
        assert execution.tokens == sum(r["ids"].size for r in requests) and execution.padded_tokens > 0
    for mine, own in zip(together, alone, strict=True):
        for name in own:
            assert mine[name].shape == own[name].shape
            np.testing.assert_allclose(mine[name], own[name], rtol=1e-5, atol=1e-6)


def test_the_three_client_mistakes_fail_alone_and_name_the_inputs_and_the_limit(text_dir):
    instance = ModelInstance.load(text_config(), text_dir)
    shorter_mask = {"ids": request(6)["ids"], "mask": np.ones((1, 5), dtype=np.int64)}
    empty = {"ids": np.zeros((1, 0), dtype=np.int64), "mask": np.zeros((1, 0), dtype=np.int64)}
    too_long = request(41)
    good = [request(4, 1), request(30, 2)]
    with instance.execute([good[0], shorter_mask, empty, too_long, good[1]]) as execution:
        first, mismatch, nothing, over, last = execution.results
    assert not isinstance(first, Exception) and not isinstance(last, Exception)
    assert first["hidden"].shape == (1, 4, 4) and last["hidden"].shape == (1, 30, 4)
    expected = [
        (mismatch, "inputs ids, mask share the sequence axis and must have one length; got ids 6, mask 5"),
        (nothing, "input ids: an empty sequence (length 0)"),
        (over, "input ids: length 41 is over the model's maximum, MAX_SEQUENCE_LENGTH 40"),
    ]
    for result, message in expected:
        assert isinstance(result, RequestError) and result.code == "INVALID_ARG"
        assert message in str(result)


def test_no_upstream_allocation_after_warm_up_under_a_mixed_length_load(text_dir):
    # A tight limit makes the pool grow by what each block needs, so any size warm-up missed shows.
    config = text_config(MAX_BATCH_TOKENS="128", LENGTH_MIX="1..40", POOL_LIMIT_BYTES="1MiB")
    instance = ModelInstance.load(config, text_dir)
    assert instance.pool is not None
    warmed = instance.pool.stats().upstream_allocs
    rng = np.random.default_rng(5)
    for round_number in range(60):
        count = int(rng.integers(1, 9))
        lengths = rng.integers(1, 41, size=count)
        with instance.execute([request(int(n), seed=round_number) for n in lengths]) as execution:
            assert not any(isinstance(r, Exception) for r in execution.results)
    assert instance.pool.stats().upstream_allocs == warmed


def test_a_model_that_fails_tells_its_client_the_error_and_keeps_the_traceback_for_the_log(text_dir):
    # Token ids up to 99 are valid by the config, but the embedding has 50 rows.
    instance = ModelInstance.load(text_config(**{"range.ids": "0,99"}), text_dir)
    assert "the model failed on generated inputs (IndexError); declare range.<INPUT>" in instance.describe()
    with instance.execute([{"ids": np.full((1, 3), 60), "mask": np.ones((1, 3), np.int64)}]) as run:
        [failure] = run.results
    assert isinstance(failure, RequestError) and failure.code == "INTERNAL"
    assert str(failure).startswith("the model failed: IndexError: index out of range")
    assert "Traceback" not in str(failure) and "/" not in str(failure)
    assert len(run.failures) == 1 and "Traceback" in run.failures[0]


def test_sequence_inputs_are_checked_when_the_config_is_read():
    with pytest.raises(ConfigError, match="SEQUENCE_INPUTS names no input called tokens"):
        sequences(SEQUENCE_INPUTS="ids,tokens")
    assert sequences(SEQUENCE_INPUTS="ids").names == ("ids",)
    assert replace(sequences(), bucket=8).bucket_lengths(20) == [8, 16, 24]
