"""One memory budget for the node, on real servers: two copies of convnet whose pools together
want more than the budget take turns with it (the idle one trims, the busy one borrows), a request
larger than the budget fails alone and quickly, a killed stub's bytes come back, and the same
under plain tritonserver with TIDEPOOL_MEMORY_BUDGET."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest
from tritonclient.utils import InferenceServerException

from tests.integration.flushed import scrape_flushed
from tidepool.clients.closed_loop import run_closed_loop
from tidepool.clients.connection import Connection
from tidepool.clients.metrics import scrape, values
from tidepool.configfile import copy_model, read_config
from tidepool.launcher.discovery import ServerError
from tidepool.launcher.install import install_backend
from tidepool.launcher.server import ServerConfig, TritonServer
from tidepool.pool.budget import BUDGET_VARIABLE
from tidepool.pool.ledger import NodeLedger, ledger_path
from tidepool.testing import MODEL_REPOSITORY, TEST_MODELS, model_variant

MiB = 2**20
MODELS = ("convnet_a", "convnet_b")
BURST_S = 2.5
SAMPLE_S = 0.2


@pytest.fixture(scope="module")
def repository(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("node_budget")
    for name in MODELS:
        # No floor: everything these pools hold can be lent.
        model_variant(MODEL_REPOSITORY / "convnet", root, name, POOL_INITIAL_BYTES="0")
    # A model whose request can be as large as one likes: Y = 2 X over any number of floats.
    wide = read_config(TEST_MODELS / "pool_limited" / "config.pbtxt")
    del wide.parameters["POOL_LIMIT_BYTES"]
    for tensor in (*wide.input, *wide.output):
        tensor.dims[:] = [-1]
    copy_model(TEST_MODELS / "pool_limited", root / "wide", wide)
    return root


def ledger_of(server: TritonServer) -> NodeLedger:
    assert server.process is not None
    return NodeLedger.open_existing(ledger_path(server.process.pid, "host"))


def reserved_by(ledger: NodeLedger, model: str) -> int:
    return sum(view.reserved for view in ledger.snapshot() if view.model == model)


def burst(server: TritonServer, model: str) -> None:
    result = run_closed_loop(model, server.config.grpc_url, concurrency=8, duration_s=BURST_S)
    assert not result.errors, result.errors[:3]
    assert len(result.latencies_ms) > 8


@pytest.fixture(scope="module")
def peaks(repository) -> dict[str, int]:
    """Each model's pools' reservation after a burst of its own, on a server with room to spare
    (but a budget small enough that pools grow by what they need, not by whole arenas)."""
    roomy = {BUDGET_VARIABLE: "host=256MiB"}
    with TritonServer(ServerConfig.on_free_ports(repository, environment=roomy)) as server:
        ledger = ledger_of(server)
        found = {}
        for model in MODELS:
            burst(server, model)
            found[model] = reserved_by(ledger, model)
        ledger.close()
    print("peaks: " + ", ".join(f"{model} {nbytes / MiB:.1f} MiB" for model, nbytes in found.items()))
    return found


def budget_between(peaks: dict[str, int]) -> int:
    """Above either model's peak, below both together: one fits beside the other's floor only."""
    budget = max(peaks.values()) + MiB
    assert budget < sum(peaks.values()), peaks
    return budget


class Sampler:
    """The whole ledger's reserved bytes every SAMPLE_S, from /metrics and from the shared file."""

    def __init__(self, server: TritonServer, ledger: NodeLedger) -> None:
        self.server, self.ledger = server, ledger
        self.from_metrics: list[float] = []
        self.from_ledger: list[int] = []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.run, daemon=True)

    def run(self) -> None:
        while not self.stop.wait(SAMPLE_S):
            samples = scrape(self.server.config.metrics_url)
            self.from_metrics.append(max(values(samples, "tidepool_node_reserved_bytes", tier="host")))
            self.from_ledger.append(self.ledger.reserved_total())

    def __enter__(self) -> Sampler:
        self.thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop.set()
        self.thread.join()


def take_turns(server: TritonServer, budget: int) -> None:
    """Bursts that alternate between the models, three each: every request served, the node's
    reserved bytes never above the budget, trims counted."""
    ledger = ledger_of(server)
    assert ledger.budget == budget
    with Sampler(server, ledger) as sampler:
        for _ in range(3):
            for model in MODELS:
                burst(server, model)
    assert len(sampler.from_metrics) >= 10
    assert max(sampler.from_metrics) <= budget, (max(sampler.from_metrics), budget)
    assert max(sampler.from_ledger) <= budget, (max(sampler.from_ledger), budget)
    samples = scrape_flushed(server.config.metrics_url)
    assert sum(values(samples, "tidepool_budget_trims_total")) >= 2  # each model lent at least once
    assert ledger.trims >= 2
    assert max(values(samples, "tidepool_node_budget_bytes", tier="host")) == budget
    print(f"budget {budget / MiB:.1f} MiB: reserved at most {max(sampler.from_metrics) / MiB:.1f} MiB on "
          f"/metrics, {max(sampler.from_ledger) / MiB:.1f} MiB in the ledger ({len(sampler.from_ledger)} "
          f"samples); {ledger.trims} trim requests, {ledger.denials} denials")  # fmt: skip
    ledger.close()


