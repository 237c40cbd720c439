"""The measuring tools against a real server: the sweep, and Locust (each user class,
distributed, and a run that fails); both spread over several addresses, here the server's own and
a TCP forwarder's in front of it (as two pods with no request-level balancer)."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator

import pytest

from tidepool.clients.locust_run import LoadSettings, RequestLog, run_load
from tidepool.clients.sweep import Sweep, SweepSettings


class Forwarder:
    """A loopback TCP port that forwards each connection to `target`, counting the bytes sent to it
    (gRPC shares one connection among a process's channels to one address: counting connections
    would say nothing)."""

    def __init__(self, target: str) -> None:
        host, port = target.rsplit(":", 1)
        self.target = (host, int(port))
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.address = f"127.0.0.1:{self.listener.getsockname()[1]}"
        self.sent = 0
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:  # closed
                return
            upstream = socket.create_connection(self.target)
            for source, sink, counted in ((client, upstream, True), (upstream, client, False)):
                threading.Thread(target=self._pipe, args=(source, sink, counted), daemon=True).start()

    def _pipe(self, source: socket.socket, sink: socket.socket, counted: bool) -> None:
        try:
            while data := source.recv(65536):
                sink.sendall(data)
                if counted:
                    self.sent += len(data)
        except OSError:
            pass
        finally:
            for end in (source, sink):
                end.close()


@pytest.fixture
def forwarder(server) -> Iterator[Forwarder]:
    forwarding = Forwarder(server.config.grpc_url)
    yield forwarding
    forwarding.listener.close()


def test_a_sweep_over_two_addresses_sends_through_both(server, forwarder):
    both = f"{server.config.grpc_url},{forwarder.address}"
    settings = SweepSettings("encoder", url=both, concurrency=(4,), window_s=1.0, warmup_s=0.5, max_windows=2)
    [level] = Sweep(settings).run()
    assert level.errors == 0 and level.requests > 0 and level.compute_infer_us > 0
    # Two of the four workers send through the forwarder, each request 1 KiB of token ids; only the
    # statistics' calls would if every worker went to the first address. (Through the forwarder's
    # extra hop those two answer fewer than half the requests on a loaded machine: 24% in one run.)
    assert forwarder.sent > level.requests / 8 * 1024


def test_a_short_sweep_returns_sane_figures(server):
    settings = SweepSettings(
        "encoder", protocol="grpc", url=server.config.grpc_url, concurrency=(1, 8),
        window_s=2.0, warmup_s=1.0, max_windows=3,
    )  # fmt: skip
    low, high = Sweep(settings).run()
    for level in (low, high):
        assert level.errors == 0 and level.throughput > 0 and level.requests > 0
        assert level.p50_ms > 0 and level.compute_infer_us > 0
    # Behaviour, not speed (speed is for benchmarks): a lone client is never batched, and eight
    # clients on two instances of max_batch_size 2 queue behind them and are.
    assert low.avg_batch == 1.0
    assert high.avg_batch > 1.0, "the dynamic batcher formed no batch at concurrency 8"


def test_an_open_loop_sweep_sends_on_its_schedule_whatever_the_answers(server):
    settings = SweepSettings(
        "encoder",
        url=server.config.grpc_url,
        request_rates=(20.0,),
        window_s=2.0,
        warmup_s=0.5,
        max_windows=2,
    )
    [level] = Sweep(settings).run()
    # Two kept windows of 2 s at 20 requests/s: 80 sends, each answered or counted as an error.
    assert level.errors == 0 and abs(level.requests - 80) <= 2 and level.windows == 2


def test_each_locust_user_class_records_requests_and_no_failures(server, forwarder, tmp_path):
    grpc_both = f"{server.config.grpc_url},{forwarder.address}"  # two of the four users each
    for protocol, url in (("grpc", grpc_both), ("http", server.config.http_url)):
        summary = run_load(
            LoadSettings("encoder", users=4, spawn_rate=4, duration="15s", protocol=protocol, url=url,
                         report_dir=tmp_path / protocol)
        )  # fmt: skip
        assert summary.requests > 100 and summary.failures == 0, protocol
        assert summary.verdict(p99_bound_ms=None) == []
        assert (tmp_path / protocol / "report.html").is_file()
    assert forwarder.sent > 50 * 1024  # of more than 100 requests of 1 KiB, two users' share


def test_a_distributed_run_records_requests_from_both_workers(server, tmp_path):
    summary = run_load(
        LoadSettings("encoder", users=4, spawn_rate=4, duration="10s", url=server.config.grpc_url,
                     workers=2, report_dir=tmp_path, request_log=True)
    )  # fmt: skip
    assert summary.failures == 0 and summary.requests > 0
    assert len(summary.by_worker) == 2 and all(count > 0 for count in summary.by_worker.values())
    # The request log: one file per worker, every answered request in it, whatever window is asked.
    assert len(list(tmp_path.glob("requests-*.csv"))) == 2
    log = RequestLog.read(tmp_path)
    assert int(log.ok.sum()) == summary.requests
    began, ended = log.finished_s.min(), log.finished_s.max() + 1
    whole = log.window(began, ended)
    assert whole.failures == 0 and 0 < whole.p99_ms < 10_000
    assert whole.requests_per_s * (ended - began) == pytest.approx(summary.requests)
    # Two halves of the run hold every request once; the second after the run holds none.
    middle = (began + ended) / 2
    halves = [log.window(began, middle), log.window(middle, ended)]
    counted = sum(half.requests_per_s * (middle - began) for half in halves)
    assert counted == pytest.approx(summary.requests) and all(half.requests_per_s > 0 for half in halves)
    after = log.window(ended, ended + 1)
    assert after.requests_per_s == 0 and after.p99_ms == 0


def test_a_run_whose_requests_are_rejected_ends_non_zero_with_the_failures(server, tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"INPUT_IDS": [[99999] * 128]}))
    done = subprocess.run(
        [sys.executable, "-m", "tidepool.cli", "load", "encoder", "--url", server.config.grpc_url,
         "--users", "2", "--spawn-rate", "2", "--duration", "3s", "--input-data", str(bad),
         "--report-dir", str(tmp_path / "report"), "--request-log"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 1
    assert "FAILED:" in done.stderr and "requests failed" in done.stderr
    failures = (tmp_path / "report" / "locust_failures.csv").read_text()
    assert "value 99999 is outside the allowed range" in failures
    log = RequestLog.read(tmp_path / "report")
    assert log.ok.size > 0 and not log.ok.any()  # every request logged, as failed
