"""Models built with their own libraries, added the README's way: a Hugging Face BERT (two INT64
inputs of variable length, a dict of outputs) and a ResNet-style classifier, the latter also as a
torch.export program (.pt2) and with safetensors weights. Each is planned with a quality budget in
its users' terms, served by plain tritonserver, swept, and answers as the model run in process."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from tidepool.clients.connection import Connection
from tidepool.clients.sweep import Sweep, SweepError, SweepSettings
from tidepool.configfile import read_config, read_config_dict, with_parameters, write_config
from tidepool.inputs import random_inputs
from tidepool.launcher.install import install_backend
from tidepool.launcher.server import ServerConfig, TritonServer
from tidepool.runtime.instance import ModelInstance
from tidepool.testing import REPO_ROOT, unexplained_tracebacks

REAL_MODELS = REPO_ROOT / "tests" / "real_models"
QUICK_PLAN = ["--memory-budget", "1GiB", "--latency-budget-ms", "500", "--batch-sizes", "1,2,4",
              "--seconds-per-point", "0.2", "--threads-to-try", "1", "--write"]  # fmt: skip


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "tidepool.cli", *args],
        capture_output=True, text=True, stdin=subprocess.DEVNULL, timeout=600,
    )  # fmt: skip


def classifier_variants(repository: Path) -> None:
    """The classifier as a torch.export program with a dynamic batch, and as the factory with other
    weights read from safetensors (seed 1), so that serving them proves each file was used."""
    sys.path.insert(0, str(REAL_MODELS / "classifier"))
    try:
        from classifier import build  # type: ignore[import-not-found]
    finally:
        sys.path.pop(0)
    base = read_config(REAL_MODELS / "classifier" / "config.pbtxt")
    exported = repository / "classifier_pt2"
    (exported / "1").mkdir(parents=True)
    batch = torch.export.Dim("batch", min=1, max=64)
    program = torch.export.export(
        build().eval(), (torch.zeros(2, 3, 32, 32),), dynamic_shapes={"image": {0: batch}}
    )
    torch.export.save(program, exported / "classifier.pt2")
    config = with_parameters(base, EXPORTED_PROGRAM="classifier.pt2")
    del config.parameters["MODEL_FACTORY"]
    config.name = exported.name
    write_config(exported / "config.pbtxt", config)

    weighted = repository / "classifier_st"
    shutil.copytree(REAL_MODELS / "classifier", weighted)
    from safetensors.torch import save_file

    save_file(build(seed=1).state_dict(), weighted / "weights.safetensors")
    config = with_parameters(base, WEIGHTS="weights.safetensors")
    config.name = weighted.name
    write_config(weighted / "config.pbtxt", config)


def without_ranges(source: Path, target: Path) -> Path:
    """A copy of a model whose config declares no range.* or shape.*, as a user first writes it."""
    shutil.copytree(source, target)
    config = read_config(target / "config.pbtxt")
    for key in [k for k in config.parameters if k.startswith(("range.", "shape."))]:
        del config.parameters[key]
    config.name = target.name
    write_config(target / "config.pbtxt", config)
    return target


@pytest.fixture(scope="module")
def repository(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("real")
    for model in ("bert", "classifier"):
        shutil.copytree(REAL_MODELS / model, root / model)
    classifier_variants(root)
    without_ranges(REAL_MODELS / "bert", root / "bert_bare")
    return root


@pytest.fixture(scope="module")
def planned(repository) -> dict[str, subprocess.CompletedProcess[str]]:
    return {
        "bert": cli("plan", str(repository / "bert"), *QUICK_PLAN, "--min-cosine", "0.999",
                    "--quality-output", "pooler_output"),
        "classifier": cli("plan", str(repository / "classifier"), *QUICK_PLAN, "--min-top1", "0.99"),
    }  # fmt: skip


@pytest.fixture(scope="module")
def server(repository, planned, tmp_path_factory):
    backends = tmp_path_factory.mktemp("backends")
    install_backend(backends)
    config = ServerConfig.on_free_ports(repository, backend_directory=backends, plain=True)
    with TritonServer(config) as running:
        yield running
        lines = list(running.log_tail)
    # bert_bare fails on purpose (a negative token id): its traceback is logged, nothing else's.
    assert unexplained_tracebacks(lines) == [], "\n".join(lines)


def in_process(
    repository: Path, model: str, requests: list[dict[str, np.ndarray]]
) -> list[dict[str, np.ndarray]]:
    """The model as its (planned) config says, run in this process through the same loader."""
    instance = ModelInstance.load(read_config_dict(repository / model / "config.pbtxt"), repository / model)
    try:
        return [{k: np.array(v) for k, v in r.items()} for r in instance.execute(requests).results]
    finally:
        instance.close()


def test_generated_inputs_that_fail_a_model_say_how_to_make_them_meaningful(tmp_path):
    bare = without_ranges(REAL_MODELS / "bert", tmp_path / "bert")
    done = cli(
        "profile",
        str(bare),
        "--batch-sizes",
        "1",
        "--seconds-per-point",
        "0.1",
        "--out",
        str(tmp_path / "p.json"),
    )
    assert done.returncode == 1
    [message] = [line for line in done.stderr.splitlines() if "error:" in line]
    assert "IndexError" in message and "input_ids INT64 [1, 1]: integers in [-100, 100]" in message
    assert "declare each input's range" in message and "--inputs FILE" in message
    assert "1000 rows (embeddings.word_embeddings)" in message and "no shape.input_ids declared" in message
    # The other fix the message names: real samples.
    samples = tmp_path / "samples.npz"
    rng = np.random.default_rng(0)
    np.savez(samples, input_ids=rng.integers(0, 1000, (4, 12)), attention_mask=np.ones((4, 12), np.int64))
    done = cli("profile", str(bare), "--batch-sizes", "1,2", "--seconds-per-point", "0.1",
               "--inputs", str(samples), "--out", str(tmp_path / "p.json"))  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert '"input_shapes": {\n    "input_ids": [\n      12\n    ]' in (tmp_path / "p.json").read_text()


def test_each_model_is_planned_with_its_quality_budget_at_its_lengths(repository, planned):
    for model, done in planned.items():
        assert done.returncode == 0, (model, done.stdout[-3000:] + done.stderr[-3000:])
    bert = (repository / "bert" / "config.pbtxt").read_text()
    assert "# Planned for inputs of one row: input_ids [16], attention_mask [16]" in bert
    assert "outputs against fp32: cosine >= 0.999 (output pooler_output)" in bert
    assert 'key: "shape.input_ids"' in bert
    screens = planned["bert"].stdout
    assert "bf16: outputs against fp32: cosine 0.99" in screens and "(--min-cosine 0.999)" in screens
    assert "top-1" in planned["classifier"].stdout


@pytest.mark.parametrize("protocol", ["http", "grpc"])
@pytest.mark.parametrize("model", ["bert", "classifier", "classifier_pt2", "classifier_st"])
def test_served_outputs_equal_the_model_run_in_process(repository, server, protocol, model):
    url = server.config.http_url if protocol == "http" else server.config.grpc_url
    with Connection.open(protocol, url) as connection:
        spec = connection.model_spec(model)
        requests = [random_inputs(spec, batch=rows, seed=rows) for rows in (1, 3)]
        served = [connection.infer(model, request, spec) for request in requests]
    for got, expected in zip(served, in_process(repository, model, requests), strict=True):
        assert set(got) == set(expected)
        for name in expected:
            np.testing.assert_allclose(got[name], expected[name], rtol=1e-5, atol=1e-5)


def test_the_weights_and_the_program_are_what_serves(server):
    """The exported program answers as the module it was exported from (seed 0); the safetensors
    weights (seed 1) as the module they were saved from, not as the factory's own seed."""
    builds = {"classifier_pt2": 0, "classifier_st": 1}
    with Connection.open("grpc", server.config.grpc_url) as connection:
        spec = connection.model_spec("classifier_st")
        request = random_inputs(spec, batch=2, seed=5)
        answers = {model: connection.infer(model, request, spec)["scores"] for model in builds}
    sys.path.insert(0, str(REAL_MODELS / "classifier"))
    try:
        from classifier import build  # type: ignore[import-not-found]
    finally:
        sys.path.pop(0)
    for model, seed in builds.items():
        with torch.inference_mode():
            expected = build(seed).eval()(torch.from_numpy(request["image"])).numpy()
        np.testing.assert_allclose(answers[model], expected, rtol=1e-5, atol=1e-5)
    assert not np.allclose(answers["classifier_pt2"], answers["classifier_st"])


def test_a_sweep_of_the_served_bert_answers_every_request(server):
    settings = SweepSettings("bert", url=server.config.grpc_url, concurrency=(1, 2), window_s=1.0,
                             warmup_s=0.5, max_windows=2)  # fmt: skip
    results = Sweep(settings).run()
    assert all(level.errors == 0 and level.requests > 0 for level in results), results


def test_a_sweep_whose_requests_all_fail_stops_at_once_and_says_why(server):
    with Connection.open("grpc", server.config.grpc_url) as connection:
        spec = connection.model_spec("bert_bare")
    # A draw whose token id is negative: every request of the sweep (it sends one draw) fails.
    seed = next(seed for seed in range(100) if random_inputs(spec, batch=1, seed=seed)["input_ids"].min() < 0)
    settings = SweepSettings("bert_bare", url=server.config.grpc_url, concurrency=(1, 2), window_s=5.0,
                             warmup_s=0.5, max_windows=5, seed=seed)  # fmt: skip
    with pytest.raises(SweepError) as raised:
        Sweep(settings).run()
    message = str(raised.value)
    assert message.startswith("every request failed at concurrency 1") and "IndexError" in message
    assert "input_ids INT64 [1, 1]: integers in [-100, 100] (no range.input_ids declared" in message
