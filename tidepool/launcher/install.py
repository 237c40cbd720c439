"""A backend directory that any tritonserver serves `backend: "tidepool"` models from: <dir>/tidepool/
model.py (the repository's backend/model.py), and, where <dir> has no Python backend of its own,
Triton's Python backend for this interpreter. `tidepool install-backend` and the launcher both lay
it out here, and say the one command line that serves a repository with it."""

from __future__ import annotations

import os
import re
import shlex
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path

from tidepool.launcher.discovery import (
    PYTHON_VERSION,
    STUB,
    PythonBackendFiles,
    ServerError,
    find_python_backend,
    find_tritonserver,
    server_environment,
)

# backend/model.py at the top of the repository holds the same text (tests/unit/test_install.py):
# the package carries it so that an installed wheel, which has no backend/ folder, writes it too.
BACKEND_MODEL_SOURCE = '''"""The file Triton loads for a model whose config says backend: "tidepool"
(<backend-directory>/tidepool/model.py). `tidepool install-backend DIR` and `tidepool serve` write
this same file there; what it serves comes from the `tidepool` package of the environment whose
`bin/` is first on tritonserver's PATH."""

from tidepool.runtime.model import TritonPythonModel

__all__ = ["TritonPythonModel"]
'''
LIBRARY = "libtriton_python.so"
UTILS = "triton_python_backend_utils.py"


def write_backend_model(directory: Path) -> Path:
    """<directory>/tidepool/model.py, the file Triton loads for the `tidepool` backend."""
    path = directory / "tidepool" / "model.py"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(BACKEND_MODEL_SOURCE)
    return path


def copy_python_backend(files: PythonBackendFiles, directory: Path) -> Path:
    """<directory>/python with Triton's Python backend. Triton refuses a backend library whose real
    path lies outside the backend directory, so the library and utils are copied; the stub is
    linked (its RPATH, relative to its own place, follows the link)."""
    python_dir = directory / "python"
    python_dir.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(files.library, python_dir / LIBRARY)
    shutil.copyfile(files.utils, python_dir / UTILS)
    stub = python_dir / STUB
    if stub.is_symlink() or stub.exists():
        stub.unlink()
    stub.symlink_to(files.stub.resolve())
    return python_dir


def build_backend_directory(files: PythonBackendFiles, directory: Path) -> Path:
    """The launcher's own backend directory: the Python backend and tidepool/model.py."""
    copy_python_backend(files, directory)
    write_backend_model(directory)
    return directory


def stub_python_version(stub: Path) -> str | None:
    """The Python version a Python backend stub embeds ('3.10'), from the libpython it links."""
    found = re.search(rb"libpython(\d+\.\d+)\.so", stub.read_bytes())
    return found.group(1).decode() if found else None


@dataclass(frozen=True)
class Installation:
    """A backend directory with the `tidepool` backend, and how to start tritonserver with it."""

    directory: Path
    tritonserver: Path
    python_backend: str  # where its Python backend came from, for the report
    library_dirs: tuple[Path, ...] = ()

    def environment_changes(self) -> dict[str, str]:
        """The variables tritonserver needs beyond the caller's own: this environment's bin/ first
        on PATH (the stub imports that environment's packages) and libpython's directory (and the
        bundled server's libraries) on LD_LIBRARY_PATH."""
        full = server_environment(self.library_dirs)
        names = ("PATH", "LD_LIBRARY_PATH")
        return {name: full[name] for name in names if full[name] != os.environ.get(name)}

    def command(self, model_repository: Path | str) -> list[str]:
        return [
            str(self.tritonserver),
            f"--model-repository={model_repository}",
            f"--backend-directory={self.directory}",
        ]

    def shell_line(self, model_repository: Path | str) -> str:
        """The command line to paste into a shell, variables first (as extensions of their values)."""
        words = []
        for name, value in self.environment_changes().items():
            current = os.environ.get(name, "")
            prefix = value.removesuffix(current).rstrip(os.pathsep) if current else value
            words.append(f"{name}={shlex.quote(prefix)}" + (f"{os.pathsep}${name}" if current else ""))
        return " ".join([*words, shlex.join(self.command(model_repository))])

    def describe(self, model_repository: Path | str) -> str:
        return "\n".join(
            [
                f"tidepool backend installed in {self.directory}:",
                f"  tidepool/model.py  imports tidepool from {sys.prefix} (Python {PYTHON_VERSION})",
                f"  python/            {self.python_backend}",
                "Serve a model repository with it:",
                f"  {self.shell_line(model_repository)}",
            ]
        )


def _writable(directory: Path) -> None:
    existing = directory
    while not existing.exists():
        existing = existing.parent
    if not existing.is_dir() or not os.access(existing, os.W_OK | os.X_OK):
        raise ServerError(
            f"cannot write the backend directory {directory}: {existing} is not a writable directory"
        )


def _own_python_backend(python_dir: Path) -> str:
    """Check a Python backend the directory holds already (NVIDIA's container's), which is used as
    it is where its stub matches this interpreter; say what it is."""
    for name in (LIBRARY, STUB):
        if not (python_dir / name).is_file():
            raise ServerError(f"{python_dir} is not a complete Python backend: {name} is missing")
    version = stub_python_version(python_dir / STUB)
    if version is not None and version != PYTHON_VERSION:
        raise ServerError(
            f"the Python backend in {python_dir} runs Python {version} and this is Python "
            f"{PYTHON_VERSION}: install Tidepool into a virtual environment made with Python {version} "
            "(in NVIDIA's container, its own python3) and run install-backend from there"
        )
    return f"the server's own Python backend (Python {version or 'of unknown version'}), kept"


def install_backend(directory: Path, tritonserver: str | os.PathLike[str] | None = None) -> Installation:
    """Lay out the `tidepool` backend in `directory` (created where missing) for the server that
    `find_tritonserver` finds, or refuse with one line that says why. A Python backend that an
    earlier install laid out (its stub is a link) is laid out again; any other is kept."""
    directory = directory.resolve()
    _writable(directory)
    server = find_tritonserver(tritonserver)
    python_dir = directory / "python"
    try:
        if python_dir.exists() and not (python_dir / STUB).is_symlink():
            origin = _own_python_backend(python_dir)
            library_dirs: tuple[Path, ...] = ()
        else:
            files = find_python_backend(server)
            copy_python_backend(files, directory)
            origin = f"Triton's Python backend for Python {PYTHON_VERSION}, from {files.library.parent}"
            library_dirs = files.library_dirs
        write_backend_model(directory)
    except OSError as error:
        raise ServerError(f"cannot write the backend directory {directory}: {error}") from None
    return Installation(directory, server, origin, library_dirs)
