"""TIDEPOOL_LOADING_NICENESS on a real server: CPU instances load at the lower priority asked for
and serve; a bad value fails the load with the reason, not with a traceback."""

from __future__ import annotations

import numpy as np
import pytest

from tidepool.clients.connection import Connection
from tidepool.configfile import copy_model
from tidepool.launcher.discovery import ServerError
from tidepool.launcher.server import ServerConfig, TritonServer
from tidepool.runtime.cores import NICENESS_VARIABLE
from tidepool.testing import TEST_MODELS


def serve_identity(tmp_path, monkeypatch, niceness: str) -> ServerConfig:
    monkeypatch.setenv(NICENESS_VARIABLE, niceness)  # tritonserver, and so its stubs, inherit it
    copy_model(TEST_MODELS / "identity", tmp_path / "repository" / "identity")
    return ServerConfig.on_free_ports(tmp_path / "repository")


def test_instances_load_at_the_niceness_asked_for_and_serve(tmp_path, monkeypatch):
    with TritonServer(serve_identity(tmp_path, monkeypatch, "5")) as server:
        with Connection.open("http", server.config.http_url) as http:
            spec = http.model_spec("identity")
            answer = http.infer("identity", {"X": np.full((1, 1), 7, dtype=np.int32)}, spec)
        log = "\n".join(server.log_tail)
    assert int(answer["Y"][0, 0]) == 7
    assert "loaded at nice +5" in log, log


def test_a_bad_niceness_fails_the_load_with_the_reason(tmp_path, monkeypatch):
    with pytest.raises(ServerError, match="TIDEPOOL_LOADING_NICENESS must be a whole number 0-19"):
        with TritonServer(serve_identity(tmp_path, monkeypatch, "fast")):
            pass
