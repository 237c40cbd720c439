"""The planner as a pure function of (profile, budgets), on profiles recorded on this project's
2-core CPU machine."""

from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from google.protobuf import text_format
from hypothesis import given, settings
from hypothesis import strategies as st
from tritonclient.grpc import model_config_pb2

from tidepool import configfile
from tidepool.configfile import PRIORITY_STEP, ConfigFileError, config_text, read_config, write_config
from tidepool.planning.candidates import candidates, plan, shared_batch_plan, to_verify
from tidepool.planning.choose import capacity
from tidepool.planning.config_writer import planned_config, write_plan
from tidepool.planning.plan import Budgets, PlanError
from tidepool.planning.profile import Profile
from tidepool.planning.quality import QualityBudget
from tidepool.testing import MODEL_REPOSITORY

PROFILES = Path(__file__).parent / "profiles"
MiB = 2**20


def recorded(name: str) -> Profile:
    return Profile.from_json((PROFILES / f"{name}_cpu.json").read_text())


@pytest.mark.parametrize("name", ["encoder", "convnet"])
def test_the_fit_of_recorded_profiles_is_within_ten_percent_at_every_point(name):
    profile = recorded(name)
    for point in profile.points:  # forget the fit stored in the file: compute it here
        point.predicted_bytes, point.fit_error = 0, 1.0
    profile.per_sample_bytes = profile.workspace_bytes = 0.0
    profile.fit()
    assert len(profile.points) >= 4 and profile.per_sample_bytes > 0
    assert all(abs(p.fit_error) <= 0.10 for p in profile.points)
    assert all(p.predicted_bytes == profile.predict_bytes(p.batch) for p in profile.points)


def test_the_fit_recovers_a_known_line_and_never_a_negative_workspace():
    profile = recorded("encoder")
    for point in profile.points:
        point.io_bytes, point.tensor_bytes = 1000 * point.batch + 500, 0
    profile.fit()
    assert profile.per_sample_bytes == pytest.approx(1000) and profile.workspace_bytes == pytest.approx(500)
    for point in profile.points:
        point.io_bytes = 1000 * point.batch - 400  # a line through a negative intercept
    profile.fit()
    assert profile.workspace_bytes == 0.0 and profile.per_sample_bytes < 1000


def test_a_generous_budget_takes_the_largest_batch_that_leaves_room_for_latency():
    profile = recorded("encoder")
    result = plan(profile, Budgets(memory_bytes=4096 * MiB, latency_ms=1000, cores=2))
    assert result.max_batch_size == 32
    tight = plan(profile, Budgets(memory_bytes=4096 * MiB, latency_ms=100, cores=2))
    p = profile.point(tight.max_batch_size)
    assert p.latency_p50_ms + p.latency_p99_ms <= 100 and tight.max_batch_size < 32
    bigger = profile.point(2 * tight.max_batch_size)
    assert bigger.latency_p50_ms + bigger.latency_p99_ms > 100
    assert tight.max_queue_delay_us == 0
    assert tight.queue_timeout_us == 100_000 and tight.max_queue_size >= tight.max_batch_size


def test_memory_limits_the_batch_and_sets_the_pool():
    profile = recorded("convnet")
    budget = Budgets(memory_bytes=60 * MiB, latency_ms=5000, headroom=0.8, cores=2)
    result = plan(profile, budget)
    assert profile.predict_bytes(result.max_batch_size) <= 0.8 * 60 * MiB
    assert result.max_batch_size == 8 and "memory stops the next size" in result.reasons["max_batch_size"]
    # The floor is the pool's own blocks (inputs and outputs), not torch's activations.
    io_bytes = profile.point(result.max_batch_size).io_bytes
    assert result.pool_initial_bytes == int(1.25 * io_bytes)
    assert result.pool_initial_bytes < profile.predict_bytes(result.max_batch_size) - profile.static_bytes
    assert result.pool_limit_bytes == 60 * MiB // result.instance_count


def test_instances_follow_cores_and_memory():
    profile = recorded("convnet")  # profiled with 2 torch threads
    assert plan(profile, Budgets(memory_bytes=8192 * MiB, latency_ms=5000, cores=8)).instance_count == 4
    assert plan(profile, Budgets(memory_bytes=8192 * MiB, latency_ms=5000, cores=2)).instance_count == 1


