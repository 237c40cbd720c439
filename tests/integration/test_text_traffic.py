"""Text traffic on a real server: a Hugging Face BERT planned for a length mix (`plan --lengths`)
and served by plain tritonserver takes requests of every length together, answers each as the model
alone does, refuses the three mistakes clients make with a 400 that names the inputs and the limit
while the rest is served, tells a failing model's error without its traceback, counts tokens and
padding on /metrics, and asks upstream for no memory after warm-up."""

from __future__ import annotations

import shutil
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

from tests.integration.flushed import scrape_flushed
from tidepool.clients.connection import Connection, wire_inputs
from tidepool.clients.metrics import values
from tidepool.clients.sweep import Sweep, SweepSettings
from tidepool.configfile import read_config, read_config_dict, with_parameters, write_config
from tidepool.launcher.install import install_backend
from tidepool.launcher.server import ServerConfig, TritonServer
from tidepool.runtime.instance import ModelInstance
from tidepool.testing import REPO_ROOT

BERT = REPO_ROOT / "tests" / "real_models" / "bert"
MIX = "4..64"
PLAN = ["--memory-budget", "1GiB", "--latency-budget-ms", "500", "--batch-sizes", "1,2,4,8",
        "--seconds-per-point", "0.2", "--threads-to-try", "1", "--lengths", MIX, "--write"]  # fmt: skip


@pytest.fixture(scope="module")
def repository(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("text")
    shutil.copytree(BERT, root / "bert")
    config = with_parameters(read_config(BERT / "config.pbtxt"), MAX_SEQUENCE_LENGTH="64")
    write_config(root / "bert" / "config.pbtxt", config)
    # Its trace frozen and no maximum length declared: a sequence past the 64 positions fails in the model.
    shutil.copytree(BERT, root / "bert_frozen")
    frozen = with_parameters(read_config(BERT / "config.pbtxt"), GRAPH="frozen")
    frozen.name = "bert_frozen"
    write_config(root / "bert_frozen" / "config.pbtxt", frozen)
    return root


@pytest.fixture(scope="module")
def planned(repository) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "tidepool.cli", "plan", str(repository / "bert"), *PLAN],
        capture_output=True, text=True, stdin=subprocess.DEVNULL, timeout=600,
    )  # fmt: skip


@pytest.fixture(scope="module")
def server(repository, planned, tmp_path_factory):
    assert planned.returncode == 0, planned.stdout[-3000:] + planned.stderr[-3000:]
    backends = tmp_path_factory.mktemp("backends")
    install_backend(backends)
    config = ServerConfig.on_free_ports(repository, backend_directory=backends, plain=True)
    with TritonServer(config) as running:
        yield running


