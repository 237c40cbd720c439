"""Heavy reliability checks, run by `make test-slow`: a soak, a killed stub, a restarted server.
Each prints its figures (pytest -s shows them)."""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time

import numpy as np
import psutil
import pytest

from tests.integration.conftest import server_config
from tests.integration.flushed import scrape_flushed
from tidepool.clients.closed_loop import run_closed_loop
from tidepool.clients.metrics import values
from tidepool.launcher.server import TritonServer

pytestmark = pytest.mark.slow


def rss_bytes(pid: int) -> int:
    with open(f"/proc/{pid}/status") as status:
        line = next(line for line in status if line.startswith("VmRSS:"))
    return int(line.split()[1]) * 1024


def stub_pid(server: TritonServer, model: str, wait_s: float = 15.0) -> int:
    """The pid of the model's Python stub (a child of tritonserver), waiting while it restarts."""
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        for child in psutil.Process(server.process.pid).children(recursive=True):
            try:
                if any(f"/{model}/" in part for part in child.cmdline()):
                    return child.pid
            except psutil.NoSuchProcess:
                continue
        time.sleep(0.2)
    raise AssertionError(f"no stub process for {model}")


def encoder_only(root):
    """A repository holding just the encoder (a faster server start)."""
    from tidepool.testing import MODEL_REPOSITORY

    (root / "encoder").symlink_to(MODEL_REPOSITORY / "encoder", target_is_directory=True)
    return root


def load_in_background(url: str) -> tuple[threading.Thread, dict]:
    """60 s of 4 retrying closed-loop clients on a thread; the result lands in results["load"]."""
    results: dict = {}

    def run() -> None:
        results["load"] = run_closed_loop("encoder", url, concurrency=4, duration_s=60, retries=30)

    loader = threading.Thread(target=run)
    loader.start()
    return loader, results


def test_soak_50000_requests_keep_memory_flat(server):
    url, total, chunk = server.config.grpc_url, 50_000, 5_000
    run_closed_loop("encoder", url, concurrency=16, duration_s=5)  # warm-up
    stub = stub_pid(server, "encoder")  # one of its instances' stubs: at c=16 every instance serves
    samples = []  # (requests so far, server RSS, stub RSS, pool reserved)
    done, failures = 0, 0
    while done < total:
        load = run_closed_loop("encoder", url, concurrency=16, duration_s=600, max_requests=chunk)
        done += len(load.latencies_ms) + len(load.errors)
        failures += len(load.errors)
        samples_now = scrape_flushed(server.config.metrics_url)
        reserved = sum(values(samples_now, "tidepool_pool_reserved_bytes", model="encoder"))
        samples.append((done, rss_bytes(server.process.pid), rss_bytes(stub), reserved))
    figures = np.array(samples, dtype=float)
    slope_stub = np.polyfit(figures[:, 0], figures[:, 2], 1)[0]  # bytes per request
    slope_server = np.polyfit(figures[:, 0], figures[:, 1], 1)[0]
    # RSS moves by +-15 MiB as the allocator takes and gives back activation memory; the floor
    # of each third does not, so a leak shows as a rising floor (>= ~300 bytes/request here).
    third = len(figures) // 3
    growth_stub = figures[-third:, 2].min() - figures[:third, 2].min()
    growth_server = figures[-third:, 1].min() - figures[:third, 1].min()
    print(f"\nsoak: {done} requests, {failures} failures")
    print("  requests, server RSS MiB, stub RSS MiB, pool reserved MiB:")
    for row in figures:
        print(f"  {int(row[0]):>6} {row[1] / 2**20:8.1f} {row[2] / 2**20:8.1f} {row[3] / 2**20:8.1f}")
    print(
        f"  slope: stub {slope_stub:.1f}, server {slope_server:.1f} bytes/request; floor growth first to "
        f"last third: stub {growth_stub / 2**20:.1f} MiB, server {growth_server / 2**20:.1f} MiB"
    )
    assert failures == 0
    assert figures[-1, 3] == figures[0, 3]  # the pool reserved nothing more
    assert growth_stub < 16 * 2**20 and growth_server < 4 * 2**20


def test_a_killed_stub_is_replaced_by_tidepool_serve_and_clients_recover(tmp_path):
    """tritonserver 2.51 does not restart a dead Python stub; `tidepool serve` notices and
    restarts the server on the same ports; clients with retries see only the requests that were
    in flight in the dead stub fail."""
    import sys

    config = server_config(encoder_only(tmp_path))
    command = [sys.executable, "-m", "tidepool.cli", "serve", "--model-repository", str(tmp_path),
               "--http-port", str(config.http_port), "--grpc-port", str(config.grpc_port),
               "--metrics-port", str(config.metrics_port)]  # fmt: skip
    serve = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    lines: list[str] = []
    threading.Thread(target=lambda: lines.extend(serve.stdout), daemon=True).start()
    try:
        deadline = time.monotonic() + 120
        while not any("serving" in line for line in lines) and time.monotonic() < deadline:
            time.sleep(0.5)
        loader, results = load_in_background(config.grpc_url)
        time.sleep(5)
        server_pid = psutil.Process(serve.pid).children()[0].pid
        stub = next(
            c
            for c in psutil.Process(server_pid).children(recursive=True)
            if "/encoder/" in " ".join(c.cmdline())
        )
        os.kill(stub.pid, signal.SIGKILL)
        loader.join()
    finally:
        serve.send_signal(signal.SIGTERM)
        serve.wait(timeout=60)
    load = results["load"]
    print(f"\nstub kill: {len(load.latencies_ms)} served, {len(load.errors)} errors, max latency "
          f"{max(load.latencies_ms) / 1e3:.1f} s; tidepool serve said: "
          f"{[line.strip() for line in lines if 'died' in line or 'restarted' in line]}")  # fmt: skip
    assert any("died; restarting tritonserver" in line for line in lines)
    assert any("restarted; serving encoder" in line for line in lines)
    # Only the requests in flight in the dead stub fail (one per client at most).
    assert len(load.errors) <= 4 and all("is not healthy" in error for error in load.errors)
    assert len(load.latencies_ms) > 100


def test_clients_with_retries_ride_out_a_server_restart(tmp_path):
    config = server_config(encoder_only(tmp_path))
    server = TritonServer(config).start()
    loader, results = load_in_background(config.grpc_url)
    time.sleep(5)
    server.stop()
    time.sleep(2)
    server = TritonServer(config).start()
    loader.join()
    server.stop()
    load = results["load"]
    print(
        f"\nrestart: {len(load.latencies_ms)} served, {len(load.errors)} errors, max latency "
        f"{max(load.latencies_ms) / 1e3:.1f} s (the retried requests)"
    )
    assert load.errors == [] and len(load.latencies_ms) > 100
