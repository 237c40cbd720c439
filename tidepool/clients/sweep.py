"""`tidepool sweep`: latency and throughput of any model on any Triton server, level by level
(closed-loop concurrency, or open-loop request rate), with the server's own split of the time
from its statistics API. Each level: a warm-up, then windows until two agree within 10%. A model
with sequence inputs is sent its length mix (LENGTH_MIX, --lengths or --inputs), and its tokens/s,
the p99 of its short and long requests and the server's padding are reported too."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import TypeVar

import numpy as np

from tidepool.clients.aio_workers import Outcome, Worker
from tidepool.clients.connection import Connection, addresses
from tidepool.clients.metrics import scrape
from tidepool.errors import TidepoolError
from tidepool.inputs import describe_generated, load_requests
from tidepool.sequences import Sequences, padded_to, traffic
from tidepool.spec import LengthMix, positive_ints

T = TypeVar("T")


class SweepError(TidepoolError):
    """Sweep settings that make no sense; says which."""


def parse_levels(text: str) -> list[int]:
    """'1:32:x2' -> 1, 2, 4, ..., 32; '1:8:+2' -> 1, 3, 5, 7; '1,4,8' -> as given."""
    if ":" not in text:
        try:
            return positive_ints(text, "levels", example="1,4,8")
        except TidepoolError as exc:
            raise SweepError(str(exc)) from None
    try:
        start, stop, step = (text.split(":") + ["x2"])[:3]
        value, stop_value, levels = int(start), int(stop), []
        grow = (
            (lambda v: v * int(step[1:])) if step.startswith("x") else (lambda v: v + int(step.lstrip("+")))
        )
        while value <= stop_value:
            levels.append(value)
            if grow(value) <= value:
                raise ValueError
            value = grow(value)
    except ValueError:
        raise SweepError(
            f"levels: expected START:STOP:xFACTOR, START:STOP:+STEP or a list, got {text!r}"
        ) from None
    if not levels or min(levels) < 1:
        raise SweepError(f"levels: need at least one level of 1 or more, got {text!r}")
    return levels


@dataclass
class ServerSplit:
    """Average per-request server time (microseconds) and the average batch it ran in."""

    queue_us: float = 0.0
    compute_input_us: float = 0.0
    compute_infer_us: float = 0.0
    compute_output_us: float = 0.0
    avg_batch: float = 0.0

    @classmethod
    def between(cls, before: dict, after: dict) -> ServerSplit:
        def delta(stats: str, key: str) -> float:
            def read(source: dict) -> float:
                return float(source.get("inference_stats", {}).get(stats, {}).get(key, 0))

            return read(after) - read(before)

        def per_request_us(stats: str) -> float:
            count = delta(stats, "count")
            return delta(stats, "ns") / count / 1e3 if count else 0.0

        inferences = float(after.get("inference_count", 0)) - float(before.get("inference_count", 0))
        executions = float(after.get("execution_count", 0)) - float(before.get("execution_count", 0))
        return cls(
            queue_us=per_request_us("queue"),
            compute_input_us=per_request_us("compute_input"),
            compute_infer_us=per_request_us("compute_infer"),
            compute_output_us=per_request_us("compute_output"),
            avg_batch=inferences / executions if executions else 0.0,
        )


@dataclass
class LevelResult:
    mode: str  # "concurrency" or "rate"
    level: float
    throughput: float  # answered inferences (samples) per second
    p50_ms: float
    p90_ms: float
    p95_ms: float
    p99_ms: float
    requests: int
    errors: int
    windows: int
    stable: bool
    queue_us: float
    compute_input_us: float
    compute_infer_us: float
    compute_output_us: float
    avg_batch: float
    first_error: str = ""
    # Models with sequence inputs (else 0, or NaN where not measured):
    tokens_per_s: float = 0.0
    p99_short_ms: float = float("nan")  # requests at or below the median length sent
    p99_long_ms: float = float("nan")  # requests at or above the 90th percentile length sent
    padding: float = float("nan")  # padded / (real + padded) positions, from the server's /metrics


@dataclass
class SweepSettings:
    model: str
    protocol: str = "grpc"
    url: str | None = None
    batch: int = 1
    concurrency: tuple[int, ...] = (1, 2, 4, 8)
    request_rates: tuple[float, ...] = ()  # open-loop mode when given
    window_s: float = 5.0
    warmup_s: float = 2.0
    max_windows: int = 5
    stability: float = 0.10
    shared_memory: bool = False
    input_file: str | None = None
    seed: int = 0
    lengths: str | None = None  # a length mix (LengthMix) to send; None: the config's LENGTH_MIX
    # Every request padded to the longest of the mix (masks 0), as clients pad where the server cannot
    # batch requests of different lengths together; tokens/s still counts the real lengths.
    pad_to_longest: bool = False
    metrics_url: str | None = None  # for the padding; None: port 8002 of the first address's host


REQUESTS_PER_WORKER = 64  # prepared requests each worker takes in turn (lengths drawn from the mix)


def metrics_address(settings: SweepSettings, url: str | None) -> str:
    """Where the server's /metrics is: as given, else Triton's default port on the server's host."""
    if settings.metrics_url:
        return settings.metrics_url
    host = (url or "127.0.0.1:8001").rpartition("://")[2].rsplit(":", 1)[0]
    return f"http://{host}:8002/metrics"


