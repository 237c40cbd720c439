"""/metrics once the backend's metrics threads have sent what came before: every server the
tests start sends every TEST_INTERVAL_S (TIDEPOOL_METRICS_INTERVAL_S, set in conftest.py), so the
figures are taken once Tidepool's stop changing between scrapes several intervals apart (polled,
with a deadline, since a loaded machine delays the threads)."""

from __future__ import annotations

import time

from tidepool.clients.metrics import Sample, scrape

TEST_INTERVAL_S = 0.05
SETTLED_AFTER_S = 4 * TEST_INTERVAL_S  # unchanged over this long: every pending send has landed
DEADLINE_S = 15.0


def tidepool_figures(samples: list[Sample]) -> list[tuple[str, list[tuple[str, str]], float]]:
    return sorted(
        (s.name, sorted(s.labels.items()), s.value) for s in samples if s.name.startswith("tidepool_")
    )


def scrape_flushed(url: str) -> list[Sample]:
    deadline = time.monotonic() + DEADLINE_S
    time.sleep(SETTLED_AFTER_S)
    samples = scrape(url)
    while time.monotonic() < deadline:
        time.sleep(SETTLED_AFTER_S)
        again = scrape(url)
        if tidepool_figures(again) == tidepool_figures(samples):
            return again
        samples = again
    raise AssertionError(f"Tidepool's metrics at {url} still changed after {DEADLINE_S:.0f} s")
