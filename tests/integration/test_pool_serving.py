"""Every execution runs through the instance's pool, and /metrics shows it (real server)."""

from __future__ import annotations

import statistics
import time

import numpy as np
import pytest
from tritonclient.utils import InferenceServerException

from tests.integration.flushed import scrape_flushed
from tidepool.clients.closed_loop import run_closed_loop
from tidepool.clients.connection import Connection
from tidepool.clients.metrics import value, values
from tidepool.inputs import random_inputs


def pool_figures(server, model: str) -> dict[str, float]:
    """The pools of all of `model`'s instances: counts and bytes added up, the worst reuse ratio."""
    samples = scrape_flushed(server.config.metrics_url)
    names = ["upstream_allocs_total", "allocated_bytes", "reserved_bytes", "ooms_total"]
    figures = {name: sum(values(samples, f"tidepool_pool_{name}", model=model)) for name in names}
    figures["reuse_ratio"] = min(values(samples, "tidepool_pool_reuse_ratio", model=model))
    figures["batches"] = sum(values(samples, "tidepool_batches_total", model=model))
    figures["batch_rows"] = sum(values(samples, "tidepool_batch_rows_total", model=model))
    return figures


def test_steady_traffic_allocates_nothing_fresh_and_gives_everything_back(server):
    url = server.config.grpc_url
    run_closed_loop("encoder", url, concurrency=8, duration_s=2)  # warm-up: every batch size seen
    before = pool_figures(server, "encoder")
    load = run_closed_loop("encoder", url, concurrency=8, duration_s=60, max_requests=2000)
    after = pool_figures(server, "encoder")
    assert load.errors == [] and len(load.latencies_ms) == 2000
    assert after["upstream_allocs_total"] == before["upstream_allocs_total"]
    assert after["reuse_ratio"] >= before["reuse_ratio"] > 0.99
    # Python's garbage collector ran in the stubs while they served (the requests' Python objects),
    # and each instance says how long it paused.
    samples = scrape_flushed(server.config.metrics_url)
    assert sum(values(samples, "tidepool_gc_collections_total", model="encoder")) >= 1
    assert len(values(samples, "tidepool_gc_pause_us_total", model="encoder")) == 2  # both instances

    # Idle, each instance's pool holds exactly its last execution's blocks (its responses' memory)
    # and no more. A lone client's requests all run on the first instance (rate-limiter priorities)
    # when each finds it released: Triton releases an instance only after its response is sent, so
    # a request sent back to back can find it busy and run on the second, whose pool then holds a
    # batch of one instead of its last batch under load. Hence a pause between the lone requests.
    def lone_requests(count: int) -> None:
        with Connection.open("grpc", url) as grpc:
            spec = grpc.model_spec("encoder")
            for _ in range(count):
                time.sleep(0.1)  # Triton frees an instance once its response is sent: later when loaded
                grpc.infer("encoder", random_inputs(spec), spec)

    lone_requests(1)
    held = pool_figures(server, "encoder")["allocated_bytes"]
    lone_requests(30)
    assert pool_figures(server, "encoder")["allocated_bytes"] == held > 0
    batches = after["batches"] - before["batches"]
    rows = after["batch_rows"] - before["batch_rows"]
    assert rows == 2000 and batches < rows, f"{batches} batches for {rows} rows: nothing batched"


@pytest.mark.parametrize("protocol", ["grpc", "http"])
def test_a_request_over_the_pool_limit_fails_for_good_and_the_instance_keeps_serving(server, protocol):
    url = server.config.grpc_url if protocol == "grpc" else server.config.http_url
    with Connection.open(protocol, url) as connection:
        spec = connection.model_spec("pool_limited")
        big = {"X": np.ones((8, 16384), dtype=np.float32)}
        with pytest.raises(InferenceServerException) as caught:
            connection.infer_with_retries("pool_limited", big, spec, retries=3)
        message = str(caught.value)
        assert (
            "does not fit the model instance's memory pool" in message and "pool limit is 393216" in message
        )
        # Not UNAVAILABLE ("try again"): this server's pb_utils has no RESOURCE_EXHAUSTED, so INVALID_ARG.
        assert caught.value.status() in ("StatusCode.INVALID_ARGUMENT", "400")
        small = {"X": np.full((1, 16384), 3.0, dtype=np.float32)}
        np.testing.assert_array_equal(connection.infer("pool_limited", small, spec)["Y"], small["X"] * 2)
        assert connection.is_ready()
    assert pool_figures(server, "pool_limited")["ooms_total"] >= 1


STEADY_FAULTS = 20  # an execution that faults in fewer pages allocated nothing fresh


def page_faults_of_executions(
    server, grpc: Connection, model: str, executions: int, max_warmups: int = 5
) -> list[float]:
    """Minor page faults of each of `executions` executions, after up to `max_warmups` executions
    to warm up (fewer where one already faulted in no fresh pages)."""
    spec = grpc.model_spec(model)
    rows = {"X": np.ones((2, 4), dtype=np.float32)}

    def faults_so_far() -> float:
        return value(scrape_flushed(server.config.metrics_url), "tidepool_page_faults_total", model=model)

    def one_execution() -> float:
        before = faults_so_far()
        np.testing.assert_array_equal(grpc.infer(model, rows, spec)["Y"], rows["X"] + 1)
        return faults_so_far() - before

    for _ in range(max_warmups):
        if one_execution() < STEADY_FAULTS:
            break
    return [one_execution() for _ in range(executions)]


def test_with_the_pool_on_torch_memory_is_kept_and_executions_touch_no_fresh_pages(server):
    # `scratch` makes a 48 MiB tensor per forward pass: glibc's malloc maps blocks over 32 MiB
    # afresh each time and unmaps them on free, so without the pool every execution faults them in.
    # With it the heap settles within a few executions: the free chunks that warm-up left without
    # pages are faulted in once each, not always in a row (seen: 9 executions after load, and a
    # steady execution followed by one more that faulted), hence up to 20 to warm up and the median.
    with Connection.open("grpc", server.config.grpc_url) as grpc:
        pool_on = page_faults_of_executions(server, grpc, "scratch", executions=7, max_warmups=20)
        pool_off = page_faults_of_executions(server, grpc, "scratch_pool_off", executions=7)
    print(f"minor page faults of each execution: pool on {pool_on}, POOL=off {pool_off}")
    assert min(pool_off) > 200  # the kernel may map several 4 KiB pages per fault
    assert statistics.median(pool_on) < STEADY_FAULTS