@pytest.mark.parametrize(
    ("budgets", "message"),
    [
        (Budgets(memory_bytes=40 * MiB, latency_ms=1000), "the model alone does not fit"),
        (Budgets(memory_bytes=4096 * MiB, latency_ms=10), "batch 1 already takes"),
    ],
)
def test_impossible_budgets_are_refused_with_the_reason(budgets, message):
    with pytest.raises(PlanError, match=message):
        plan(recorded("encoder"), budgets)


@settings(max_examples=60, deadline=None)
@given(
    memory_mib=st.integers(20, 400),
    smaller_by=st.integers(0, 300),
    latency=st.floats(30, 2000),
    name=st.sampled_from(["encoder", "convnet"]),
)
def test_a_smaller_memory_budget_never_gives_a_larger_batch(memory_mib, smaller_by, latency, name):
    profile = recorded(name)

    def batch(mib: int) -> int | None:
        try:
            return plan(profile, Budgets(memory_bytes=mib * MiB, latency_ms=latency, cores=2)).max_batch_size
        except PlanError:
            return None

    large, small = batch(memory_mib), batch(max(1, memory_mib - smaller_by))
    if small is not None:
        assert large is not None and small <= large


def test_the_written_config_parses_back_to_the_planned_settings(tmp_path):
    model_dir = tmp_path / "encoder"
    model_dir.mkdir()
    (model_dir / "config.pbtxt").write_text((MODEL_REPOSITORY / "encoder" / "config.pbtxt").read_text())
    profile = recorded("encoder")
    budgets = Budgets(memory_bytes=1024 * MiB, latency_ms=200, cores=2, bounded_queue=True)
    result = plan(profile, budgets)
    text = write_plan(model_dir, budgets, result).read_text()
    assert text.startswith("# Generated by `tidepool plan`") and "latency 200" in text
    config = text_format.Parse(text, model_config_pb2.ModelConfig())
    assert config.max_batch_size == result.max_batch_size
    assert config.dynamic_batching.max_queue_delay_microseconds == result.max_queue_delay_us
    policy = config.dynamic_batching.default_queue_policy
    assert policy.max_queue_size == result.max_queue_size and policy.timeout_action == policy.REJECT
    assert config.instance_group[0].count == result.instance_count
    assert config.parameters["POOL_LIMIT_BYTES"].string_value == str(result.pool_limit_bytes)
    # inputs, outputs and the model's own parameters are kept
    assert config.input[0].name == "INPUT_IDS" and config.output[0].name == "EMBEDDING"
    assert config.parameters["MODEL_FACTORY"].string_value == "encoder_model:build"


def test_a_zero_max_batch_size_is_written_explicitly_and_a_mismatch_is_caught(tmp_path, monkeypatch):
    config = model_config_pb2.ModelConfig(name="m", backend="tidepool")
    text = config_text(config, ["header"])
    assert text.startswith("# header\n") and "max_batch_size: 0" in text
    path = tmp_path / "config.pbtxt"
    path.write_text("name: 'before'")
    monkeypatch.setattr(configfile, "config_text", lambda c, header=(): "name: 'other'")
    with pytest.raises(ConfigFileError, match="would not parse back to the same config"):
        write_config(path, config)
    assert path.read_text() == "name: 'before'"  # nothing half-written


def test_planned_config_keeps_existing_fields():
    existing = text_format.Parse(
        (MODEL_REPOSITORY / "convnet" / "config.pbtxt").read_text(), model_config_pb2.ModelConfig()
    )
    result = plan(recorded("convnet"), Budgets(memory_bytes=1024 * MiB, latency_ms=500, cores=2))
    config = planned_config(existing, result)
    assert config.name == "convnet" and config.backend == "tidepool"
    assert list(config.input[0].dims) == [3, 224, 224]


def test_the_queue_policy_is_written_only_when_asked():
    existing = text_format.Parse(
        (MODEL_REPOSITORY / "encoder" / "config.pbtxt").read_text(), model_config_pb2.ModelConfig()
    )
    result = plan(recorded("encoder"), Budgets(memory_bytes=1024 * MiB, latency_ms=200, cores=2))
    assert not planned_config(existing, result).dynamic_batching.HasField("default_queue_policy")
    assert "not written" in result.reasons["max_queue_size"]


