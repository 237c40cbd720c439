"""Profile a model, plan its config, and serve it with the written config on a real server."""

from __future__ import annotations

import shutil

from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2

from tests.integration.conftest import server_config
from tidepool.clients.closed_loop import run_closed_loop
from tidepool.launcher.server import TritonServer
from tidepool.planning.planner import Budgets, plan, write_plan
from tidepool.planning.profiler import profile_model
from tidepool.testing import MODEL_REPOSITORY


def test_a_planned_config_serves(tmp_path):
    repository = tmp_path / "repository"
    model_dir = repository / "encoder"
    shutil.copytree(MODEL_REPOSITORY / "encoder", model_dir, ignore=shutil.ignore_patterns("__pycache__"))
    profile = profile_model(model_dir, (1, 2, 4), max_seconds_per_point=0.5, min_iterations=3)
    assert [p.batch for p in profile.points] == [1, 2, 4]
    assert all(abs(p.fit_error) <= 0.10 for p in profile.points)
    budgets = Budgets(memory_bytes=512 * 2**20, latency_ms=2000, cores=2)
    result = plan(profile, budgets)
    write_plan(model_dir, profile, budgets, result)
    written = text_format.Parse((model_dir / "config.pbtxt").read_text(), model_config_pb2.ModelConfig())
    assert written.max_batch_size == result.max_batch_size == 4

    with TritonServer(server_config(repository)) as server:
        load = run_closed_loop("encoder", server.config.grpc_url, concurrency=4, duration_s=3)
        served = server.model_states()
    assert load.errors == [] and len(load.latencies_ms) > 10
    assert served == {"encoder": "READY"}
