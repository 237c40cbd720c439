"""Elastic threads on a real server: instances that together ask for more threads than there are
cores share them through one file named after tritonserver's pid, which goes when they do."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from tests.integration.flushed import scrape_flushed
from tidepool.clients.connection import Connection
from tidepool.configfile import copy_model, read_config, set_instances, with_parameters
from tidepool.launcher.server import ServerConfig, TritonServer
from tidepool.machine import usable_cores
from tidepool.runtime.cores import share_path
from tidepool.testing import TEST_MODELS

LONE_CLIENT_GAP_S = 0.1


def passes_by_threads(metrics_url: str) -> dict[str, float]:
    """Forward passes of both instances: all of them, and those that ran on every core."""
    samples = [
        s
        for s in scrape_flushed(metrics_url)
        if s.labels.get("model") == "identity" and s.name == "tidepool_elastic_passes_total"
    ]
    every_core = str(usable_cores())
    return {
        "count": sum(s.value for s in samples),
        "every_core": sum(s.value for s in samples if s.labels["threads"] == every_core),
    }


def copy_elastic_identity(target, prefer_first: bool = False) -> None:
    """The identity test model at `target` as two elastic instances of up to every core each."""
    config = with_parameters(
        read_config(TEST_MODELS / "identity" / "config.pbtxt"),
        TORCH_NUM_THREADS=str(usable_cores()),
        ELASTIC_THREADS="true",
    )
    copy_model(TEST_MODELS / "identity", target, set_instances(config, 2, prefer_first))


def test_instances_share_the_cores_and_clean_up(tmp_path):
    cores = usable_cores()
    copy_elastic_identity(tmp_path / "repository" / "identity")
    server_config = ServerConfig.on_free_ports(tmp_path / "repository")
    with TritonServer(server_config) as server:
        assert server.process is not None
        shared = share_path(server.process.pid)
        assert shared.exists()
        with Connection.open("grpc", server_config.grpc_url) as grpc:
            spec = grpc.model_spec("identity")

            def ask(value: int) -> int:
                rows = {"X": np.full((1, 1), value, dtype=np.int32)}
                return int(grpc.infer("identity", rows, spec)["Y"][0, 0])

            with ThreadPoolExecutor(4) as workers:
                assert list(workers.map(ask, range(40))) == list(range(40))
            lone = passes_by_threads(server_config.metrics_url)
            for value in range(10):  # one at a time, past any hold: each pass may take every core
                time.sleep(0.05)
                assert ask(value) == value
            after = passes_by_threads(server_config.metrics_url)
        log = "\n".join(server.log_tail)
    # Every pass is counted with its threads, and lone requests ran on every core.
    assert lone["count"] >= 1 and after["count"] == lone["count"] + 10
    with_every_core = after["every_core"] - lone["every_core"]
    assert with_every_core >= 8, (lone, after)
    assert log.count(f"elastic threads: up to {cores}, {cores} cores shared") == 2, log
    assert "GOMP_SPINCOUNT=" in log and "Traceback" not in log
    assert not shared.exists()  # the last instance to finish removed it


def passes_per_instance(metrics_url: str, model: str) -> list[float]:
    """Forward passes of each of `model`'s elastic instances, as its metrics count them (an
    instance that ran none has no sample)."""
    samples = scrape_flushed(metrics_url)
    passes: dict[str, float] = {}
    for sample in samples:
        if sample.name == "tidepool_elastic_passes_total" and sample.labels["model"] == model:
            instance = sample.labels["instance"]
            passes[instance] = passes.get(instance, 0.0) + sample.value
    return sorted(passes.values(), reverse=True)


def test_priorities_keep_a_lone_client_on_the_first_instance(tmp_path):
    """What `tidepool plan` writes for an elastic plan, on the server `tidepool serve` starts: a
    lone client's requests all run on one instance. The same instances without priorities take
    them in turn, which is what the priorities are there to avoid."""
    repository = tmp_path / "repository"
    for name, prefer_first in (("preferring", True), ("in_turn", False)):
        copy_elastic_identity(repository / name, prefer_first)
    server_config = ServerConfig.on_free_ports(repository)
    assert server_config.rate_limit == "execution_count"  # the launcher's default
    with TritonServer(server_config), Connection.open("grpc", server_config.grpc_url) as grpc:
        for name in ("preferring", "in_turn"):
            spec = grpc.model_spec(name)
            for value in range(40):
                # A lone client: each request finds both instances idle (Triton frees an instance
                # once its response is sent, later on a loaded machine).
                time.sleep(LONE_CLIENT_GAP_S)
                rows = {"X": np.full((1, 1), value, dtype=np.int32)}
                assert int(grpc.infer(name, rows, spec)["Y"][0, 0]) == value
        preferring = passes_per_instance(server_config.metrics_url, "preferring")
        in_turn = passes_per_instance(server_config.metrics_url, "in_turn")
    assert sum(preferring) == sum(in_turn) == 40
    # The rate limiter gives the second instance one batch in 1001 once the first has run
    # (and possibly the second batch of all, while both have run none): at most two here.
    assert preferring[0] >= 38, preferring
    assert in_turn[0] <= 30, in_turn  # without priorities the two alternate