def request(length: int, seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {"input_ids": rng.integers(0, 1000, (1, length)), "attention_mask": np.ones((1, length), np.int64)}


def test_the_plan_makes_the_sequence_inputs_ragged_for_the_mix(repository, planned):
    config = (repository / "bert" / "config.pbtxt").read_text()
    assert config.count("allow_ragged_batch: true") == 2
    for key in ("LENGTH_BUCKET", "MAX_BATCH_TOKENS", "PASS_COST_TOKENS"):
        assert f'key: "{key}"' in config
    assert 'string_value: "4..64"' in config and "# Planned for sequence lengths 4..64 (mean 34" in config
    assert "lengths: Planned for sequence lengths 4..64" in planned.stdout


def send_together(url: str, model: str, requests: list[dict[str, np.ndarray]]) -> list:
    """Every request at once over gRPC (async_infer), so that the batcher sees them queued together;
    each answer's outputs, or its error."""
    client = grpcclient.InferenceServerClient(url)
    spec = Connection("grpc", url, client).model_spec(model)
    answers: list = [None] * len(requests)
    done = threading.Semaphore(0)

    def receive(index: int):
        def callback(result, error):  # tritonclient calls it with these keywords
            answers[index] = error or {o.name: result.as_numpy(o.name) for o in spec.outputs}
            done.release()

        return callback

    for index, inputs in enumerate(requests):
        client.async_infer(model, wire_inputs(grpcclient, spec, inputs), receive(index))
    for _ in requests:
        assert done.acquire(timeout=60)
    client.close()
    return answers


def test_requests_of_every_length_share_executions_and_each_answer_is_the_model_alone(repository, server):
    lengths = np.random.default_rng(1).integers(4, 65, size=40)
    requests = [request(int(n), seed) for seed, n in enumerate(lengths)]
    with Connection.open("grpc", server.config.grpc_url) as connection:
        before = connection.statistics("bert")["model_stats"][0]
        answers = send_together(server.config.grpc_url, "bert", requests)
        after = connection.statistics("bert")["model_stats"][0]
    executions = int(after["execution_count"]) - int(before.get("execution_count", 0))
    assert executions < len(requests) / 1.5, f"{len(requests)} requests in {executions} executions"
    instance = ModelInstance.load(read_config_dict(BERT / "config.pbtxt"), BERT)  # one length at a time
    for inputs, answer in zip(requests, answers, strict=True):
        assert not isinstance(answer, Exception), answer
        [alone] = instance.execute([inputs]).results
        assert not isinstance(alone, Exception)
        for name in alone:
            assert answer[name].shape == alone[name].shape, name
            np.testing.assert_allclose(answer[name], alone[name], rtol=1e-4, atol=1e-5)
    instance.close()


MISTAKES = [
    ({"input_ids": request(6, 0)["input_ids"], "attention_mask": np.ones((1, 5), np.int64)},
     "inputs input_ids, attention_mask share the sequence axis and must have one length; "
     "got input_ids 6, attention_mask 5"),
    ({"input_ids": np.zeros((1, 0), np.int64), "attention_mask": np.zeros((1, 0), np.int64)},
     "input input_ids: an empty sequence (length 0)"),
    (request(65, 0), "input input_ids: length 65 is over the model's maximum, MAX_SEQUENCE_LENGTH 64"),
]  # fmt: skip


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_the_three_client_mistakes_get_a_400_that_names_the_inputs_and_the_limit(server, protocol):
    url = server.config.http_url if protocol == "http" else server.config.grpc_url
    with Connection.open(protocol, url) as connection:
        spec = connection.model_spec("bert")
        for inputs, message in MISTAKES:
            with pytest.raises(InferenceServerException) as raised:
                connection.infer("bert", inputs, spec)
            assert message in str(raised.value.message())
            assert str(raised.value.status()) in ("400", "StatusCode.INVALID_ARGUMENT")
        assert connection.is_ready()


def test_a_mistake_queued_with_good_requests_fails_alone(server):
    good = [request(n, n) for n in (7, 30, 64, 12)]
    answers = send_together(server.config.grpc_url, "bert", [*good[:2], *(m for m, _ in MISTAKES), *good[2:]])
    assert [isinstance(a, Exception) for a in answers] == [False, False, True, True, True, False, False]
    assert [a["last_hidden_state"].shape[1] for a in answers if not isinstance(a, Exception)] == [
        7,
        30,
        64,
        12,
    ]


def test_a_failing_model_tells_the_client_its_error_and_the_log_its_traceback(server):
    with Connection.open("http", server.config.http_url) as connection:
        spec = connection.model_spec("bert_frozen")
        with pytest.raises(InferenceServerException) as raised:
            connection.infer("bert_frozen", request(80, 0), spec)  # 80 positions; the model has 64
    message = str(raised.value.message())
    assert message.startswith("the model failed: RuntimeError: The expanded size of the tensor (80)"), message
    assert "Traceback" not in message and "code/__torch__" not in message and "/" not in message
    assert str(raised.value.status()) == "500"
    assert any("Traceback" in line for line in server.log_tail)  # where the server's operators look


def test_tokens_and_padding_are_counted_and_no_memory_is_asked_for_after_warm_up(server):
    metrics = server.config.metrics_url

    def total(name: str) -> float:
        return sum(values(scrape_flushed(metrics), name, model="bert"))

    before = {name: total(name) for name in ("tidepool_tokens_total", "tidepool_padded_tokens_total")}
    upstream = total("tidepool_pool_upstream_allocs_total")
    lengths = np.random.default_rng(2).integers(4, 65, size=48)
    send_together(server.config.grpc_url, "bert", [request(int(n), i) for i, n in enumerate(lengths)])
    assert total("tidepool_tokens_total") - before["tidepool_tokens_total"] == lengths.sum()
    assert total("tidepool_padded_tokens_total") > before["tidepool_padded_tokens_total"]
    assert total("tidepool_pool_upstream_allocs_total") == upstream


def test_a_sweep_sends_the_planned_mix_and_reports_tokens_short_and_long_requests_and_padding(server):
    settings = SweepSettings("bert", url=server.config.grpc_url, concurrency=(4,), window_s=1.0, warmup_s=0.5,
                             max_windows=2, metrics_url=server.config.metrics_url)  # fmt: skip
    [level] = Sweep(settings).run()
    assert level.errors == 0 and level.tokens_per_s > level.throughput  # 34 tokens a request, on average
    assert np.isfinite(level.p99_short_ms) and np.isfinite(level.p99_long_ms)
    assert 0 <= level.padding < 0.5
