"""NVIDIA's container, replayed on the bundled tritonserver: deploy/Dockerfile's files copied into a
scratch root, its install script run by a fresh virtual environment's Python, its server command
line started (paths and ports mapped, loopback addresses added) in the environment install-backend
prints. The example models answer over HTTP and gRPC, and the scaling signal read off its /metrics
as the prometheus-adapter rule reads it crosses the HPA's target under a saturating closed loop and
stays under it at low load."""

from __future__ import annotations

import json
import os
import shlex
import shutil
import site
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from tidepool.clients.closed_loop import run_closed_loop
from tidepool.clients.connection import Connection
from tidepool.clients.metrics import scrape
from tidepool.deploy import container
from tidepool.deploy.scaling import DEFAULT_TARGET, queue_to_compute_ratio
from tidepool.launcher.server import ServerConfig
from tidepool.testing import MODEL_REPOSITORY, check_examples_answer

REPOSITORY_ROOT = MODEL_REPOSITORY.parent
DOCKERFILE = REPOSITORY_ROOT / "deploy" / "Dockerfile"

# The packages are there already (this environment's, seen through a path file); the image's build
# fetches them. Built without isolation, the build backend is this environment's setuptools too.
OFFLINE_PIP = "--no-build-isolation --no-index"

pytestmark = pytest.mark.integration


def dockerfile_instructions() -> list[tuple[str, str]]:
    """(instruction, rest of the line) in order, comments and blank lines left out."""
    found = []
    for line in DOCKERFILE.read_text().splitlines():
        if line.strip() and not line.lstrip().startswith("#"):
            instruction, _, rest = line.strip().partition(" ")
            found.append((instruction.upper(), rest.strip()))
    return found


def inside(root: Path, container_path: str) -> Path:
    return root / container_path.lstrip("/")


def replay_copy(root: Path, arguments: str) -> None:
    *sources, target = arguments.split()
    for source in sources:
        origin = REPOSITORY_ROOT / source
        destination = inside(root, target)
        if target.endswith("/"):
            destination = destination / origin.name
        if origin.is_dir():
            shutil.copytree(origin, destination, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            destination.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(origin, destination)


def fresh_python(root: Path) -> Path:
    """A new virtual environment that sees this one's packages (those requirements.lock pins) but
    not Tidepool: the install script then installs only Tidepool, as into the image's Python."""
    environment = root / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(environment)], check=True, timeout=120)
    python = environment / "bin" / "python"
    # venv's own old setuptools would shadow this environment's, which builds the wheel.
    subprocess.run([str(python), "-m", "pip", "uninstall", "--quiet", "--yes", "setuptools"], check=True)
    packages = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True, text=True, check=True,
    ).stdout.strip()  # fmt: skip
    # A path line adds the directory only; its own .pth files (this checkout's editable install of
    # tidepool) are not run, so the fresh environment cannot import tidepool until it is installed.
    (Path(packages) / "base_packages.pth").write_text(site.getsitepackages()[0] + "\n")
    return python


class Replayed:
    """The scratch root, the server's process, and its loopback addresses (a ServerConfig's, for
    its URLs; the server itself is started here, not by the launcher)."""

    def __init__(self, root: Path, install_output: str) -> None:
        self.root = root
        self.install_output = install_output
        self.addresses = ServerConfig.on_free_ports(inside(root, str(container.MODEL_DIRECTORY)))
        self.process: subprocess.Popen[bytes] | None = None
        self.log = root / "server.log"

    def start(self, command: list[str]) -> None:
        """`command` (the Dockerfile's CMD, which is the container's server command) with the image's
        paths under the scratch root and free loopback ports, in the environment and with the
        tritonserver that install-backend printed."""
        assert command == container.server_command()
        printed = shlex.split(self.install_output.strip().splitlines()[-1])
        environment = dict(os.environ)
        while "=" in printed[0]:
            name, _, value = printed.pop(0).partition("=")
            environment[name] = os.path.expandvars(value)
        a = self.addresses
        mapped = container.server_command(
            a.model_repository,
            inside(self.root, str(container.BACKEND_DIRECTORY)),
            (a.http_port, a.grpc_port, a.metrics_port),
        )
        mapped[0] = printed[0]  # the tritonserver install-backend found
        mapped += [f"--{kind}-address={a.host}" for kind in ("http", "grpc", "metrics")]
        with self.log.open("wb") as log:
            self.process = subprocess.Popen(
                mapped, env=environment, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                start_new_session=True, cwd=self.root,
            )  # fmt: skip
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise AssertionError(f"tritonserver exited:\n{self.log.read_text()[-4000:]}")
            try:
                with urllib.request.urlopen(f"http://{a.http_url}/v2/health/ready", timeout=2) as answer:
                    if answer.status == 200:
                        return
            except OSError:
                pass
            time.sleep(0.5)
        raise AssertionError(f"tritonserver not ready in 180 s:\n{self.log.read_text()[-4000:]}")

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, 9)
                self.process.wait()


