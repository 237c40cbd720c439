"""Every kind of bad request, over HTTP and gRPC, against both example models: a clear error
that names the input and the problem, the server still ready, the pool back at idle."""

from __future__ import annotations

import pytest

from tests.integration.flushed import scrape_flushed
from tidepool.clients.metrics import values
from tidepool.inputs import random_inputs
from tidepool.testing.bad_requests import CASES, MODELS, sent_wrong_shape


def pool_in_use(server, model: str) -> float:
    samples = scrape_flushed(server.config.metrics_url)
    return sum(values(samples, "tidepool_pool_allocated_bytes", model=model))


@pytest.mark.parametrize("model", sorted(MODELS))
@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_a_bad_request_gets_a_clear_error_and_nothing_is_lost(server, connection, model, case):
    spec = connection.model_spec(model)
    connection.infer(model, random_inputs(spec), spec)  # the pool now holds one good execution's blocks
    held = pool_in_use(server, model)
    assert held > 0, "the good request's blocks should show in the pool's metrics"
    error = case.send(connection, model)
    details = {"input": MODELS[model][0], "sent_shape": sent_wrong_shape(connection, model)}
    for expected in case.expect:
        assert expected.format(**details).lower() in error.lower(), error
    assert connection.is_ready()
    # A bad request keeps nothing: after the next good one the pool holds that one's blocks alone.
    connection.infer(model, random_inputs(spec), spec)
    assert pool_in_use(server, model) == held