def variant(
    name: str, threads: int, precision: str = "fp32", speed: float = 1.0, error: float = 0.0
) -> Profile:
    """A recorded profile as if measured with other threads or precision: latencies / speed."""
    profile = recorded(name)
    profile.torch_threads, profile.precision = threads, precision
    for point in profile.points:
        point.latency_p50_ms /= speed
        point.latency_p99_ms /= speed
        point.throughput *= speed
    if precision != "fp32":
        profile.output_difference = {"EMBEDDING_max_abs": error, "EMBEDDING_rel_l2": error / 10}
    return profile


def test_no_request_waits_for_company():
    profile = recorded("encoder")
    result = plan(profile, Budgets(memory_bytes=1024 * MiB, latency_ms=200, cores=2))
    assert result.max_queue_delay_us == 0  # not "latency left over" (28.6 ms on the machine that planned)
    assert result.lone_latency_ms == pytest.approx(profile.point(1).latency_p50_ms)
    assert "the queue forms batches with no delay" in result.reasons["max_queue_delay_us"]
    # So a lone request is batched exactly as under Triton's `dynamic_batching {}`: the planned
    # batcher is that message, for a fresh plan and for the committed examples.
    written = planned_config(read_config(MODEL_REPOSITORY / "encoder" / "config.pbtxt"), result)
    committed = [read_config(MODEL_REPOSITORY / name / "config.pbtxt") for name in ("encoder", "convnet")]
    for config in (written, *committed):
        assert config.HasField("dynamic_batching")
        assert config.dynamic_batching == model_config_pb2.ModelDynamicBatching()


def test_each_thread_split_is_a_candidate_with_instances_to_fill_the_cores():
    two_threads, one_thread = variant("encoder", 2), variant("encoder", 1, speed=0.7)
    budgets = Budgets(memory_bytes=1024 * MiB, latency_ms=200, cores=2, elastic_threads=False)
    ranked, left_out = candidates([two_threads, one_thread], budgets)
    assert left_out == []
    by_threads = {p.torch_threads: p for p in ranked}
    assert by_threads[2].instance_count == 1 and by_threads[1].instance_count == 2
    # Two 1-thread instances at 70% of the speed each: 1.4x the throughput of one 2-thread instance.
    assert ranked[0] is by_threads[1]
    assert by_threads[1].predicted_throughput == pytest.approx(1.4 * by_threads[2].predicted_throughput)


BUDGETS_2_CORES = Budgets(memory_bytes=1024 * MiB, latency_ms=200, cores=2)


def test_elastic_threads_join_the_lone_latency_of_one_split_to_the_throughput_of_another():
    two_threads, one_thread = variant("encoder", 2), variant("encoder", 1, speed=0.7)
    fixed_only = Budgets(memory_bytes=1024 * MiB, latency_ms=200, cores=2, elastic_threads=False)
    assert len(candidates([two_threads, one_thread], fixed_only)[0]) == 2  # --no-elastic-threads
    ranked, _ = candidates([two_threads, one_thread], BUDGETS_2_CORES)  # planned by default
    labels = [p.label.split()[0] for p in ranked]
    assert labels == ["2x1-2", "2x1", "1x2"]  # the elastic plan ties on throughput, wins on latency
    elastic, fixed_split, whole = ranked
    assert elastic.predicted_throughput == fixed_split.predicted_throughput
    assert elastic.lone_latency_ms == whole.lone_latency_ms < fixed_split.lone_latency_ms
    assert "elastic: up to 2" in elastic.reasons["torch_threads"]
    assert "rate-limiter priorities" in elastic.reasons["instance_count"]
    existing = read_config(MODEL_REPOSITORY / "encoder" / "config.pbtxt")
    config = planned_config(existing, elastic)
    # Two groups of one whose rate-limiter priorities keep a lone client on the first instance.
    assert [(g.count, g.rate_limiter.priority) for g in config.instance_group] == [(1, 1), (1, PRIORITY_STEP)]
    assert config.parameters["TORCH_NUM_THREADS"].string_value == "2"
    assert config.parameters["ELASTIC_THREADS"].string_value == "true"
    fixed = planned_config(config, fixed_split)
    assert "ELASTIC_THREADS" not in fixed.parameters
    assert [(g.count, g.HasField("rate_limiter")) for g in fixed.instance_group] == [(2, False)]


