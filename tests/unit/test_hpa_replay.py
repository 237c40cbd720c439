"""The HPA replay that benchmarks/autoscale.py runs over a measured pod: Kubernetes' rules (the
tolerance, ceil(ready x value / target), pods still starting read as 0 when scaling out, the
stabilization windows, the rate policies) applied to the HPA `tidepool deploy-manifests` renders
and to one with the default behavior."""

from __future__ import annotations

import pytest

from benchmarks.common.hpa import SYNC_S, Metric, Replay, direction_changes, replay_day
from tidepool.deploy.manifests import DeploySettings, Renderer
from tidepool.deploy.sizing import pod_needs
from tidepool.testing import MODEL_REPOSITORY

START_S = 60


def rendered_hpa(**settings) -> dict:
    return Renderer(pod_needs(MODEL_REPOSITORY), DeploySettings(pod_start_s=START_S, **settings)).autoscaler()


def cpu_only() -> dict:
    """An HPA on CPU alone with Kubernetes' default behavior (none written)."""
    target = {"type": "Utilization", "averageUtilization": 50}
    metric = {"type": "Resource", "resource": {"name": "cpu", "target": target}}
    return {"spec": {"minReplicas": 2, "maxReplicas": 20, "metrics": [metric]}}


def reads(**values: float):
    return lambda ready_at: dict(values)


def test_a_reading_within_the_tolerance_changes_nothing():
    replay = Replay(rendered_hpa(cpu_target_percent=50), pod_start_s=START_S)
    assert replay.step(reads(cpu=54.0)) == 2  # 1.08 x target
    assert replay.step(reads(cpu=56.0)) == 3  # 1.12 x: ceil(2 x 1.12)


def test_scaling_out_is_limited_per_pod_start_and_waits_for_starting_pods():
    replay = Replay(rendered_hpa(cpu_target_percent=50), pod_start_s=START_S)
    # 2 ready pods at 5x the target want 10; the policies allow 100% or 2 pods per pod start.
    assert replay.step(reads(cpu=250.0)) == 4
    # The two starting pods read 0: 125% on average, still over, but this period's growth is spent.
    assert replay.step(reads(cpu=250.0)) == 4
    # 75% on the ready two and 0 on the starting two is 37.5% on average: no change either way.
    assert replay.step(reads(cpu=75.0)) == 4
    while replay.now <= START_S + SYNC_S:
        replay.step(reads(cpu=250.0))
    assert replay.ready() == 4 and replay.replicas == 8


def test_pods_without_a_sample_read_0_scaling_out_and_the_target_scaling_in():
    cpu = Metric("cpu", 50.0)
    replay = Replay(rendered_hpa(cpu_target_percent=50), pod_start_s=START_S, initial=4)
    assert replay.step(lambda ready_at: None) == 4  # nothing read: nothing changes
    # Two pods at 1.2x, two without a sample: as 0 they make it 0.6x, a reversal: hold (not 3).
    assert Replay._proposal(cpu, [60.0, 60.0, None, None], current=4) == 4
    # Two pods at 0.2x, two without: as the target they make it 0.6x: 3 pods, not ceil(0.2 x 2) = 1.
    assert Replay._proposal(cpu, [10.0, 10.0, None, None], current=4) == 3
    assert Replay._proposal(cpu, [10.0, 10.0], current=2) == 1


def test_scaling_in_waits_for_the_window_then_one_pod_a_minute():
    hpa = rendered_hpa(cpu_target_percent=50)
    window = hpa["spec"]["behavior"]["scaleDown"]["stabilizationWindowSeconds"]
    replay = Replay(hpa, pod_start_s=START_S, initial=6)
    counts = [replay.step(reads(cpu=5.0)) for _ in range(int(window / SYNC_S) + 12)]
    kept = counts[: int(window / SYNC_S) - 1]
    assert set(kept) == {6}  # the window's highest proposal was the count itself
    after = counts[int(window / SYNC_S) :]
    assert after[0] == 5 and after[-1] < 5 and after == sorted(after, reverse=True)
    assert sum(1 for a, b in zip(after, after[1:], strict=False) if b < a) <= len(after) * SYNC_S / 60 + 1


def test_the_default_behavior_drops_to_the_minimum_in_one_step_after_five_minutes():
    replay = Replay(cpu_only(), pod_start_s=START_S, initial=10)
    counts = [replay.step(reads(cpu=5.0)) for _ in range(300 // SYNC_S + 1)]
    assert counts[: 300 // SYNC_S - 1] == [10] * (300 // SYNC_S - 1)
    assert counts[-1] == 2


def test_the_rendered_hpa_takes_the_larger_of_cpu_and_each_models_ratio():
    replay = Replay(rendered_hpa(cpu_target_percent=50), pod_start_s=START_S)
    # CPU within its target; one model's queue at 2x its target: that model decides.
    assert replay.step(reads(cpu=50.0, encoder=0.0, convnet=2.0)) == 4


@pytest.mark.parametrize(("replicas", "turns"), [([2, 3, 4, 4, 5], 0), ([2, 4, 3, 5, 5, 2], 3), ([3], 0)])
def test_direction_changes_count_turns_not_steps(replicas, turns):
    assert direction_changes(replicas) == turns


def test_a_day_over_a_linear_pod_follows_a_ramp_without_turning():
    def signals(load: float) -> dict[str, float]:
        return {"cpu": 100 * load, "encoder": 0.0, "convnet": 0.0}

    ramp = [0.5 + 4.5 * step / 480 for step in range(480)] + [5.0] * 120  # 2 h up, 30 min flat
    day = replay_day(
        Replay(rendered_hpa(cpu_target_percent=60), pod_start_s=START_S),
        ramp,
        signals,
        late_share=lambda load: 1.0 if load > 0.9 else 0.0,
    )
    assert direction_changes(day.replicas) == 0
    assert day.replicas[-1] == pytest.approx(5.0 / 0.6, abs=1.5)
    assert day.late_percent() < 1.0
