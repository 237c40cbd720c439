"""/metrics once the backend's metrics threads have sent what came before: every server the
tests start sends every TEST_INTERVAL_S (TIDEPOOL_METRICS_INTERVAL_S, set in conftest.py)."""

from __future__ import annotations

import time

from tidepool.clients.metrics import Sample, scrape

TEST_INTERVAL_S = 0.05


def scrape_flushed(url: str) -> list[Sample]:
    time.sleep(4 * TEST_INTERVAL_S)
    return scrape(url)