def test_a_lower_precision_is_a_candidate_only_within_the_output_error_budget():
    fp32, bf16 = variant("encoder", 2), variant("encoder", 2, "bf16", speed=2.0, error=0.005)
    strict = Budgets(memory_bytes=1024 * MiB, latency_ms=200, cores=2)
    ranked, left_out = candidates([fp32, bf16], strict)
    assert [p.precision for p in ranked] == ["fp32"]
    assert "max abs 0.005 (--max-output-error 0): over the budget" in left_out[0]
    allowed = Budgets(memory_bytes=1024 * MiB, latency_ms=200, cores=2, quality=QualityBudget(max_abs=0.01))
    ranked, _ = candidates([fp32, bf16], allowed)
    assert [p.precision for p in ranked] == ["bf16", "fp32"]
    config = planned_config(read_config(MODEL_REPOSITORY / "encoder" / "config.pbtxt"), ranked[0])
    assert config.parameters["PRECISION"].string_value == "bf16"
    assert config.parameters["TORCH_NUM_THREADS"].string_value == "2"


def test_a_frozen_graph_is_written_and_named_as_profiled():
    frozen = variant("encoder", 2)
    frozen.graph, frozen.graph_reason = "frozen", "frozen: outputs within 0 of eager"
    result = plan(frozen, BUDGETS_2_CORES)
    assert result.graph == "frozen" and "fp32 frozen" in result.label
    assert result.reasons["graph"] == "frozen: outputs within 0 of eager"
    config = planned_config(read_config(MODEL_REPOSITORY / "encoder" / "config.pbtxt"), result)
    assert config.parameters["GRAPH"].string_value == "frozen"
    eager = planned_config(config, plan(variant("encoder", 2), BUDGETS_2_CORES))
    assert "GRAPH" not in eager.parameters  # eager is the default: a re-plan takes it back out


def test_verification_serves_the_best_of_each_way_to_use_the_cores_before_the_next_best():
    # The top three by rank split the cores one way (2x1-2 and its fixed twin 2x1, in int8, then
    # 2x1-2 in fp32): 1x2 (best for a lone request) and a shared batch would not be served.
    fp32 = [variant("encoder", 2), variant("encoder", 1, speed=0.7)]
    int8 = [variant("encoder", t, "int8", speed=s, error=0.005) for t, s in ((2, 1.3), (1, 1.1))]
    profiles = fp32 + int8
    budgets = Budgets(memory_bytes=1024 * MiB, latency_ms=200, cores=2, quality=QualityBudget(max_abs=0.01))
    ranked, _ = candidates(profiles, budgets)
    assert [p.label for p in ranked[:3]] == [
        "2x1-2 int8 b16 d0ms",
        "2x1 int8 b16 d0ms",
        "2x1-2 fp32 b16 d0ms",
    ]
    chosen = to_verify(ranked, 3, budgets)
    assert [p.label for p in chosen] == ["2x1-2 int8 b16 d0ms", "1x2 int8 b16 d0ms", "2x1-2 int8 b8 d0ms"]
    assert [p.label for p in to_verify(ranked, 4, budgets)] == [p.label for p in chosen] + [ranked[1].label]
    assert to_verify(ranked, 1, budgets) == [ranked[0]]
    assert len(to_verify(ranked, 99, budgets)) == len(ranked) + 1


def test_a_shared_batch_plan_caps_each_instance_at_its_share():
    budgets = Budgets(memory_bytes=1024 * MiB, latency_ms=200, cores=2)
    ranked, _ = candidates([variant("encoder", 2), variant("encoder", 1, speed=0.7)], budgets)
    elastic = next(p for p in ranked if p.min_threads)
    shared = shared_batch_plan(elastic, budgets)
    assert shared is not None and elastic.max_batch_size == 16
    assert shared.max_batch_size == 8 and shared.instance_count == 2
    # Still elastic, with the lone latency of the plan it shares; sized for its own batch.
    assert (shared.min_threads, shared.torch_threads) == (elastic.min_threads, elastic.torch_threads)
    assert shared.lone_latency_ms == elastic.lone_latency_ms
    assert shared.pool_initial_bytes < elastic.pool_initial_bytes
    assert shared.predicted_throughput == pytest.approx(capacity(elastic.profile, 8, 2))
    assert "at most 16 / 2 instances" in shared.reasons["max_batch_size"]
    assert "the throughput of 2x1 fp32 b8 d0ms" in shared.reasons["torch_threads"]
    assert shared.runs_alone_as is elastic.runs_alone_as and shared.runs_alone_as is not None
    one_instance = next(p for p in ranked if p.instance_count == 1)
    assert shared_batch_plan(one_instance, budgets) is None
    # Nothing smaller than the cap was profiled: no shared plan.
    assert shared_batch_plan(replace(elastic, max_batch_size=1), budgets) is None


