"""The launcher's set-up steps, without starting a server."""

import socket
import stat

import pytest

from tidepool import ports
from tidepool.launcher import discovery as server
from tidepool.launcher.discovery import ServerError
from tidepool.ports import PortInUse


def executable(path):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("#!/bin/sh\n")
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return path


def test_an_explicit_path_wins_over_the_environment(tmp_path, monkeypatch):
    explicit = executable(tmp_path / "a" / "tritonserver")
    monkeypatch.setenv("TRITONSERVER", str(executable(tmp_path / "b" / "tritonserver")))
    assert server.find_tritonserver(explicit) == explicit
    assert server.find_tritonserver(None) == tmp_path / "b" / "tritonserver"


def test_a_bad_explicit_path_is_named(tmp_path, monkeypatch):
    monkeypatch.setenv("TRITONSERVER", str(tmp_path / "missing"))
    with pytest.raises(ServerError, match="TRITONSERVER points at .*missing, which is not an executable"):
        server.find_tritonserver(None)


def test_the_bundled_server_is_found_without_help(monkeypatch):
    monkeypatch.delenv("TRITONSERVER", raising=False)
    monkeypatch.setenv("PATH", "/nonexistent")
    found = server.find_tritonserver(None)
    assert found.name == "tritonserver" and "pytriton" in str(found)


def test_no_server_anywhere_says_how_to_get_one(monkeypatch):
    monkeypatch.delenv("TRITONSERVER", raising=False)
    monkeypatch.setenv("PATH", "/nonexistent")
    monkeypatch.setattr(server, "_pytriton_server", lambda: None)
    with pytest.raises(ServerError, match="no tritonserver found.*make venv"):
        server.find_tritonserver(None)


def fake_install(tmp_path, stub_versions):
    binary = executable(tmp_path / "tritonserver" / "bin" / "tritonserver")
    python_dir = tmp_path / "tritonserver" / "backends" / "python"
    python_dir.mkdir(parents=True)
    (python_dir / "libtriton_python.so").write_bytes(b"\x7fELF")
    (python_dir / "triton_python_backend_utils.py").write_text("")
    for version in stub_versions:
        executable(tmp_path / "tritonserver" / "python_backend_stubs" / version / server.STUB)
    return binary


def test_a_missing_stub_names_the_python_versions_that_exist(tmp_path):
    binary = fake_install(tmp_path, ["3.8", "3.9"])
    with pytest.raises(
        ServerError, match=r"no Python backend stub for Python 3\.\d+ .*stubs exist for 3.8, 3.9"
    ):
        server.find_python_backend(binary)


def test_a_port_in_use_is_named_with_the_flag_to_change_it():
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        with pytest.raises(PortInUse, match=f"port {port} on 127.0.0.1 is in use.*--grpc-port"):
            ports.check_port_free("127.0.0.1", port, "--grpc-port")


def test_the_environment_puts_the_venv_first_and_libpython_on_the_library_path(monkeypatch):
    monkeypatch.setenv("PYTHONPATH", "/somewhere")
    env = server.server_environment()
    assert env["PATH"].split(":")[0].endswith("/bin")
    assert server.sysconfig.get_config_var("LIBDIR") in env["LD_LIBRARY_PATH"].split(":")
    assert "PYTHONPATH" not in env


def test_serve_names_a_config_planned_on_another_machine(tmp_path):
    from tidepool.launcher.serve import planned_elsewhere
    from tidepool.machine import describe_cpu

    for name, machine in (("here", describe_cpu()), ("there", "64 cores, Some Other CPU")):
        (tmp_path / name).mkdir()
        (tmp_path / name / "config.pbtxt").write_text(f"# Planned on: cpu: {machine}.\nname: '{name}'\n")
    (tmp_path / "unplanned").mkdir()
    (tmp_path / "unplanned" / "config.pbtxt").write_text("name: 'unplanned'\n")
    [warning] = planned_elsewhere(tmp_path)
    assert "there's config was planned on 64 cores, Some Other CPU" in warning and "make configs" in warning


def test_the_launchers_command_line_has_its_flags_and_plain_mode_only_the_users(tmp_path):
    from tidepool.launcher.server import ServerConfig, TritonServer

    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "config.pbtxt").write_text("name: 'm'\n")
    launched = TritonServer(ServerConfig(tmp_path, grace_s=25, backend_config=["python,x=1"]))
    args = launched.command(tmp_path / "backends")
    assert "--rate-limit=execution_count" in args and "--exit-timeout-secs=20" in args
    assert "--backend-config=python,x=1" in args
    assert any(arg.startswith("--backend-config=python,shm-region-prefix-name=tidepool_") for arg in args)
    plain = TritonServer(ServerConfig(tmp_path, plain=True, model_control="explicit"))
    flags = [arg.split("=")[0] for arg in plain.command(tmp_path / "backends")[1:]]
    assert flags == ["--model-repository", "--backend-directory", "--http-address", "--http-port",
                     "--grpc-address", "--grpc-port", "--metrics-address", "--metrics-port",
                     "--model-control-mode", "--load-model"]  # fmt: skip


def test_urls_take_loopback_for_every_interface_and_brackets_for_ipv6():
    from tidepool.launcher.server import ServerConfig

    assert ServerConfig(host="0.0.0.0", http_port=1).http_url == "127.0.0.1:1"
    assert ServerConfig(host="::1", grpc_port=2).grpc_url == "[::1]:2"
    assert ServerConfig(host="10.0.0.5", metrics_port=3).metrics_url == "http://10.0.0.5:3/metrics"


def test_a_repository_without_models_is_refused_with_what_it_lacks(tmp_path):
    from tidepool.launcher.server import ServerError, _models_in

    with pytest.raises(ServerError, match="is not a directory"):
        _models_in(tmp_path / "missing")
    with pytest.raises(ServerError, match=r"has no model \(no \*/config.pbtxt\)"):
        _models_in(tmp_path)
    (tmp_path / "b").mkdir()
    (tmp_path / "b" / "config.pbtxt").write_text("")
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "config.pbtxt").write_text("")
    (tmp_path / "not_a_model").mkdir()
    assert _models_in(tmp_path) == ["a", "b"]
