"""The backend as a Triton user runs it: `tidepool install-backend` into a scratch directory, then
the bundled tritonserver started by hand with only --model-repository, --backend-directory and
loopback addresses, in the environment install-backend prints, serves both example models over
HTTP and gRPC, a bad request included."""

from __future__ import annotations

import shlex
import subprocess
import sys

import numpy as np
import pytest
from tritonclient.utils import InferenceServerException

from tidepool.clients.connection import Connection
from tidepool.inputs import random_inputs
from tidepool.launcher.install import install_backend
from tidepool.launcher.server import ServerConfig, TritonServer
from tidepool.testing import MODEL_REPOSITORY, check_examples_answer


@pytest.fixture(scope="module")
def plain_server(tmp_path_factory):
    backends = tmp_path_factory.mktemp("backends")
    done = subprocess.run(
        [sys.executable, "-m", "tidepool.cli", "install-backend", str(backends),
         "--model-repository", str(MODEL_REPOSITORY)],
        capture_output=True, text=True, stdin=subprocess.DEVNULL, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    installation = install_backend(backends)  # again: the same layout, and its command line
    printed = done.stdout.strip().splitlines()[-1]
    assert printed.strip() == installation.shell_line(MODEL_REPOSITORY)
    config = ServerConfig.on_free_ports(MODEL_REPOSITORY, backend_directory=backends, plain=True)
    with TritonServer(config) as server:
        assert server.process is not None
        args = list(server.process.args)
        addresses = [flag for flag in args if flag.split("=")[0].endswith(("-address", "-port"))]
        assert args == installation.command(MODEL_REPOSITORY.resolve()) + addresses
        yield server
        log = "\n".join(server.log_tail)
    assert "Traceback" not in log, log


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_both_models_answer_and_a_bad_request_gets_its_own_error(plain_server, protocol):
    config = plain_server.config
    with Connection.open(protocol, config.http_url if protocol == "http" else config.grpc_url) as connection:
        check_examples_answer(connection, seed=7)
        spec = connection.model_spec("encoder")
        bad = random_inputs(spec, batch=1)
        bad["INPUT_IDS"][0, 3] = 30522
        with pytest.raises(InferenceServerException, match="INPUT_IDS: value 30522 is outside the allowed"):
            connection.infer("encoder", bad, spec)
        good = connection.infer("encoder", random_inputs(spec, batch=1, seed=1), spec)
        assert good["EMBEDDING"].shape == (1, 256)


def test_the_server_ran_only_with_the_flags_a_user_types(plain_server):
    flags = {arg.split("=")[0] for arg in plain_server.process.args[1:]}
    assert flags == {"--model-repository", "--backend-directory", "--http-address", "--http-port",
                     "--grpc-address", "--grpc-port", "--metrics-address", "--metrics-port"}  # fmt: skip
    log = "\n".join(plain_server.log_tail)
    assert "rate" not in shlex.join(plain_server.process.args)
    assert log.count("tidepool encoder_") >= 2 and log.count("tidepool convnet_") >= 2, log


@pytest.mark.gpu
def test_a_gpu_model_is_served_by_plain_tritonserver(tmp_path):
    """The encoder as a KIND_GPU instance: its batch goes through pinned staging into the
    instance's CUDA pool, its output leaves by DLPack, and it answers as the CPU model does."""
    from tidepool.configfile import ModelInstanceGroup, copy_model, read_config

    config = read_config(MODEL_REPOSITORY / "encoder" / "config.pbtxt")
    del config.instance_group[:]
    config.instance_group.add(count=1, kind=ModelInstanceGroup.KIND_GPU)
    config.parameters.pop("ELASTIC_THREADS", None)
    copy_model(MODEL_REPOSITORY / "encoder", tmp_path / "repository" / "encoder", config)
    backends = install_backend(tmp_path / "backends").directory
    gpu = ServerConfig.on_free_ports(tmp_path / "repository", backend_directory=backends, plain=True)
    cpu = ServerConfig.on_free_ports(MODEL_REPOSITORY, backend_directory=backends, plain=True)
    with TritonServer(gpu), TritonServer(cpu):
        for protocol in ("http", "grpc"):
            answers = []
            for server in (gpu, cpu):
                url = server.http_url if protocol == "http" else server.grpc_url
                with Connection.open(protocol, url) as connection:
                    spec = connection.model_spec("encoder")
                    answers.append(connection.infer("encoder", random_inputs(spec, batch=3, seed=5), spec))
            np.testing.assert_allclose(answers[0]["EMBEDDING"], answers[1]["EMBEDDING"], atol=1e-4)