def token_counts(url: str, model: str) -> tuple[float, float] | None:
    """(real, padded) positions the model's instances counted, or None where /metrics says nothing."""
    try:
        samples = scrape(url, timeout_s=2.0)
    except OSError:
        return None
    counted = [
        sum(s.value for s in samples if s.name == name and s.labels.get("model") == model)
        for name in ("tidepool_tokens_total", "tidepool_padded_tokens_total")
    ]
    return (counted[0], counted[1]) if counted[0] else None


def rotated(items: Sequence[T], turn: int) -> list[T]:
    """`items` starting at `turn` (mod their count): the order in which several models are measured
    at the `turn`-th level, so that none is always measured first after the load changes (the first
    served less: a candidate measured first served a convnet level at under half its usual rate)."""
    start = turn % len(items) if items else 0
    return [*items[start:], *items[:start]]


def _summed(stats: list[dict]) -> dict:
    """Triton's statistics of one model from several servers, counts and times added up."""
    if len(stats) == 1:
        return stats[0]
    summed: dict = {}
    for key, value in stats[0].items():
        if isinstance(value, dict):
            summed[key] = _summed([other.get(key, {}) for other in stats])
        elif key in ("count", "ns", "inference_count", "execution_count"):
            summed[key] = sum(float(other.get(key, 0)) for other in stats)
    return summed


def _window_figures(outcome: Outcome, seconds: float, batch: int) -> tuple[float, float]:
    throughput = len(outcome.latencies_ms) * batch / seconds if seconds else 0.0
    p99 = float(np.percentile(outcome.latencies_ms, 99)) if outcome.latencies_ms else float("inf")
    return throughput, p99


def _agree(a: float, b: float, tolerance: float) -> bool:
    return abs(a - b) <= tolerance * max(a, b) if np.isfinite(a) and np.isfinite(b) else False


