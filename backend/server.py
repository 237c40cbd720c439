"""Finds and starts a real tritonserver with the `tidepool` backend: locates the binary and the
Python backend, builds a backend directory for this interpreter, waits until ready, stops cleanly."""

from __future__ import annotations

import collections
import importlib.util
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import sysconfig
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

PYTHON_VERSION = f"{sys.version_info.major}.{sys.version_info.minor}"
STUB = "triton_python_backend_stub"
BACKEND_MODEL = Path(__file__).with_name("model.py")


class ServerError(RuntimeError):
    """Tritonserver cannot be found, set up or started; the message says what to do."""


@dataclass(frozen=True)
class PythonBackendFiles:
    """The three files Triton's Python backend needs, for the running interpreter."""

    library: Path
    utils: Path
    stub: Path
    # Where the library's own dependencies live when it is copied away from its RPATH.
    library_dirs: tuple[Path, ...] = ()


def _pytriton_server() -> Path | None:
    # find_spec locates the package without importing it (pytriton's own API is not used).
    spec = importlib.util.find_spec("pytriton")
    if spec is None or not spec.submodule_search_locations:
        return None
    binary = Path(list(spec.submodule_search_locations)[0]) / "tritonserver/bin/tritonserver"
    return binary if binary.is_file() else None


def find_tritonserver(explicit: str | os.PathLike | None = None) -> Path:
    """An explicit path, then $TRITONSERVER, then PATH (NVIDIA's container), then pytriton."""
    for source, candidate in (("--tritonserver", explicit), ("TRITONSERVER", os.environ.get("TRITONSERVER"))):
        if candidate:
            path = Path(candidate)
            if not (path.is_file() and os.access(path, os.X_OK)):
                raise ServerError(f"{source} points at {path}, which is not an executable file")
            return path
    on_path = shutil.which("tritonserver")
    if on_path:
        return Path(on_path)
    bundled = _pytriton_server()
    if bundled:
        return bundled
    raise ServerError(
        "no tritonserver found: not given with --tritonserver or $TRITONSERVER, not on PATH, "
        "and the nvidia-pytriton wheel is not installed. Run `make venv` (it installs the wheel), "
        "or run inside NVIDIA's Triton container."
    )


def find_python_backend(server: Path) -> PythonBackendFiles:
    """The Python backend beside `server`, with the stub built for this interpreter's version."""
    root = server.resolve().parent.parent
    python_dir = root / "backends" / "python"
    library = python_dir / "libtriton_python.so"
    utils = python_dir / "triton_python_backend_utils.py"
    for path in (library, utils):
        if not path.is_file():
            raise ServerError(f"the Python backend is incomplete: {path} is missing")
    # pytriton ships one stub per Python version; NVIDIA's container has one beside the library.
    stubs = root / "python_backend_stubs"
    stub = stubs / PYTHON_VERSION / STUB if stubs.is_dir() else python_dir / STUB
    if not stub.is_file():
        have = sorted(p.name for p in stubs.iterdir()) if stubs.is_dir() else []
        raise ServerError(
            f"no Python backend stub for Python {PYTHON_VERSION} at {stub}"
            + (f" (stubs exist for {', '.join(have)}); " if have else "; ")
            + "create .venv with one of those Python versions (make PYTHON=python3.X venv)"
        )
    wheel_libs = root.parent.parent / "nvidia_pytriton.libs"
    return PythonBackendFiles(library, utils, stub, (wheel_libs,) if wheel_libs.is_dir() else ())


def build_backend_directory(files: PythonBackendFiles, target: Path) -> Path:
    """Lay out <target>/python (library, utils, stub) and <target>/tidepool/model.py.

    Triton refuses a backend library whose real path lies outside the backend directory, so the
    library and the Python files are copied; the stub is linked (its RPATH follows the link)."""
    copies = {
        target / "python" / "libtriton_python.so": files.library,
        target / "python" / "triton_python_backend_utils.py": files.utils,
        target / "tidepool" / "model.py": BACKEND_MODEL,
    }
    for destination, source in copies.items():
        destination.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(source, destination)
    stub = target / "python" / STUB
    if stub.is_symlink() or stub.exists():
        stub.unlink()
    stub.symlink_to(files.stub.resolve())
    return target


def check_port_free(host: str, port: int, flag: str) -> None:
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError as exc:
            raise ServerError(
                f"port {port} on {host} is in use ({exc.strerror}); stop what holds it "
                f"(another tritonserver?) or choose another with {flag}"
            ) from None


def free_port(host: str = "127.0.0.1") -> int:
    """A port that nothing listens on right now (for tests and side-by-side servers)."""
    with socket.socket() as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


