"""The signals a HorizontalPodAutoscaler scales Tidepool pods on. One grows with load from the
first request: the pod's CPU against its request (a Resource metric, no adapter needed). The other
guards saturation, per model: the time its requests waited in Triton's queue over the time they
computed. Near 0 while instances take requests as they come, it crosses 1 when a request waits as
long as it computes; alone it stays near 0 until a pod saturates and then climbs steeply, so an HPA
on it alone swings between too few pods and too many. Computed here from two scrapes of /metrics
exactly as the prometheus-adapter rule computes it from Prometheus, so a test can read it off a real
server."""

from __future__ import annotations

from dataclasses import dataclass

from tidepool.clients.metrics import Sample

SIGNAL = "tidepool_queue_to_compute_ratio"
QUEUE_US = "nv_inference_queue_duration_us"  # Triton's counters, cumulative per model
COMPUTE_US = "nv_inference_compute_infer_duration_us"
DEFAULT_TARGET = 1.0
RATE_WINDOW = "1m"
# Where nothing computed, the ratio is 0, not a division by zero: the denominator is at least this
# many microseconds per second.
MIN_COMPUTE_US_PER_S = 1.0


@dataclass(frozen=True)
class AdapterRule:
    """One prometheus-adapter custom-metrics rule that serves SIGNAL per pod."""

    window: str = RATE_WINDOW

    def query(self) -> str:
        # By pod and model: an HPA metric selects one model's series (`selector: model: NAME`), so
        # a heavy model cannot hide a light model's queue behind its long compute.
        def rate(counter: str) -> str:
            return f"sum(rate({counter}{{<<.LabelMatchers>>}}[{self.window}])) by (<<.GroupBy>>, model)"

        return f"{rate(QUEUE_US)} / clamp_min({rate(COMPUTE_US)}, {MIN_COMPUTE_US_PER_S:g})"

    def as_dict(self) -> dict[str, object]:
        return {
            "seriesQuery": f'{QUEUE_US}{{namespace!="",pod!=""}}',
            "resources": {"overrides": {"namespace": {"resource": "namespace"}, "pod": {"resource": "pod"}}},
            "name": {"matches": f"^{QUEUE_US}$", "as": SIGNAL},
            "metricsQuery": self.query(),
        }


def _total(samples: list[Sample], name: str, model: str | None) -> float:
    return sum(
        s.value for s in samples if s.name == name and (model is None or s.labels.get("model") == model)
    )


def queue_to_compute_ratio(
    before: list[Sample], after: list[Sample], elapsed_s: float, model: str | None = None
) -> float:
    """SIGNAL for one pod (one of its models, or all together) between two scrapes of its
    /metrics, `elapsed_s` apart: what the adapter rule's rate() ratio gives over that window."""
    if elapsed_s <= 0:
        raise ValueError("the scrapes must be apart in time")
    queue = (_total(after, QUEUE_US, model) - _total(before, QUEUE_US, model)) / elapsed_s
    compute = (_total(after, COMPUTE_US, model) - _total(before, COMPUTE_US, model)) / elapsed_s
    return queue / max(compute, MIN_COMPUTE_US_PER_S)
