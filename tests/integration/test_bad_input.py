"""Every kind of bad request, over HTTP and gRPC, against both example models: a clear error
that names the input and the problem, the server still ready, the pool back at idle."""

from __future__ import annotations

import pytest

from tests.integration.bad_requests import CASES, MODELS
from tidepool.clients.metrics import scrape, value


@pytest.mark.parametrize("model", sorted(MODELS))
@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_a_bad_request_gets_a_clear_error_and_nothing_is_lost(server, connection, model, case):
    error = case.send(connection, model)
    input_name = MODELS[model][0]
    for expected in case.expect:
        assert expected.format(input=input_name).lower() in error.lower(), error
    assert connection.is_ready()
    samples = scrape(server.config.metrics_url)
    assert value(samples, "tidepool_pool_allocated_bytes", model=model) == 0