def server_environment(library_dirs: tuple[Path, ...] = ()) -> dict[str, str]:
    """PATH with this venv's bin/ first (the stub takes that environment's packages) and
    libpython's directory on LD_LIBRARY_PATH (the stub embeds libpython)."""
    env = dict(os.environ)
    venv_bin = str(Path(sys.prefix) / "bin")
    env["PATH"] = os.pathsep.join([venv_bin, env.get("PATH", "")])
    libdir = sysconfig.get_config_var("LIBDIR") or ""
    env["LD_LIBRARY_PATH"] = os.pathsep.join(
        p for p in (libdir, *map(str, library_dirs), env.get("LD_LIBRARY_PATH", "")) if p
    )
    env.pop("PYTHONPATH", None)  # the stub ignores it; keep the server's view honest
    return env


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

    @classmethod
    def on_free_ports(cls, model_repository: Path, **settings) -> ServerConfig:
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
            f"--log-verbose={c.log_verbose}",
        ]
        args += [f"--backend-config={item}" for item in c.backend_config]
        return args + c.extra_args

    def start(self, timeout_s: float = 180.0) -> TritonServer:
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
        self._workdir = tempfile.TemporaryDirectory(prefix="tidepool-backends-")
        backend_dir = build_backend_directory(files, Path(self._workdir.name))
        self.process = subprocess.Popen(
            self.command(backend_dir),
            env=server_environment(files.library_dirs),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            errors="replace",
            start_new_session=True,  # Ctrl-C reaches us; we stop the server ourselves
        )
        self._reader = threading.Thread(target=self._read_log, daemon=True)
        self._reader.start()
        try:
            self._wait_ready(timeout_s)
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

    def _read_log(self) -> None:
        assert self.process is not None and self.process.stdout is not None
        for line in self.process.stdout:
            self.log_tail.append(line.rstrip("\n"))
            if self.echo:
                self.echo(line.rstrip("\n"))

    def is_ready(self) -> bool:
        try:
            with urllib.request.urlopen(
                f"http://{self.config.http_url}/v2/health/ready", timeout=2
            ) as response:
                return response.status == 200
        except (urllib.error.URLError, ConnectionError, TimeoutError, OSError):
            return False

    def _wait_ready(self, timeout_s: float) -> None:
        assert self.process is not None
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                if self._reader:
                    self._reader.join(timeout=5)
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

    def stop(self, timeout_s: float = 30.0) -> int | None:
        """SIGTERM, then SIGKILL after `timeout_s`; returns the server's exit code."""
        process = self.process
        if process is not None and process.poll() is None:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        if self._reader:
            self._reader.join(timeout=5)
        if self._workdir is not None:
            self._workdir.cleanup()
            self._workdir = None
        return process.returncode if process else None

    def __enter__(self) -> TritonServer:
        return self.start()

    def __exit__(self, *exc_info) -> None:
        self.stop()


def serve(config: ServerConfig) -> int:
    """`tidepool serve`: start, say where it listens, run until Ctrl-C or SIGTERM."""
    server = TritonServer(config, echo=lambda line: print(line, file=sys.stderr, flush=True))
    stopping = threading.Event()

    def on_signal(signum, _frame) -> None:
        stopping.set()

    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)
    print(f"tidepool: starting tritonserver for {config.model_repository} ...", flush=True)
    server.start()
    print(
        f"tidepool: serving {', '.join(server.models)}\n"
        f"  HTTP    http://{config.http_url}\n"
        f"  gRPC    {config.grpc_url}\n"
        f"  metrics {config.metrics_url}\n"
        "Press Ctrl-C to stop.",
        flush=True,
    )
    assert server.process is not None
    while not stopping.is_set() and server.process.poll() is None:
        stopping.wait(1.0)
        dead = [] if stopping.is_set() else server.dead_stubs()
        if dead:
            # The only way back for those instances on this Triton: a fresh server, same ports.
            print(f"tidepool: the Python stub of {', '.join(dead)} died; restarting tritonserver", flush=True)
            server.stop(timeout_s=10)
            server.start()
            print(f"tidepool: restarted; serving {', '.join(server.models)}", flush=True)
    if server.process.poll() is not None:
        print(
            f"tidepool: tritonserver exited on its own with code {server.process.returncode}", file=sys.stderr
        )
        server.stop()
        return server.process.returncode or 1
    print("tidepool: stopping tritonserver ...", flush=True)
    code = server.stop()
    print(f"tidepool: stopped (exit code {code})", flush=True)
    return 0
