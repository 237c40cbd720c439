"""Locust users for any Triton server: a gRPC user (gevent-patched gRPC) and an HTTP user, each
firing Locust's request event with the real response time and failures.

Chosen by environment (set by `tidepool load`, or by hand):
  TIDEPOOL_MODEL        model to load (required)
  TIDEPOOL_BATCH        rows per request (default 1)
  TIDEPOOL_INPUT_DATA   a .npz or .json file of inputs (default: valid random inputs)
  TIDEPOOL_LENGTHS      a length mix to send a model with sequence inputs (default: its LENGTH_MIX);
                        its requests are named MODEL short (at most the median length), MODEL long
                        (at least the 90th percentile) or MODEL, and their content size is the
                        tokens they sent
  TIDEPOOL_STEP_USERS, TIDEPOOL_STEP_SECONDS, TIDEPOOL_STEP_COUNT
                        a step load: +STEP_USERS every STEP_SECONDS, STEP_COUNT steps
  TIDEPOOL_WORKER_REPORT  file where the master writes the requests each worker sent
  TIDEPOOL_REQUEST_LOG  folder where each process writes every request it sent (requests-<pid>.csv:
                        finished at, Unix s; response time ms; ok), for figures over any window
--host is the server address (host:port of gRPC or HTTP), or several separated by commas: the users
take them in turn (several pods with no request-level balancer in front).

    TIDEPOOL_MODEL=encoder locust -f loadtests/locustfile.py --host 127.0.0.1:8001 TritonGrpcUser
"""

from __future__ import annotations

import grpc.experimental.gevent as grpc_gevent

grpc_gevent.init_gevent()  # before any channel exists: gRPC then yields to other greenlets

import itertools  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import time  # noqa: E402
from collections import Counter  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import TextIO  # noqa: E402

import numpy as np  # noqa: E402
from locust import LoadTestShape, User, events, task  # noqa: E402

from tidepool.clients.connection import Connection, addresses  # noqa: E402
from tidepool.inputs import load_requests  # noqa: E402
from tidepool.sequences import Sequences, tokens, traffic  # noqa: E402
from tidepool.spec import LengthMix, ModelSpec  # noqa: E402

__all__ = ["TritonGrpcUser", "TritonHttpUser"]  # and StepLoad, when a step load is asked for


class TritonRequestFailed(Exception):
    """A failed inference as Locust reports it: the server's own message, not a bare class name."""


def named(spec: ModelSpec, model: str, requests: list[dict]) -> list[tuple[dict, str, int]]:
    """Each request with its name in Locust's statistics and its content size: for a model with
    sequence inputs, its length class (short: at most the median length, long: at least the 90th
    percentile) and the tokens it sends; else the model's name, and 0 (the answer's bytes count)."""
    sequences = Sequences.of(spec)
    if sequences is None:
        return [(request, model, 0) for request in requests]
    lengths = [sequences.length(request, spec.batched) for request in requests]
    short, long = np.percentile(lengths, 50), np.percentile(lengths, 90)
    return [
        (request, f"{model} short" if n <= short else f"{model} long" if n >= long else model,
         tokens(request, spec, sequences))
        for request, n in zip(requests, lengths, strict=True)
    ]  # fmt: skip


_users_started = itertools.count()
_seeds = itertools.count()  # each user draws its own lengths
REQUESTS_PER_USER = 64


