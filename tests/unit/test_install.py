"""`tidepool install-backend` and the launcher's backend directory, without starting a server."""

from __future__ import annotations

import stat

import pytest

from tidepool.launcher import install
from tidepool.launcher.discovery import PYTHON_VERSION, STUB, ServerError, find_python_backend
from tidepool.launcher.install import (
    BACKEND_MODEL_SOURCE,
    build_backend_directory,
    install_backend,
    stub_python_version,
)
from tidepool.testing import REPO_ROOT


def executable(path, content=b"#!/bin/sh\n"):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(content)
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return path


def fake_server(root, stub_version=PYTHON_VERSION, library=True):
    """A tritonserver laid out as the nvidia-pytriton wheel lays it out, with one stub."""
    binary = executable(root / "tritonserver" / "bin" / "tritonserver")
    python_dir = root / "tritonserver" / "backends" / "python"
    python_dir.mkdir(parents=True)
    if library:
        (python_dir / "libtriton_python.so").write_bytes(b"\x7fELF")
    (python_dir / "triton_python_backend_utils.py").write_text("")
    stub = f"\x7fELF libpython{stub_version}.so.1.0".encode()
    executable(root / "tritonserver" / "python_backend_stubs" / stub_version / STUB, stub)
    return binary


def test_the_repositorys_backend_file_is_the_one_written():
    assert (REPO_ROOT / "backend" / "model.py").read_text() == BACKEND_MODEL_SOURCE


def test_the_launcher_and_the_installer_lay_out_the_same_backend(tmp_path):
    server = fake_server(tmp_path / "server")
    launcher = build_backend_directory(find_python_backend(server), tmp_path / "launcher")
    installed = install_backend(tmp_path / "installed", server).directory
    for relative in ("tidepool/model.py", "python/libtriton_python.so", "python/" + install.UTILS):
        assert (launcher / relative).read_bytes() == (installed / relative).read_bytes(), relative
    library = installed / "python" / "libtriton_python.so"
    assert library.is_file() and not library.is_symlink()  # Triton refuses a library outside
    assert (installed / "python" / STUB).resolve() == (launcher / "python" / STUB).resolve()


def test_the_printed_line_sets_the_environment_and_starts_the_server(tmp_path):
    server = fake_server(tmp_path / "server")
    installation = install_backend(tmp_path / "backends", server)
    line = installation.shell_line("model_repository")
    assert line.startswith("PATH=") and f"{install.sys.prefix}/bin" in line.split()[0]
    assert "LD_LIBRARY_PATH=" in line
    expected = f"{server} --model-repository=model_repository --backend-directory={tmp_path}/backends"
    assert line.endswith(expected)
    again = install_backend(tmp_path / "backends", server)  # a second install lays it out again
    assert again.shell_line("model_repository") == line


def test_a_directory_that_cannot_be_written_is_refused(tmp_path):
    server = fake_server(tmp_path / "server")
    (tmp_path / "a_file").write_text("")
    with pytest.raises(ServerError, match="cannot write the backend directory .*a_file is not a writable"):
        install_backend(tmp_path / "a_file" / "backends", server)


def test_a_server_without_a_python_backend_is_refused(tmp_path):
    server = fake_server(tmp_path / "server", library=False)
    with pytest.raises(ServerError, match="Python backend is incomplete: .*libtriton_python.so is missing"):
        install_backend(tmp_path / "backends", server)
    assert not (tmp_path / "backends" / "tidepool").exists()


def test_a_containers_own_python_backend_is_kept_when_its_stub_matches(tmp_path):
    server = fake_server(tmp_path / "server")
    own = tmp_path / "backends" / "python"
    (own / "libtriton_python.so").parent.mkdir(parents=True)
    (own / "libtriton_python.so").write_bytes(b"\x7fELF")
    executable(own / STUB, f"\x7fELF libpython{PYTHON_VERSION}.so.1.0".encode())
    installation = install_backend(tmp_path / "backends", server)
    assert "own Python backend" in installation.python_backend
    assert not (own / STUB).is_symlink()  # not replaced
    assert (tmp_path / "backends" / "tidepool" / "model.py").read_text() == BACKEND_MODEL_SOURCE


def test_a_stub_built_for_another_python_is_refused_in_one_line(tmp_path):
    server = fake_server(tmp_path / "server")
    own = tmp_path / "backends" / "python"
    own.mkdir(parents=True)
    (own / "libtriton_python.so").write_bytes(b"\x7fELF")
    executable(own / STUB, b"\x7fELF libpython3.8.so.1.0")
    with pytest.raises(ServerError, match=r"runs Python 3\.8 and this is Python 3\.\d+: install Tidepool"):
        install_backend(tmp_path / "backends", server)


def test_the_stubs_python_version_is_read_from_the_library_it_links(tmp_path):
    assert stub_python_version(executable(tmp_path / "stub", b"xx libpython3.10.so.1.0 yy")) == "3.10"
    assert stub_python_version(executable(tmp_path / "static", b"no library named")) is None
