"""Overload and cancellation against the `slow` test model (50 ms x the largest X a batch of up to
4, a queue of at most 8 that rejects): a burst is met by fast rejections, not a growing queue;
cancelled requests still queued are not executed."""

from __future__ import annotations

import asyncio
import time

import numpy as np
import tritonclient.grpc.aio as grpc_aio
from tritonclient.utils import InferenceServerException

from tests.integration.flushed import scrape_flushed
from tidepool.clients.metrics import value


def rows_executed(server) -> float:
    return value(scrape_flushed(server.config.metrics_url), "tidepool_batch_rows_total", model="slow")


async def send(client, seconds: float | None = None, x: int = 1, rows: int = 1) -> tuple[bool, float, str]:
    """One request of `rows` rows; the slow model takes 50 ms x `x` for its batch."""
    tensor = grpc_aio.InferInput("X", [rows, 1], "INT32")
    tensor.set_data_from_numpy(np.full((rows, 1), x, dtype=np.int32))
    began = time.perf_counter()
    try:
        await client.infer("slow", [tensor], client_timeout=seconds)
        return True, time.perf_counter() - began, ""
    except InferenceServerException as exc:
        return False, time.perf_counter() - began, str(exc)


def test_a_burst_above_capacity_is_rejected_not_queued_and_the_server_recovers(server):
    async def scenario():
        client = grpc_aio.InferenceServerClient(server.config.grpc_url)
        before = rows_executed(server)
        burst = await asyncio.gather(*(send(client) for _ in range(64)))
        await asyncio.sleep(0.2)
        executed = rows_executed(server) - before
        after = [await send(client) for _ in range(3)]
        await client.close()
        return burst, executed, after

    burst, executed, after = asyncio.run(scenario())
    served = [ok for ok, _, _ in burst if ok]
    rejected = [error for ok, _, error in burst if not ok]
    assert rejected, "64 requests at once fit a queue of 8: nothing was rejected"
    assert all("queue" in error.lower() or "timeout" in error.lower() for error in rejected), rejected[:3]
    assert served and executed == len(served), "a rejected request was executed, or a served one was not"
    assert all(ok for ok, _, _ in after), after  # served again once the burst is over
    assert server.is_ready()


def test_cancelled_requests_that_are_still_queued_are_not_executed(server):
    async def scenario():
        client = grpc_aio.InferenceServerClient(server.config.grpc_url)
        before = rows_executed(server)
        # A request of four rows fills the first batch, which runs for 2 s; the next four
        # requests, sent once it runs, wait behind it and are cancelled (client timeout) while
        # still queued; then one more request after they are gone. The margins are wide, for a
        # loaded machine.
        first = asyncio.ensure_future(send(client, x=40, rows=4))
        await asyncio.sleep(0.5)
        cancelled = await asyncio.gather(*(send(client, seconds=0.3) for _ in range(4)))
        done = [await first]
        last = await send(client)
        await asyncio.sleep(0.2)
        after = rows_executed(server)
        await client.close()
        return before, cancelled, done, last, after

    before, cancelled, done, last, after = asyncio.run(scenario())
    assert all(ok for ok, _, _ in done) and last[0]
    assert not any(ok for ok, _, _ in cancelled)
    executed = after - before
    assert executed == 5, f"{executed} rows ran for the 5 requests that were not cancelled"
