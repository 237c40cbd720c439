"""`tidepool plan --from-server` as a user types it, against a real server: durations with units,
the server given as HOST:PORT, http:// or grpc://, the gRPC port mistaken for the HTTP one (one line,
no traceback), a served config that is none of the plans observed for the window asked, and a
re-plan of a server under load that plans from the profiles saved beside the config instead of
profiling on the busy machine."""

from __future__ import annotations

import subprocess
import sys
import threading
from pathlib import Path

import pytest

from tidepool.clients.closed_loop import run_closed_loop
from tidepool.configfile import copy_model, read_config, set_instances
from tidepool.launcher.server import ServerConfig, TritonServer
from tidepool.planning.profile import Profile
from tidepool.planning.run import PROFILES_DIRECTORY, save_profiles
from tidepool.testing import MODEL_REPOSITORY

pytestmark = pytest.mark.integration
PROFILES = Path(__file__).parents[1] / "unit" / "profiles"
BUDGETS = ["--memory-budget", "1GiB", "--latency-budget-ms", "100", "--cores", "2"]


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """A server of the encoder in a config no plan makes (one instance, max_batch_size 3), and the
    model directory `tidepool plan --write` left: config and saved profiles."""
    root = tmp_path_factory.mktemp("replan")
    config = read_config(MODEL_REPOSITORY / "encoder" / "config.pbtxt")
    config.max_batch_size = 3
    set_instances(config, 1)
    copy_model(MODEL_REPOSITORY / "encoder", root / "repository" / "encoder", config)
    model_dir = copy_model(MODEL_REPOSITORY / "encoder", root / "planned" / "encoder")
    save_profiles(model_dir, [Profile.read(PROFILES / "encoder_cpu.json")])
    with TritonServer(ServerConfig.on_free_ports(root / "repository")) as server:
        yield server.config, model_dir


def plan(model_dir: Path, *flags: str, timeout_s: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "tidepool.cli", "plan", str(model_dir), *BUDGETS, *flags],
        capture_output=True, text=True, timeout=timeout_s, stdin=subprocess.DEVNULL,
    )  # fmt: skip


def assert_one_line_error(done: subprocess.CompletedProcess[str], *wanted: str) -> None:
    assert done.returncode != 0
    assert "Traceback" not in done.stderr and "Exception ignored" not in done.stderr, done.stderr
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert len(lines) <= 2, done.stderr  # argparse's usage line, then the error
    for text in wanted:
        assert text in lines[-1], done.stderr


# An observation lasts the window asked plus two statistics calls, slower on a loaded machine.
WINDOW_SLACK_S = 3.0


def observed_window_s(line: str) -> float:
    """The window an observation's line says it covered ('... samples/s over 4.0 s, ...')."""
    return float(line.split(" samples/s over ")[1].split(" s,")[0])


def test_a_server_under_load_is_replanned_from_the_saved_profiles_over_the_window_asked(served):
    config, model_dir = served
    load = threading.Thread(
        target=run_closed_loop, args=("encoder", config.grpc_url), kwargs={"concurrency": 4, "duration_s": 12}
    )
    load.start()
    try:
        done = plan(model_dir, "--from-server", f"http://{config.http_url}", "--window", "4s")
    finally:
        load.join()
    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stderr
    assert (
        f"planning from the 1 profiles `tidepool plan --write` saved in {model_dir / PROFILES_DIRECTORY}"
        in (done.stdout)
    )
    assert "profiling now" not in done.stdout + done.stderr
    # The unplanned config is observed for the whole window, not a short first look.
    assert "is none of the plans for these budgets; observing 4 s of its traffic" in done.stdout
    [observed] = [line for line in done.stdout.splitlines() if "samples/s over" in line]
    assert 4 <= observed_window_s(observed) < 4 + WINDOW_SLACK_S and ", 0 failed" in observed, observed
    rate = float(observed.split("encoder: ")[1].split(" samples/s")[0])
    assert rate > 1, observed  # it saw the closed loop's traffic (slow on a loaded machine)
    assert "planned " in done.stdout


def test_grpc_is_taken_with_its_scheme(served):
    config, model_dir = served
    done = plan(model_dir, "--from-server", f"grpc://{config.grpc_url}", "--window", "1500ms")
    assert done.returncode == 0, done.stderr
    [observed] = [line for line in done.stdout.splitlines() if "samples/s over" in line]
    assert 1.5 <= observed_window_s(observed) < 1.5 + WINDOW_SLACK_S and ", 0 failed" in observed, observed


def test_the_grpc_port_given_as_http_is_one_line_that_says_which_to_use(served):
    config, model_dir = served
    done = plan(model_dir, "--from-server", config.grpc_url, "--window", "1s")
    assert_one_line_error(done, f"grpc://{config.grpc_url}", "HTTP port is 8000")


@pytest.mark.parametrize(
    ("server", "message"),
    [("https://127.0.0.1:1", "http:// or grpc://"), ("http://127.0.0.1:8000/v2", "no path")],
)
def test_addresses_it_cannot_use_are_refused_in_one_line(served, server, message):
    _, model_dir = served
    assert_one_line_error(plan(model_dir, "--from-server", server, "--window", "1s"), message)


def test_a_window_without_a_known_unit_is_refused_by_the_parser(served):
    _, model_dir = served
    done = plan(model_dir, "--from-server", "127.0.0.1:1", "--window", "10x")
    assert done.returncode == 2 and "Traceback" not in done.stderr
    last = done.stderr.strip().splitlines()[-1]
    assert last.endswith(
        "argument --window: duration: expected e.g. 10s, 500ms, 5m or 30 (seconds), got '10x'"
    )
