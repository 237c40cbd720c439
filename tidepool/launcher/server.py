"""One tritonserver process with the `tidepool` backend: started with this interpreter's backend
directory and environment, bound to die with the process that started it, ready when every model
is, stopped inside a grace period (drain, then kill)."""

from __future__ import annotations

import collections
import ctypes
import itertools
import json
import os
import signal
import subprocess
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tidepool.launcher.discovery import (
    STUB,
    ServerError,
    find_python_backend,
    find_tritonserver,
    remove_leftovers,
    server_environment,
    shm_prefix,
    workdir_prefix,
)
from tidepool.launcher.install import build_backend_directory
from tidepool.ports import check_port_free, free_port
from tidepool.processes import SHM_DIRECTORY

# Below Kubernetes' default terminationGracePeriodSeconds (30 s) and systemd's TimeoutStopSec (90 s).
DEFAULT_GRACE_S = 25.0
DRAIN_MARGIN_S = 5.0  # Triton drains for grace - margin; the rest covers its own shutdown
# The kill comes this long before the grace period ends, so that killing the process group and
# reading the server's last output still fit inside it (a supervisor kills at grace's end).
KILL_MARGIN_S = 2.0
READER_JOIN_S = 1.0  # the server's output reader, once the server is gone
FAILURE_OUTPUT_S = 5.0  # what a server that failed to start printed last, for its error message
_PR_SET_PDEATHSIG = 1
_libc = ctypes.CDLL(None, use_errno=True)  # loaded before any fork: the child only calls into it


def _die_with_parent(parent: int) -> Callable[[], None]:
    """Runs in the child between fork and exec: the kernel sends it SIGKILL when the thread that
    started it exits, so a killed launcher never leaves a server holding its ports."""

    def arm() -> None:
        _libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
        if os.getppid() != parent:  # the parent died before the line above took effect
            os.kill(os.getpid(), signal.SIGKILL)

    return arm


_SERVER_NUMBERS = itertools.count()


class Cancelled(ServerError):
    """Starting was given up because a stop was asked for."""


@dataclass
class ServerConfig:
    """How to start one tritonserver; defaults listen on loopback on Triton's usual ports."""

    model_repository: Path = Path("model_repository")
    host: str = "127.0.0.1"
    http_port: int = 8000
    grpc_port: int = 8001
    metrics_port: int = 8002
    tritonserver: str | None = None
    backend_config: list[str] = field(default_factory=list)
    log_verbose: int = 0
    extra_args: list[str] = field(default_factory=list)
    grace_s: float = DEFAULT_GRACE_S  # from the stop signal to the server's exit, drain included
    # "none": the repository is loaded once; "explicit": every model is loaded at start and can be
    # reloaded with a new config through the repository API (`tidepool plan --from-server --apply`).
    model_control: str = "none"
    # Triton's rate limiter. In "execution_count" mode an instance group's `rate_limiter { priority }`
    # decides which idle instance takes a batch, which keeps a lone client of an elastic plan on one
    # warm instance (docs/planning.md); configs without priorities serve as with "off" (Triton's
    # own default): encoder on 2 cores, 1x2 and an elastic pair within the run-to-run noise of
    # each other with and without it, at concurrency 1-16 (docs/benchmarks.md).
    rate_limit: str = "execution_count"
    # A backend directory laid out by `tidepool install-backend`; None: the launcher lays out its own.
    backend_directory: Path | None = None
    # True: start tritonserver as a user does by hand with an installed backend, with only the
    # repository, the backend directory, the addresses and ports (and model control where asked):
    # none of the launcher's own flags (rate limiter, shared-memory prefix, exit timeout, log level).
    plain: bool = False
    # Variables set for the server and its stubs over this process's own, e.g. the node memory
    # budget (TIDEPOOL_MEMORY_BUDGET, which `tidepool serve --memory-budget` sets).
    environment: dict[str, str] = field(default_factory=dict)

    @classmethod
    def on_free_ports(cls, model_repository: Path, **settings: Any) -> ServerConfig:
        """Loopback ports nothing listens on now: for tests, benchmarks and side-by-side servers."""
        return cls(
            model_repository,
            http_port=free_port(),
            grpc_port=free_port(),
            metrics_port=free_port(),
            **settings,
        )

    @property
    def http_url(self) -> str:
        return f"{self._url_host}:{self.http_port}"

    @property
    def grpc_url(self) -> str:
        return f"{self._url_host}:{self.grpc_port}"

    @property
    def metrics_url(self) -> str:
        return f"http://{self._url_host}:{self.metrics_port}/metrics"

    @property
    def _url_host(self) -> str:
        host = "127.0.0.1" if self.host in ("0.0.0.0", "") else self.host
        return f"[{host}]" if ":" in host else host