@pytest.fixture(scope="module")
def budgeted_server(repository, peaks):
    budget = budget_between(peaks)
    config = ServerConfig.on_free_ports(repository, environment={BUDGET_VARIABLE: f"host={budget}"})
    with TritonServer(config) as server:
        yield server, budget
        log = "\n".join(server.log_tail)
    assert "Traceback" not in log, log


def test_two_models_take_turns_with_one_budget(budgeted_server):
    server, budget = budgeted_server
    take_turns(server, budget)
    status = subprocess.run(
        [sys.executable, "-m", "tidepool.cli", "status", "--server-pid", str(server.process.pid)],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert status.returncode == 0, status.stderr
    assert f"budget {budget / MiB:.1f} MiB" in status.stdout
    for model in MODELS:
        assert f"{model}_0_0" in status.stdout and f"{model}_1_0" in status.stdout


def test_a_request_larger_than_the_budget_fails_alone(budgeted_server):
    server, budget = budgeted_server
    with Connection.open("grpc", server.config.grpc_url) as connection:
        spec = connection.model_spec("wide")
        huge = {"X": np.ones((1, budget // 4 + 4 * MiB), np.float32)}
        ledger = ledger_of(server)
        trims, denials = ledger.trims, ledger.denials
        with pytest.raises(InferenceServerException) as raised:
            connection.infer("wide", huge, spec)
        # Refused at once: no other pool was asked to trim for what no trim could make fit.
        assert ledger.trims == trims and ledger.denials > denials
        message = str(raised.value)
        assert "node's memory budget" in message and f"{budget / MiB:.1f} MiB" in message, message
        assert "\n" not in message.strip()
        assert connection.is_ready()
        small = {"X": np.arange(8, dtype=np.float32).reshape(1, 8)}
        np.testing.assert_array_equal(connection.infer("wide", small, spec)["Y"], small["X"] * 2)


def test_a_killed_stub_leaves_nothing_in_the_ledger(budgeted_server):
    server, _ = budgeted_server
    ledger = ledger_of(server)
    [victim] = [view for view in ledger.snapshot() if view.instance == "convnet_a_0_0"]
    load = [
        threading.Thread(target=run_closed_loop, args=(model, server.config.grpc_url),
                         kwargs={"concurrency": 4, "duration_s": 3.0})
        for model in MODELS
    ]  # fmt: skip
    for thread in load:
        thread.start()
    time.sleep(1.0)
    os.kill(victim.pid, signal.SIGKILL)
    for thread in load:
        thread.join()
    burst(server, "convnet_b")  # reservations after the kill: the dead entry is reclaimed
    live = ledger.snapshot()
    assert victim.pid not in {view.pid for view in live}
    assert ledger.reserved_total() == sum(view.reserved for view in live)
    samples = scrape_flushed(server.config.metrics_url)
    for view in live:
        reported = values(samples, "tidepool_pool_reserved_bytes", instance=view.instance)
        if view.model != "wide":  # whose pool is the staging one too: one figure for both
            assert reported == [view.reserved], (view, reported)
    ledger.close()


def test_plain_tritonserver_takes_the_budget_from_the_environment(repository, peaks, tmp_path):
    budget = budget_between(peaks)
    backends = install_backend(tmp_path / "backends")
    config = ServerConfig.on_free_ports(
        repository, backend_directory=backends.directory, plain=True,
        environment={BUDGET_VARIABLE: f"host={budget}"},
    )  # fmt: skip
    with TritonServer(config) as server:
        take_turns(server, budget)


def test_floors_larger_than_the_budget_stop_the_load_with_the_reason(tmp_path):
    model_variant(TEST_MODELS / "identity", tmp_path, "identity", POOL_INITIAL_BYTES="64MiB")
    config = ServerConfig.on_free_ports(tmp_path, environment={BUDGET_VARIABLE: "host=32MiB"})
    with pytest.raises(ServerError) as raised:
        TritonServer(config).start(timeout_s=120)
    report = str(raised.value)
    assert "node's host memory budget (32.0 MiB) is smaller than the pools' floors" in report, report