def test_verification_picks_the_most_levels_in_budget_then_the_best_worst_level():
    from tidepool.planning.verify import LevelFigures, choose

    one_big, two_small, three = (plan(variant("encoder", threads), BUDGETS_2_CORES) for threads in (2, 1, 2))
    three.max_batch_size = 1  # another label
    plans = [one_big, two_small, three]

    def measured(rows: dict[int, list[tuple[float, float]]]) -> list[LevelFigures]:
        """level -> (throughput, p99) of each plan in turn."""
        return [
            LevelFigures(plans[i].label, level, rate, 0.0, p99, 0, 1.0, p99 <= 200)
            for level, cells in rows.items()
            for i, (rate, p99) in enumerate(cells)
        ]

    # Two fast at one level, slow at another; the third 0.9 of the best everywhere: the worst
    # level decides, although the first has the best mean (1.0, 0.6, 1.0 vs 0.9, 0.9, 0.9).
    figures = measured({1: [(100, 20), (60, 30), (90, 20)], 2: [(60, 40), (100, 30), (90, 40)],
                        4: [(100, 60), (100, 60), (90, 60)]})  # fmt: skip
    assert choose(plans, figures) == 2
    # Within the latency budget at more levels wins over any throughput.
    # (The third is best at its worst level, 0.9, but over the budget at level 1; of the other two
    # the first's worst level is 0.7, the second's 0.6.)
    figures = measured({1: [(100, 20), (60, 30), (90, 250)], 2: [(70, 40), (100, 30), (90, 40)]})
    assert choose(plans, figures) == 0
    assert (
        choose(plans, measured({1: [(100, 20), (99, 30), (50, 20)], 2: [(100, 40), (100, 30), (99, 40)]}))
        == 0
    )


def test_a_size_is_preferred_only_where_it_is_clearly_faster_than_the_next_larger():
    from tidepool.planning.choose import PREFERRED_MARGIN, choose_preferred_sizes

    points = recorded("encoder").points[:3]
    for point, throughput in zip(points, (100.0, 100.0 / PREFERRED_MARGIN, 50.0), strict=True):
        point.throughput = throughput
    sizes, reason = choose_preferred_sizes(points)
    # The first is exactly PREFERRED_MARGIN faster than the second (preferred), the second twice
    # as fast as the third (preferred); the last has no larger size to beat.
    assert sizes == [points[0].batch, points[1].batch] and "faster than the next larger" in reason
    points[0].throughput = 100.0 / PREFERRED_MARGIN * 1.0999
    assert choose_preferred_sizes(points)[0] == [points[1].batch]


def test_thread_splits_and_precisions_to_try():
    from tidepool.planning.candidates import precisions_to_try, thread_splits

    assert thread_splits(2) == [2, 1] and thread_splits(6) == [6, 3, 2, 1] and thread_splits(1) == [1]
    assert precisions_to_try("cpu", QualityBudget()) == ["fp32"]  # numerics never change unless asked
    assert precisions_to_try("cpu", QualityBudget(max_abs=0.01)) == ["fp32", "bf16", "int8"]
    assert precisions_to_try("cpu", QualityBudget(min_cosine=0.999)) == ["fp32", "bf16", "int8"]
    assert precisions_to_try("cuda", QualityBudget(min_top1=0.99)) == ["fp32", "bf16", "fp16"]