class TritonUser(User):
    abstract = True
    protocol = "grpc"

    def on_start(self) -> None:
        self.model = os.environ.get("TIDEPOOL_MODEL", "")
        if not self.model:
            raise RuntimeError("set TIDEPOOL_MODEL to the model to load")
        hosts = addresses(self.host)
        host = hosts[next(_users_started) % len(hosts)]
        # Locust's web page asks for a URL: its scheme says nothing here (the user class does).
        host = host.removeprefix("http://").removeprefix("grpc://") if host else None
        self.connection = Connection.open(self.protocol, host)
        self.spec = self.connection.model_spec(self.model)
        data = os.environ.get("TIDEPOOL_INPUT_DATA")
        batch = int(os.environ.get("TIDEPOOL_BATCH", "1"))
        lengths = os.environ.get("TIDEPOOL_LENGTHS")
        mix = LengthMix.parse(lengths, "TIDEPOOL_LENGTHS") if lengths else None
        requests = (
            load_requests(data, self.spec)
            if data
            else traffic(self.spec, REQUESTS_PER_USER, batch, next(_seeds), mix)
        )
        self.requests = itertools.cycle(named(self.spec, self.model, requests))

    def on_stop(self) -> None:
        self.connection.close()

    @task
    def infer(self) -> None:
        request, name, sent = next(self.requests)
        began = time.perf_counter()
        error: Exception | None = None
        length = sent
        try:
            outputs = self.connection.infer(self.model, request, self.spec)
            length = sent or sum(array.nbytes for array in outputs.values())
        except Exception as exc:  # every failure is reported to Locust, none ends the user
            error = TritonRequestFailed(str(exc) or type(exc).__name__)
        self.environment.events.request.fire(
            request_type=self.protocol,
            name=name,
            response_time=(time.perf_counter() - began) * 1e3,
            response_length=length,
            exception=error,
            context={},
        )


class TritonGrpcUser(TritonUser):
    protocol = "grpc"


class TritonHttpUser(TritonUser):
    protocol = "http"


if os.environ.get("TIDEPOOL_STEP_USERS"):

    def step_levels() -> list[int]:
        """Users at each step: TIDEPOOL_STEP_USERS as a list (1,2,4,8), or N: N, 2N, ... STEP_COUNT steps."""
        text = os.environ["TIDEPOOL_STEP_USERS"]
        if "," in text:
            return [int(part) for part in text.split(",") if part.strip()]
        count = int(os.environ.get("TIDEPOOL_STEP_COUNT", "4"))
        return [int(text) * (step + 1) for step in range(count)]

    class StepLoad(LoadTestShape):
        """STEP_SECONDS at each level of users, then stop."""

        levels = step_levels()
        step_seconds = float(os.environ.get("TIDEPOOL_STEP_SECONDS", "10"))

        def tick(self) -> tuple[int, float] | None:
            step = int(self.get_run_time() // self.step_seconds)
            if step >= len(self.levels):
                return None
            return self.levels[step], float(self.levels[step])

    __all__.append("StepLoad")


# Per-worker request counts in distributed runs: workers add theirs to each report, the master
# sums them by worker and writes them out when it quits.
_sent_here: Counter[str] = Counter()
_by_worker: Counter[str] = Counter()


@events.request.add_listener
def _count(request_type, name, exception=None, **_):
    if exception is None:
        _sent_here["requests"] += 1


@events.report_to_master.add_listener
def _report(client_id, data):
    data["tidepool_requests"] = _sent_here["requests"]
    _sent_here["requests"] = 0


@events.worker_report.add_listener
def _collect(client_id, data):
    _by_worker[client_id] += data.get("tidepool_requests", 0)


# Every request, when TIDEPOOL_REQUEST_LOG names a folder: Locust's own history keeps a rolling
# percentile whose window is only roughly 10 s, too coarse to say what the last seconds of a step saw.
# Opened at the first request, so that a master (which sends none) writes no file.
_request_log: list[TextIO] = []
if os.environ.get("TIDEPOOL_REQUEST_LOG"):

    @events.request.add_listener
    def _log_request(response_time, exception=None, **_):
        if not _request_log:
            path = Path(os.environ["TIDEPOOL_REQUEST_LOG"]) / f"requests-{os.getpid()}.csv"
            _request_log.append(path.open("w", buffering=1 << 16))
            _request_log[0].write("finished_s,response_ms,ok\n")
        _request_log[0].write(f"{time.time():.3f},{response_time:.2f},{int(exception is None)}\n")


@events.quitting.add_listener
def _write_worker_report(environment, **_):
    for log in _request_log:
        log.close()
    path = os.environ.get("TIDEPOOL_WORKER_REPORT")
    if path and _by_worker:
        with open(path, "w") as handle:
            json.dump(dict(_by_worker), handle, indent=2)
