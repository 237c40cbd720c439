"""config.pbtxt helpers: instance groups set to a count, split into groups of one with priorities
that prefer the first, and merged back, without losing where each group runs."""

import pytest

from tidepool.configfile import (
    MAX_PRIORITY,
    PRIORITY_STEP,
    ConfigFileError,
    ModelConfig,
    config_text,
    set_instances,
)
from tidepool.configfile import ModelInstanceGroup as Group


def groups(config: ModelConfig) -> list[tuple[int, int, list[int], int]]:
    """(kind, count, gpus, priority) of each group, in order."""
    return [(g.kind, g.count, list(g.gpus), g.rate_limiter.priority) for g in config.instance_group]


def test_a_config_without_groups_gets_one_where_triton_places_it_by_default():
    assert groups(set_instances(ModelConfig(name="m"), 3)) == [(Group.KIND_AUTO, 3, [], 0)]


def test_preferring_the_first_splits_into_groups_of_one_with_rising_priorities_and_merges_back():
    config = ModelConfig(name="m")
    config.instance_group.add(name="mine", count=2, kind=Group.KIND_CPU)
    set_instances(config, 3, prefer_first=True)
    assert groups(config) == [
        (Group.KIND_CPU, 1, [], 1),
        (Group.KIND_CPU, 1, [], PRIORITY_STEP),
        (Group.KIND_CPU, 1, [], PRIORITY_STEP**2),
    ]
    assert not any(g.name for g in config.instance_group)  # Triton names groups; two of one name clash
    # A later plan with a fixed split (or a tool that sets a count) gets one group again, no priority.
    assert groups(set_instances(config, 2)) == [(Group.KIND_CPU, 2, [], 0)]
    assert "rate_limiter" not in config_text(config)


def test_groups_on_other_devices_stay_apart_and_each_gets_the_count():
    config = ModelConfig(name="m")
    for gpu in (0, 1):
        config.instance_group.add(count=5, kind=Group.KIND_GPU, gpus=[gpu])
    set_instances(config, 2, prefer_first=True)
    assert groups(config) == [
        (Group.KIND_GPU, 1, [0], 1),
        (Group.KIND_GPU, 1, [0], PRIORITY_STEP),
        (Group.KIND_GPU, 1, [1], 1),
        (Group.KIND_GPU, 1, [1], PRIORITY_STEP),
    ]
    assert groups(set_instances(config, 1)) == [(Group.KIND_GPU, 1, [0], 0), (Group.KIND_GPU, 1, [1], 0)]


def test_priorities_stop_at_the_fields_maximum():
    config = ModelConfig(name="m")
    config.instance_group.add(kind=Group.KIND_CPU)
    set_instances(config, 6, prefer_first=True)
    priorities = [g.rate_limiter.priority for g in config.instance_group]
    assert priorities[:4] == [1, PRIORITY_STEP, PRIORITY_STEP**2, PRIORITY_STEP**3]
    assert priorities[4:] == [MAX_PRIORITY, MAX_PRIORITY]


def test_no_instances_is_refused():
    with pytest.raises(ConfigFileError, match="at least 1, got 0"):
        set_instances(ModelConfig(name="m"), 0)
