"""`tidepool plan REPOSITORY --memory-budget host=SIZE`: every model planned with its share of one
node budget, from the profiles saved beside it, with floors that fit the budget together."""

from __future__ import annotations

import shutil

import pytest

from tidepool import cli
from tidepool.configfile import read_config
from tidepool.planning.plan import PlanError
from tidepool.planning.together import fit_floors, node_shares, repository_models, tier_budget
from tidepool.pool import MemoryPool
from tidepool.testing import MODEL_REPOSITORY

MiB = 2**20


@pytest.fixture
def repository(tmp_path):
    for model in ("encoder", "convnet"):
        shutil.copytree(MODEL_REPOSITORY / model, tmp_path / model)  # profiles/ included
    return tmp_path


def floors(model_dir) -> int:
    config = read_config(model_dir / "config.pbtxt")
    initial = int(config.parameters["POOL_INITIAL_BYTES"].string_value)
    instances = sum(group.count for group in config.instance_group)
    return instances * MemoryPool.initial_arena_bytes(initial)


@pytest.mark.parametrize("budget_mib", [512, 300])
def test_a_repository_is_planned_so_that_its_floors_fit_the_budget_together(repository, budget_mib, capsys):
    code = cli.main(["plan", str(repository), "--memory-budget", f"host={budget_mib}MiB",
                     "--latency-budget-ms", "250", "--write"])  # fmt: skip
    out = capsys.readouterr().out
    assert code == 0
    assert out.count("planning from the") == 2  # the saved profiles: nothing profiled again
    total = 0
    for model in ("convnet", "encoder"):
        text = (repository / model / "config.pbtxt").read_text()
        assert f"Node budget: host={budget_mib}MiB for 2 models planned together (convnet, encoder)" in text
        assert f"share {budget_mib // 2} MiB" in text
        assert f"Budgets: memory {budget_mib // 2} MiB" in text
        assert floors(repository / model) <= budget_mib // 2 * MiB
        total += floors(repository / model)
    assert total <= budget_mib * MiB


def test_one_model_is_planned_as_before_with_a_tier_or_a_bare_size(repository):
    assert repository_models(repository / "encoder") == [repository / "encoder"]
    assert tier_budget("host=1GiB,cuda:0=4GiB", "cpu") == (2**30, "host=1024MiB")
    assert tier_budget("2GiB", "cpu")[0] == 2 * 2**30
    assert tier_budget("host=1GiB,cuda:0=4GiB", "cuda")[0] == 4 * 2**30


def test_a_budget_without_the_models_tier_or_a_directory_without_models_is_one_line(tmp_path, capsys):
    assert cli.main(["plan", str(tmp_path), "--memory-budget", "1GiB", "--latency-budget-ms", "100"]) == 1
    assert "neither a model directory nor a repository" in capsys.readouterr().err
    model = tmp_path / "m"
    model.mkdir()
    (model / "config.pbtxt").write_text('name: "m"\n')
    code = cli.main(["plan", str(model), "--memory-budget", "cuda:0=1GiB", "--latency-budget-ms", "100"])
    assert code == 1 and "names no host budget" in capsys.readouterr().err


def test_shares_are_even_and_a_floor_above_its_share_is_capped_to_a_power_of_two(repository):
    models = repository_models(repository)
    shares = node_shares(models, 300 * MiB, "host=300MiB")
    assert {share.share_bytes for share in shares.values()} == {150 * MiB}

    class Chosen:
        instance_count = 2
        pool_initial_bytes = 97_314_417  # 128 MiB each at start
        reasons: dict[str, str] = {}

    plan = Chosen()
    fit_floors(plan, 150 * MiB)  # type: ignore[arg-type]
    assert plan.pool_initial_bytes == 64 * MiB and "capped at 64 MiB" in plan.reasons["pool_initial_bytes"]
    with pytest.raises(PlanError):
        repository_models(repository / "nowhere")
