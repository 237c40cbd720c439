"""A server started with metrics off (`--allow-metrics=false`) still loads and serves Tidepool
models, and the log says whether Tidepool's own metrics are on. (tritonserver 2.51 from the wheel
still creates metric families with metrics off; where a server refuses them, the instance serves
without: tests/unit/test_model.py covers that path with the fake pb_utils.)"""

from __future__ import annotations

import numpy as np

from tidepool.clients.connection import Connection
from tidepool.launcher.server import ServerConfig, TritonServer
from tidepool.testing import TEST_MODELS, linked_repository


def test_with_metrics_off_models_load_serve_and_say_so(tmp_path):
    repository = linked_repository(tmp_path, TEST_MODELS / "identity")
    config = ServerConfig.on_free_ports(repository, extra_args=["--allow-metrics=false"])
    with TritonServer(config) as server:
        with Connection.open("grpc", config.grpc_url) as grpc:
            spec = grpc.model_spec("identity")
            rows = {"X": np.arange(5, dtype=np.int32).reshape(5, 1)}
            np.testing.assert_array_equal(grpc.infer("identity", rows, spec)["Y"], rows["X"])
        log = "\n".join(server.log_tail)
    # 2.51 from the wheel creates metric families even with metrics off, so the instance has them.
    assert "tidepool identity_0_0" in log and "custom metrics on" in log and "Traceback" not in log
