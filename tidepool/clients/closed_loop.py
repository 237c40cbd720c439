"""Closed-loop load: N clients, each sending its next request when the last one is answered,
for a fixed time. Returns the raw latencies so callers compute their own percentiles."""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

import numpy as np
from tritonclient.utils import InferenceServerException

from tidepool.clients.connection import Connection
from tidepool.errors import TidepoolError
from tidepool.sequences import traffic
from tidepool.spec import Array, LengthMix, ModelSpec

REQUESTS_PER_CLIENT = 64  # prepared requests each client sends in turn (lengths drawn from the mix)


class LoadError(TidepoolError):
    """The load could not start: a client could not reach the server or read the model."""


@dataclass
class LoadResult:
    concurrency: int
    duration_s: float
    latencies_ms: list[float] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    batch: int = 1

    @property
    def requests_per_s(self) -> float:
        return len(self.latencies_ms) / self.duration_s if self.duration_s else 0.0

    @property
    def samples_per_s(self) -> float:
        return self.requests_per_s * self.batch

    def percentile_ms(self, q: float) -> float:
        return float(np.percentile(self.latencies_ms, q)) if self.latencies_ms else float("nan")


def run_closed_loop(
    model: str,
    url: str,
    protocol: str = "grpc",
    concurrency: int = 8,
    duration_s: float = 10.0,
    batch: int = 1,
    max_requests: int | None = None,
    retries: int = 0,
    lengths: LengthMix | None = None,
) -> LoadResult:
    """Run until `duration_s` has passed or `max_requests` have been answered, whichever is first.
    A model with sequence inputs is sent lengths drawn from `lengths` (else its LENGTH_MIX)."""
    result = LoadResult(concurrency, duration_s, batch=batch)
    lock = threading.Lock()
    began_at: list[float] = []  # set once every client is connected, before any is released
    start = threading.Barrier(concurrency + 1, action=lambda: began_at.append(time.perf_counter()))
    sent = [0]

    def client(index: int) -> None:
        # One connection per client: tritonclient's HTTP client is not thread-safe.
        try:
            with Connection.open(protocol, url) as connection:
                spec = connection.model_spec(model)
                requests = traffic(spec, REQUESTS_PER_CLIENT, batch, seed=index, mix=lengths)
                start.wait()
                send(connection, spec, itertools.cycle(requests))
        except threading.BrokenBarrierError:
            return  # another client could not start
        except (InferenceServerException, OSError) as exc:
            with lock:
                setup_errors.append(f"client {index} could not start: {exc}")
            start.abort()

    def send(connection: Connection, spec: ModelSpec, requests: Iterator[dict[str, Array]]) -> None:
        for inputs in requests:
            if time.perf_counter() >= began_at[0] + duration_s:
                return
            with lock:
                if max_requests is not None and sent[0] >= max_requests:
                    return
                sent[0] += 1
            began = time.perf_counter()
            try:
                connection.infer_with_retries(model, inputs, spec, retries=retries)
                latency = (time.perf_counter() - began) * 1e3
                with lock:
                    result.latencies_ms.append(latency)
            except (InferenceServerException, OSError) as exc:
                with lock:
                    result.errors.append(str(exc))

    setup_errors: list[str] = []
    threads = [threading.Thread(target=client, args=(i,), daemon=True) for i in range(concurrency)]
    for thread in threads:
        thread.start()
    try:
        start.wait()
    except threading.BrokenBarrierError:
        for thread in threads:
            thread.join()
        raise LoadError(setup_errors[0] if setup_errors else "a client could not start") from None
    for thread in threads:
        thread.join()
    result.duration_s = time.perf_counter() - began_at[0]
    return result
