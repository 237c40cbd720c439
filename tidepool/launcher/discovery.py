"""Where tritonserver and its Python backend are, and the environment a server needs to run
Tidepool with this interpreter's virtual environment."""

from __future__ import annotations

import importlib.util
import os
import shutil
import sys
import sysconfig
import tempfile
from dataclasses import dataclass
from pathlib import Path

from tidepool.errors import TidepoolError
from tidepool.processes import SHM_DIRECTORY, alive

PYTHON_VERSION = f"{sys.version_info.major}.{sys.version_info.minor}"
STUB = "triton_python_backend_stub"


class ServerError(TidepoolError):
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


# What a server leaves behind when it is killed outright: its backend directory and the Python
# backend's shared-memory regions. Both carry the launcher's pid, so a later launcher can tell
# which belong to a process that is gone.
WORKDIR_PREFIX = "tidepool-backends-"


def shm_prefix(pid: int, server: int = 0) -> str:
    """The shared-memory names of the `server`-th server a launcher process starts."""
    return f"tidepool_{pid}_s{server}_"


def workdir_prefix(pid: int) -> str:
    return f"{WORKDIR_PREFIX}{pid}-"


def _owner_pid(name: str, prefix: str, separator: str) -> int | None:
    number = name.removeprefix(prefix).partition(separator)[0]
    return int(number) if name.startswith(prefix) and number.isdigit() else None


def remove_leftovers(temp_dir: Path | None = None) -> list[Path]:
    """Delete the backend directories and shared-memory regions of launchers that no longer run;
    return what was deleted."""
    removed = []
    places = (
        (Path(temp_dir or tempfile.gettempdir()), WORKDIR_PREFIX, "-"),
        (SHM_DIRECTORY, "tidepool_", "_"),
    )
    for directory, prefix, separator in places:
        if not directory.is_dir():
            continue
        for path in directory.glob(f"{prefix}*"):
            pid = _owner_pid(path.name, prefix, separator)
            if pid is None or alive(pid):
                continue
            try:
                shutil.rmtree(path) if path.is_dir() else path.unlink()
            except OSError:
                continue  # another launcher's cleanup got there first, or it is not ours to delete
            removed.append(path)
    return removed