def _models_in(repository: Path) -> list[str]:
    if not repository.is_dir():
        raise ServerError(f"model repository {repository} is not a directory")
    models = sorted(p.name for p in repository.iterdir() if (p / "config.pbtxt").is_file())
    if not models:
        raise ServerError(f"model repository {repository} has no model (no */config.pbtxt)")
    return models


class TritonServer:
    """One tritonserver process. `start()` returns once every model is ready or raises
    ServerError with the server's own error lines."""

    def __init__(self, config: ServerConfig, echo: Callable[[str], None] | None = None) -> None:
        self.config = config
        self.echo = echo
        self.log_tail: collections.deque[str] = collections.deque(maxlen=400)
        self.process: subprocess.Popen[str] | None = None
        self._workdir: tempfile.TemporaryDirectory[str] | None = None
        self._reader: threading.Thread | None = None
        self.stub_baseline: dict[str, int] = {}  # Python stub processes per model once ready
        # Names of this server's shared-memory regions: the launcher's pid (so that a later launcher
        # can remove them once it is gone) and which of its servers this is.
        self.shm_prefix = shm_prefix(os.getpid(), next(_SERVER_NUMBERS))

    def command(self, backend_dir: Path) -> list[str]:
        c = self.config
        args = [
            str(find_tritonserver(c.tritonserver)),
            f"--model-repository={c.model_repository.resolve()}",
            f"--backend-directory={backend_dir}",
            f"--http-address={c.host}",
            f"--http-port={c.http_port}",
            f"--grpc-address={c.host}",
            f"--grpc-port={c.grpc_port}",
            f"--metrics-address={c.host}",
            f"--metrics-port={c.metrics_port}",
        ]
        if c.model_control == "explicit":
            args += ["--model-control-mode=explicit", "--load-model=*"]
        if c.plain:
            return args + [f"--backend-config={item}" for item in c.backend_config] + c.extra_args
        args += [
            f"--log-verbose={c.log_verbose}",
            f"--rate-limit={c.rate_limit}",
            f"--exit-timeout-secs={max(1, int(c.grace_s - DRAIN_MARGIN_S))}",
        ]
        backend_config = list(c.backend_config)
        if not any("shm-region-prefix-name" in item for item in backend_config):
            # Regions named after this launcher, so that a later one can remove them if it is killed.
            backend_config.append(f"python,shm-region-prefix-name={self.shm_prefix}")
        args += [f"--backend-config={item}" for item in backend_config]
        return args + c.extra_args

    def start(self, timeout_s: float = 180.0, cancelled: Callable[[], bool] = lambda: False) -> TritonServer:
        """Start and wait until every model is ready; give up (stopping the server) as soon as
        `cancelled()` says so, raising Cancelled."""
        c = self.config
        self.models = _models_in(c.model_repository)
        for port, flag in (
            (c.http_port, "--http-port"),
            (c.grpc_port, "--grpc-port"),
            (c.metrics_port, "--metrics-port"),
        ):
            check_port_free(c.host, port, flag)
        binary = find_tritonserver(c.tritonserver)
        files = find_python_backend(binary)
        for path in remove_leftovers():
            self._say_log(f"tidepool: removed {path}, left behind by a launcher that was killed")
        if c.backend_directory is not None:
            backend_dir = c.backend_directory.resolve()
        else:
            self._workdir = tempfile.TemporaryDirectory(prefix=workdir_prefix(os.getpid()))
            backend_dir = build_backend_directory(files, Path(self._workdir.name))
        self.process = subprocess.Popen(
            self.command(backend_dir),
            env={**server_environment(files.library_dirs), **c.environment},
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            errors="replace",
            # Its own process group: a signal to ours reaches the launcher, which drains and stops
            # the server itself; and the whole group (stubs included) can be killed at the end.
            start_new_session=True,
            preexec_fn=_die_with_parent(os.getpid()),
        )
        self._reader = threading.Thread(target=self._read_log, daemon=True)
        self._reader.start()
        try:
            self._wait_ready(timeout_s, cancelled)
        except BaseException:
            self.stop()
            raise
        self.stub_baseline = self.stub_counts()
        return self

    def stub_counts(self) -> dict[str, int]:
        """Live Python stub processes per model (each instance of a tidepool model has one)."""
        import psutil

        counts = dict.fromkeys(self.models, 0)
        if self.process is None or self.process.poll() is not None:
            return counts
        for child in psutil.Process(self.process.pid).children(recursive=True):
            try:
                command = child.cmdline()
                alive = child.status() != psutil.STATUS_ZOMBIE
            except psutil.Error:
                continue
            if alive and len(command) > 1 and command[0].endswith(STUB):
                model = Path(command[1]).parent.parent.name  # <repository>/<model>/<version>/model.py
                if model in counts:
                    counts[model] += 1
        return counts

    def dead_stubs(self) -> list[str]:
        """Models with fewer stubs than when the server became ready: tritonserver 2.51 does not
        restart a stub that died, and that model's instance fails every request until restarted."""
        counts = self.stub_counts()
        return [model for model, expected in self.stub_baseline.items() if counts.get(model, 0) < expected]

    def _say_log(self, line: str) -> None:
        """Keep a line in the log tail and echo it, while whoever reads the echo is there."""
        self.log_tail.append(line)
        if self.echo:
            try:
                self.echo(line)
            except (OSError, ValueError):  # our stderr is gone; keep draining the server's output
                self.echo = None

    def _read_log(self) -> None:
        assert self.process is not None and self.process.stdout is not None
        for line in self.process.stdout:
            self._say_log(line.rstrip("\n"))

    def is_ready(self) -> bool:
        try:
            with urllib.request.urlopen(
                f"http://{self.config.http_url}/v2/health/ready", timeout=2
            ) as response:
                return response.status == 200
        except (urllib.error.URLError, ConnectionError, TimeoutError, OSError):
            return False

    def _wait_ready(self, timeout_s: float, cancelled: Callable[[], bool]) -> None:
        assert self.process is not None
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if cancelled():
                raise Cancelled("a stop was asked for while tritonserver was starting")
            if self.process.poll() is not None:
                if self._reader:
                    self._reader.join(timeout=FAILURE_OUTPUT_S)
                raise ServerError(
                    self._failure_report(
                        f"tritonserver exited with code {self.process.returncode} while starting"
                    )
                )
            if self.is_ready():
                return
            time.sleep(0.25)
        raise ServerError(self._failure_report(f"tritonserver was not ready after {timeout_s:.0f} s"))

    def _failure_report(self, headline: str) -> str:
        errors = [line for line in self.log_tail if line.startswith("E") or "error" in line.lower()]
        shown = errors[-15:] or list(self.log_tail)[-15:]
        hint = ""
        if any("failed to load" in line for line in shown):
            hint = (
                "\nA model failed to load: fix its config.pbtxt or model file as the message "
                "says, or move it out of the repository."
            )
        return headline + ":\n  " + "\n  ".join(shown) + hint

    def model_states(self) -> dict[str, str]:
        request = urllib.request.Request(
            f"http://{self.config.http_url}/v2/repository/index", data=b"{}", method="POST"
        )
        with urllib.request.urlopen(request, timeout=5) as response:
            return {m["name"]: m.get("state", "") for m in json.load(response)}

    def stop(self, grace_s: float | None = None) -> int | None:
        """SIGTERM (Triton drains in-flight and queued requests), then SIGKILL to the server's
        whole process group once `grace_s` (default: the config's) has passed; returns the
        server's exit code."""
        process = self.process
        if process is not None and process.poll() is None:
            process.send_signal(signal.SIGTERM)
            try:
                grace_s = self.config.grace_s if grace_s is None else grace_s
                process.wait(timeout=max(1.0, grace_s - KILL_MARGIN_S))
            except subprocess.TimeoutExpired:
                pass
        if process is not None:
            self._kill_group(process)
        if self._reader:
            self._reader.join(timeout=READER_JOIN_S)
        if self._workdir is not None:
            self._workdir.cleanup()
            self._workdir = None
        return process.returncode if process else None

    def kill(self) -> None:
        """Kill the server and its stubs at once, without a drain (a throwaway server with nothing in
        flight: unloading the models alone takes seconds), and remove the shared files it leaves."""
        process = self.process
        if process is not None:
            self._kill_group(process)
        if self._reader:
            self._reader.join(timeout=READER_JOIN_S)
        prefixes = [self.shm_prefix] + ([f"tidepool_{process.pid}_"] if process is not None else [])
        for path in SHM_DIRECTORY.glob("tidepool_*") if SHM_DIRECTORY.is_dir() else ():
            if path.name.startswith(tuple(prefixes)):
                path.unlink(missing_ok=True)
        if self._workdir is not None:
            self._workdir.cleanup()
            self._workdir = None

    @staticmethod
    def _kill_group(process: subprocess.Popen[str]) -> None:
        """Whatever of the server's process group is still alive (a hung server, or stubs it left
        behind) is killed."""
        try:
            os.killpg(process.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        process.wait()

    def __enter__(self) -> TritonServer:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()