def test_a_quality_budget_in_the_users_terms_judges_the_outputs_it_names():
    from tidepool.planning.quality import judge, row_measures

    reference = np.array([[1.0, 0.0, 2.0], [0.5, 3.0, 0.1]])
    close = reference + np.array([[0.01, 0.0, -0.01], [0.0, 0.02, 0.0]])
    swapped = np.array([[1.0, 0.0, 2.0], [3.0, 0.5, 0.1]])  # the second row's top class changes
    measured = {"E_max_abs": 0.02, "C_max_abs": 2.5}
    measured |= {f"E_{k}": v for k, v in row_measures(close, reference).items()}
    measured |= {f"C_{k}": v for k, v in row_measures(swapped, reference).items()}
    assert measured["E_cosine_min"] > 0.9999 and measured["E_top1"] == 1.0 and measured["C_top1"] == 0.5
    ok, text = judge(measured, QualityBudget(min_cosine=0.999, output="E"))
    assert ok and text.startswith("cosine 0.99") and "--min-cosine 0.999" in text
    assert not judge(measured, QualityBudget(min_cosine=0.999))[0]  # every output: C's rows turned
    only_e = {k: v for k, v in measured.items() if k.startswith("E_")}
    assert judge(only_e, QualityBudget(min_cosine=0.999)) == (True, f"cosine {only_e['E_cosine_min']:.5f} "
                                                               "(--min-cosine 0.999)")  # fmt: skip
    assert not judge(measured, QualityBudget(min_top1=0.99, output="C"))[0]
    assert judge(measured, QualityBudget(min_top1=0.99, output="E"))[0]
    assert (
        not judge(measured, QualityBudget(max_abs=0.01))[0] and judge(measured, QualityBudget(max_abs=3))[0]
    )


def test_a_gpu_plan_takes_two_instances_where_memory_allows_and_one_where_it_does_not():
    profile = replace(recorded("encoder"), device="cuda")
    roomy = plan(profile, Budgets(memory_bytes=8192 * MiB, latency_ms=100, cores=2))
    assert roomy.instance_count == 2 and "2 per GPU" in roomy.reasons["instance_count"]
    per_instance = profile.predict_bytes(roomy.max_batch_size)
    tight = plan(profile, Budgets(memory_bytes=int(per_instance * 1.5 / 0.8), latency_ms=100, cores=2))
    assert tight.instance_count == 1 and "1 instances of" in tight.reasons["instance_count"]


def test_verification_measures_again_only_what_one_window_leaves_unclear():
    from tidepool.clients.sweep import LevelResult
    from tidepool.planning.verify import same_at, unclear

    elastic = plan(variant("encoder", 1), BUDGETS_2_CORES)
    shared = replace(elastic, max_batch_size=2)
    one = plan(variant("encoder", 2), BUDGETS_2_CORES)
    # The same but for max_batch_size: no batch of a closed loop of c clients passes c.
    assert same_at(1, elastic, shared) and same_at(2, elastic, shared)
    assert not same_at(4, elastic, shared) and not same_at(1, elastic, one)

    def window(throughput: float, p99: float = 10.0) -> list[LevelResult]:
        return [LevelResult("concurrency", 1, throughput, 5.0, 8.0, 9.0, p99, 100, 0, 1, True,
                            0.0, 0.0, 0.0, 0.0, 1.0)]  # fmt: skip

    assert unclear({"a": window(100), "b": window(80), "c": window(60)}, 100) == []
    assert unclear({"a": window(100), "b": window(96), "c": window(60)}, 100) == ["a", "b"]
    # Over the p99 budget after one window: one stall must not rule a candidate out.
    assert unclear({"a": window(100), "b": window(80, p99=120)}, 100) == ["b"]


def test_at_equal_throughput_verification_prefers_the_lower_tail():
    from tidepool.planning.verify import THROUGHPUT_TIE, LevelFigures, choose

    fast, calm = (plan(variant("encoder", threads), BUDGETS_2_CORES) for threads in (2, 1))

    def measured(calm_rate: float) -> list[LevelFigures]:
        """`fast` serves 100/s at a p99 of 30 ms at both levels; `calm` `calm_rate` at 15 ms."""
        return [
            LevelFigures(p.label, level, rate, 0.0, p99, 0, 1.0, True)
            for level in (1, 4)
            for p, rate, p99 in ((fast, 100.0, 30.0), (calm, calm_rate, 15.0))
        ]

    assert choose([fast, calm], measured(100 * (1 - THROUGHPUT_TIE / 2))) == 1  # within the noise: the tail
    assert choose([fast, calm], measured(100 * (1 - 2 * THROUGHPUT_TIE))) == 0  # clearly slower: throughput