class Sweep:
    def __init__(self, settings: SweepSettings, progress=None) -> None:
        self.settings = settings
        self.progress = progress or (lambda text: None)
        self.urls = addresses(settings.url)
        if settings.shared_memory and len(self.urls) > 1:
            raise SweepError("--shared-memory needs one server on this machine, not several addresses")
        # One per address, for the servers' statistics; the first also says what the model takes.
        self.connections = [Connection.open(settings.protocol, url) for url in self.urls]
        self.connection = self.connections[0]
        self.spec = self.connection.model_spec(settings.model)
        self.sequences = Sequences.of(self.spec)
        if settings.input_file:
            self.requests = load_requests(settings.input_file, self.spec)
        else:
            mix = LengthMix.parse(settings.lengths, "--lengths") if settings.lengths else None
            self.requests = traffic(self.spec, REQUESTS_PER_WORKER, settings.batch, settings.seed, mix)
        if settings.shared_memory and len(self.requests) > 1:
            raise SweepError("--shared-memory sends one request again and again, not a mix of lengths")
        self.rows = next(iter(self.requests[0].values())).shape[0] if self.spec.batched else 1
        sequences = self.sequences
        self.lengths = [sequences.length(r, self.spec.batched) for r in self.requests] if sequences else [0]
        if settings.pad_to_longest and sequences:
            longest = max(self.lengths)
            self.requests = [padded_to(r, self.spec, sequences, longest) for r in self.requests]
        self.short_up_to, self.long_from = np.percentile(self.lengths, 50), np.percentile(self.lengths, 90)
        self.metrics_url = metrics_address(settings, self.urls[0])

    def run(self) -> list[LevelResult]:
        s = self.settings
        plan = [("rate", r) for r in s.request_rates] or [("concurrency", c) for c in s.concurrency]
        results = []
        try:
            for index, (mode, level) in enumerate(plan):
                self.progress(f"[{index + 1}/{len(plan)}] {mode} {level:g}: warming up")
                result = asyncio.run(self._level(mode, level, f"[{index + 1}/{len(plan)}]"))
                if result.errors and not result.requests:
                    raise SweepError(self._all_failed(mode, level, result.errors, result.first_error))
                results.append(result)
        finally:
            for connection in self.connections:
                connection.close()
        return results

    def _all_failed(self, mode: str, level: float, errors: int, first: str) -> str:
        """Why a sweep whose requests all failed stops: the first error, and what was sent."""
        sent = (
            f"the inputs of {self.settings.input_file}"
            if self.settings.input_file
            else describe_generated(self.spec)
        )
        return f"every request failed at {mode} {level:g} ({errors} of them), e.g. {first!r}; {sent}"

    def _stats(self) -> dict:
        """The model's statistics summed over every address: the split is of all the requests sent."""
        return _summed([c.statistics(self.settings.model)["model_stats"][0] for c in self.connections])

    async def _level(self, mode: str, level: float, tag: str) -> LevelResult:
        s = self.settings
        workers_needed = int(level) if mode == "concurrency" else min(256, max(4, int(level)))
        sync = self.connection.client if s.shared_memory else None
        workers = [  # spread over the addresses in turn
            Worker(
                s.protocol,
                self.urls[n % len(self.urls)],
                s.model,
                self.spec,
                rotated(self.requests, n * 7),  # each worker from its own place in the mix
                s.shared_memory,
                sync,
                rotated(self.lengths, n * 7) if self.sequences else None,
            )
            for n in range(workers_needed)
        ]
        try:
            warmup, _ = await self._window(mode, level, workers, s.warmup_s)
            if warmup.errors and not warmup.latencies_ms:  # nothing answered: no window will be either
                raise SweepError(self._all_failed(mode, level, len(warmup.errors), warmup.errors[0]))
            before = self._stats()
            tokens_before = token_counts(self.metrics_url, s.model) if self.sequences else None
            windows: list[tuple[Outcome, float]] = []
            while len(windows) < s.max_windows:
                outcome, seconds = await self._window(mode, level, workers, s.window_s)
                windows.append((outcome, seconds))
                throughput, p99 = _window_figures(outcome, seconds, self.rows)
                self.progress(
                    f"{tag} {mode} {level:g}: window {len(windows)}: "
                    f"{throughput:.1f} infer/s, p99 {p99:.1f} ms"
                )
                if len(windows) >= 2 and self._stable(windows[-2:]):
                    break
            after = self._stats()
            tokens_after = token_counts(self.metrics_url, s.model) if tokens_before else None
        finally:
            for worker in workers:
                await worker.close()
        stable = len(windows) >= 2 and self._stable(windows[-2:])
        kept = windows[-2:]
        merged = Outcome()
        for outcome, _ in kept:
            merged.add(outcome)
        seconds = sum(t for _, t in kept)
        latencies = merged.latencies_ms or [float("nan")]
        split = ServerSplit.between(before, after)
        return LevelResult(
            mode=mode,
            level=level,
            throughput=len(merged.latencies_ms) * self.rows / seconds,
            p50_ms=float(np.percentile(latencies, 50)),
            p90_ms=float(np.percentile(latencies, 90)),
            p95_ms=float(np.percentile(latencies, 95)),
            p99_ms=float(np.percentile(latencies, 99)),
            requests=len(merged.latencies_ms),
            errors=len(merged.errors),
            windows=len(windows),
            stable=stable,
            first_error=merged.errors[0] if merged.errors else "",
            **asdict(split),
            **self._length_figures(merged, seconds, tokens_before, tokens_after),
        )

    def _length_figures(
        self,
        outcome: Outcome,
        seconds: float,
        before: tuple[float, float] | None,
        after: tuple[float, float] | None,
    ) -> dict[str, float]:
        """tokens/s, the p99 of short and long requests and the server's padding fraction."""
        if self.sequences is None:
            return {}
        lengths = np.array(outcome.lengths)
        latencies = np.array(outcome.latencies_ms)

        def p99(chosen: np.ndarray) -> float:
            return float(np.percentile(latencies[chosen], 99)) if chosen.any() else float("nan")

        padding = float("nan")
        if before and after and after[0] > before[0]:
            real, padded = after[0] - before[0], after[1] - before[1]
            padding = padded / (real + padded)
        return {
            "tokens_per_s": float(lengths.sum()) * self.rows / seconds if seconds else 0.0,
            "p99_short_ms": p99(lengths <= self.short_up_to),
            "p99_long_ms": p99(lengths >= self.long_from),
            "padding": padding,
        }

    def _stable(self, pair) -> bool:
        (a, ta), (b, tb) = pair
        throughput_a, p99_a = _window_figures(a, ta, self.rows)
        throughput_b, p99_b = _window_figures(b, tb, self.rows)
        tolerance = self.settings.stability
        return _agree(throughput_a, throughput_b, tolerance) and _agree(p99_a, p99_b, tolerance)

    async def _window(
        self, mode: str, level: float, workers: list[Worker], seconds: float
    ) -> tuple[Outcome, float]:
        outcome = Outcome()
        began = time.perf_counter()
        deadline = began + seconds
        if mode == "concurrency":

            async def loop(worker: Worker) -> None:
                while time.perf_counter() < deadline:
                    await worker.send(outcome)

            await asyncio.gather(*(loop(w) for w in workers))
        else:
            await open_loop(level, workers, deadline, outcome)
        return outcome, time.perf_counter() - began


async def open_loop(rate: float, workers: list[Worker], deadline: float, outcome: Outcome) -> None:
    """Requests at a constant rate, whether or not earlier ones were answered; a request that
    finds every worker busy is counted as an error (the generator would have to queue it)."""
    idle: asyncio.Queue[Worker] = asyncio.Queue()
    for worker in workers:
        idle.put_nowait(worker)
    pending: set[asyncio.Task] = set()

    async def fire(worker: Worker) -> None:
        try:
            await worker.send(outcome)
        finally:
            idle.put_nowait(worker)

    interval = 1.0 / rate
    next_send = time.perf_counter()
    while next_send < deadline:
        delay = next_send - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        if idle.empty():
            outcome.errors.append("generator: every worker busy; the server is not keeping up")
        else:
            task = asyncio.ensure_future(fire(idle.get_nowait()))
            pending.add(task)
            task.add_done_callback(pending.discard)
        next_send += interval
    if pending:
        await asyncio.gather(*pending)