@pytest.fixture(scope="module")
def replayed(tmp_path_factory):
    root = tmp_path_factory.mktemp("image")
    python = fresh_python(root)
    output = ""
    command: list[str] = []
    for instruction, arguments in dockerfile_instructions():
        if instruction == "COPY":
            replay_copy(root, arguments)
        elif instruction == "RUN":
            words = [str(inside(root, w)) if w.startswith("/opt/") else w for w in shlex.split(arguments)]
            done = subprocess.run(
                words, cwd=root, capture_output=True, text=True, stdin=subprocess.DEVNULL, timeout=600,
                env={**os.environ, "PYTHON": str(python), "PIP_INSTALL_ARGS": OFFLINE_PIP, "CUDA": "cpu"},
            )  # fmt: skip
            assert done.returncode == 0, done.stdout + done.stderr
            output = done.stdout
        elif instruction == "CMD":
            command = json.loads(arguments)
    server = Replayed(root, output)
    try:
        server.start(command)
        yield server
    finally:
        server.stop()


def test_the_dockerfile_runs_the_servers_own_command_line_from_nvidias_image():
    instructions = dockerfile_instructions()
    assert instructions[0] == ("FROM", container.BASE_IMAGE)
    [cmd] = [json.loads(rest) for instruction, rest in instructions if instruction == "CMD"]
    assert cmd == container.server_command()


def test_the_install_script_installed_tidepool_into_the_fresh_environment(replayed):
    assert f"imports tidepool from {replayed.root / 'venv'}" in replayed.install_output
    installed = subprocess.run(
        [str(replayed.root / "venv" / "bin" / "python"), "-c", "import tidepool; print(tidepool.__file__)"],
        capture_output=True, text=True, check=True, cwd=replayed.root,
    ).stdout  # fmt: skip
    assert str(replayed.root / "venv") in installed
    assert (replayed.root / "opt/tritonserver/backends/tidepool/model.py").is_file()


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_the_replayed_container_serves_both_examples(replayed, protocol):
    addresses = replayed.addresses
    with Connection.open(
        protocol, addresses.http_url if protocol == "http" else addresses.grpc_url
    ) as connection:
        check_examples_answer(connection, seed=3)


def ratio_under(replayed: Replayed, concurrency: int, duration_s: float) -> float:
    before, began = scrape(replayed.addresses.metrics_url), time.monotonic()
    result = run_closed_loop(
        "encoder", replayed.addresses.grpc_url, concurrency=concurrency, duration_s=duration_s
    )
    after, elapsed = scrape(replayed.addresses.metrics_url), time.monotonic() - began
    assert result.latencies_ms and not result.errors, result.errors[:3]
    return queue_to_compute_ratio(before, after, elapsed)


def test_the_scaling_signal_crosses_its_target_only_when_the_pod_is_saturated(replayed):
    """Triton updates its counters' values as requests finish; /metrics shows them at its next
    poll (every 2 s by default), hence windows of several seconds."""
    ratio_run_alone = ratio_under(replayed, concurrency=1, duration_s=6)
    time.sleep(2.5)  # let the previous window's last poll land before the next one begins
    ratio_saturated = ratio_under(replayed, concurrency=16, duration_s=6)
    print(f"queue-to-compute ratio: c=1 {ratio_run_alone:.3f}, c=16 {ratio_saturated:.2f}")
    assert ratio_run_alone < DEFAULT_TARGET / 4, ratio_run_alone
    assert ratio_saturated > DEFAULT_TARGET, ratio_saturated
