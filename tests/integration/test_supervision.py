"""`tidepool serve` under a supervisor: SIGTERM to its process group at random moments (while it
starts, idle, under load) always ends it inside the grace period with nothing left behind, and
SIGKILL of the launcher takes tritonserver and its stubs with it."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil
import pytest

from tidepool.clients.closed_loop import run_closed_loop
from tidepool.launcher.server import ServerConfig
from tidepool.testing import TEST_MODELS, linked_repository

GRACE_S = 10.0


def leftovers(repository: Path) -> list[str]:
    """Processes still running for this repository: tritonserver and its Python stubs."""
    found = []
    for process in psutil.process_iter(["cmdline"]):
        command = " ".join(process.info["cmdline"] or [])
        if str(repository) in command and ("tritonserver" in command or "backend_stub" in command):
            found.append(f"{process.pid}: {command[:100]}")
    return found


class Launcher:
    """`tidepool serve` in a process group of its own, as make, systemd or Kubernetes run it."""

    def __init__(self, repository: Path, log: Path) -> None:
        self.config = ServerConfig.on_free_ports(repository)
        self.log = log
        command = [
            sys.executable, "-m", "tidepool.cli", "serve", "--model-repository", str(repository),
            "--http-port", str(self.config.http_port), "--grpc-port", str(self.config.grpc_port),
            "--metrics-port", str(self.config.metrics_port), "--grace-s", str(GRACE_S),
        ]  # fmt: skip
        with log.open("w") as out:
            self.process = subprocess.Popen(
                command,
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )

    def wait_serving(self, timeout_s: float = 120) -> None:
        deadline = time.monotonic() + timeout_s
        while "tidepool: serving" not in self.log.read_text():
            assert self.process.poll() is None, self.log.read_text()[-2000:]
            assert time.monotonic() < deadline, "not serving in time"
            time.sleep(0.1)

    def terminate_group(self) -> float:
        """SIGTERM to the group and again to the launcher (make forwards it: two arrive), then the
        seconds until the launcher exits."""
        began = time.monotonic()
        os.killpg(self.process.pid, signal.SIGTERM)
        time.sleep(random.uniform(0, 0.05))
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(timeout=GRACE_S + 5)
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, signal.SIGKILL)
            pytest.fail(f"the launcher did not exit within {GRACE_S + 5} s:\n{self.log.read_text()[-2000:]}")
        return time.monotonic() - began


@pytest.fixture
def identity_repository(tmp_path) -> Path:
    root = tmp_path / "repository"
    root.mkdir()
    return linked_repository(root, TEST_MODELS / "identity")


def background_load(config: ServerConfig, stop: threading.Event) -> threading.Thread:
    def load() -> None:
        while not stop.is_set():
            try:
                run_closed_loop("identity", config.grpc_url, concurrency=4, duration_s=0.5)
            except Exception:
                time.sleep(0.05)  # the server is going away: that is the point

    thread = threading.Thread(target=load, daemon=True)
    thread.start()
    return thread


def stop_at_a_random_moment(repository: Path, log: Path, moment: str) -> float:
    launcher = Launcher(repository, log)
    stop_load = threading.Event()
    try:
        if moment == "start":
            time.sleep(random.uniform(0.0, 4.0))  # anywhere from Python's start-up to the first ready
        else:
            launcher.wait_serving()
            if moment == "load":
                background_load(launcher.config, stop_load)
            time.sleep(random.uniform(0.0, 1.5))
        return launcher.terminate_group()
    finally:
        stop_load.set()


def check_stops(repository: Path, tmp_path: Path, moments: list[str]) -> list[tuple[str, float]]:
    timings = []
    for index, moment in enumerate(moments):
        log = tmp_path / f"serve-{index}.log"
        seconds = stop_at_a_random_moment(repository, log, moment)
        left = leftovers(repository)
        assert not left, (
            f"{moment}: left running after the launcher exited: {left}\n{log.read_text()[-1500:]}"
        )
        assert seconds <= GRACE_S, f"{moment}: took {seconds:.1f} s, the grace period is {GRACE_S} s"
        assert "Traceback" not in log.read_text(), log.read_text()[-2000:]
        timings.append((moment, seconds))
    return timings


def test_sigterm_to_the_process_group_stops_cleanly_at_a_few_random_moments(identity_repository, tmp_path):
    check_stops(identity_repository, tmp_path, ["start", "idle", "load"])


@pytest.mark.slow
def test_sigterm_to_the_process_group_stops_cleanly_at_24_random_moments(identity_repository, tmp_path):
    random.seed(os.getpid())
    timings = check_stops(identity_repository, tmp_path, ["start", "idle", "load"] * 8)
    for moment in ("start", "idle", "load"):
        seconds = [s for m, s in timings if m == moment]
        print(
            f"SIGTERM while {moment}: exit after {min(seconds):.1f}-{max(seconds):.1f} s "
            f"({len(seconds)} tries)"
        )


def test_a_killed_launcher_takes_tritonserver_and_its_stubs_with_it(identity_repository, tmp_path):
    repository = identity_repository
    launcher = Launcher(repository, tmp_path / "serve.log")
    launcher.wait_serving()
    assert leftovers(repository), "the server is not running"
    launcher.process.kill()
    launcher.process.wait()
    deadline = time.monotonic() + 5
    while leftovers(repository) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not leftovers(repository), "tritonserver outlived its launcher by 5 s"
    # What the killed server left (its shared memory, its backend directory) goes at the next start.
    shm = [p.name for p in Path("/dev/shm").glob(f"tidepool_{launcher.process.pid}_*")]
    nxt = Launcher(repository, tmp_path / "next.log")
    nxt.wait_serving()
    assert not list(Path("/dev/shm").glob(f"tidepool_{launcher.process.pid}_*"))
    assert not shm or "left behind by a launcher that was killed" in nxt.log.read_text()
    nxt.terminate_group()
