"""What an instance runs at load, before its first request: dummy batches of each warm-up size, and
for a model that runs requests of different lengths together, a pass at every bucket length its
token budget allows and executions of mixed lengths. The pool then holds what traffic needs, so
that no execution after warm-up asks upstream for memory, and the first request is not the slow one."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from tidepool.pool.host_heap import release_free_pages
from tidepool.runtime.batching import dummy_inputs
from tidepool.runtime.loader import ModelLoadError
from tidepool.runtime.validation import RequestError
from tidepool.sequences import model_at_length
from tidepool.spec import Array

if TYPE_CHECKING:
    from tidepool.runtime.instance import ModelInstance

WARMUP_MAX_ROUNDS = 10  # per warm-up batch size, while executions still touch fresh pages
STEADY_PAGE_FAULTS = 64  # an execution below this many minor faults allocated nothing fresh
MOST_BUCKETS = 16  # bucket lengths warmed at most (spread over the range where there are more)
MIXED_ROUNDS = 8  # executions of mixed lengths (each size class of their blocks met at least once)


@dataclass
class WarmUp:
    rounds: dict[int, int] = field(default_factory=dict)  # batch size -> dummy executions run
    lengths: list[int] = field(default_factory=list)  # bucket lengths warmed
    notes: list[str] = field(default_factory=list)


def warm_up(instance: ModelInstance) -> WarmUp:
    """Each warm-up batch size, run again where the C heap keeps freed memory until its execution
    touches no fresh page (glibc 2.36 places a large aligned block anew a few times before it
    reuses one); then the lengths (`warm_lengths`)."""
    done = WarmUp()
    retained = instance.process.heap.applied
    for size in instance.settings.warmup_batch_sizes:
        inputs = dummy_inputs(instance.model, size)
        for round_number in range(1, (WARMUP_MAX_ROUNDS if retained else 1) + 1):
            faults = _run(instance, [inputs], f"batch size {size}", done)
            if faults is None:
                break
            done.rounds[size] = round_number
            if faults < STEADY_PAGE_FAULTS:
                break
    warm_lengths(instance, done)
    if retained and done.rounds:
        release_free_pages()  # abandoned places stay free chunks but leave the resident set
        instance.execute([dummy_inputs(instance.model, max(done.rounds))]).release()
    return done


def warm_lengths(instance: ModelInstance, done: WarmUp) -> None:
    """For a model that pads requests of different lengths into one pass: a pass at each bucket
    length up to the longest traffic has (rows up to the token budget) and one request alone at it,
    then executions of max_batch_size requests of lengths drawn from the mix (uniform without one)."""
    sequences, batcher, model = instance.sequences, instance.lengths, instance.model
    if sequences is None or batcher is None or not batcher.pad:
        return
    top = sequences.mix.longest if sequences.mix else sequences.max_length or sequences.planned_length()
    top = min(top, sequences.max_length or top)
    buckets = sequences.bucket_lengths(top)
    if len(buckets) > MOST_BUCKETS:
        buckets = [buckets[int(i)] for i in np.linspace(0, len(buckets) - 1, MOST_BUCKETS)]
    most = model.max_batch_size
    budget = sequences.max_batch_tokens
    for length in buckets:
        one = dummy_inputs(model_at_length(model, sequences, length), 1)
        rows = most if budget is None else max(1, min(most, budget // length))
        if _run(instance, [one] * rows, f"length {length}", done) is not None:
            done.lengths.append(length)
            _run(instance, [one], f"length {length}", done)  # alone: run in place, its outputs copied
    for seed in range(MIXED_ROUNDS):
        drawn = (
            sequences.mix.draw(most, seed)
            if sequences.mix
            else np.random.default_rng(seed).integers(1, top + 1, most)
        )
        mixed = [dummy_inputs(model_at_length(model, sequences, min(int(n), top)), 1) for n in drawn]
        _run(instance, mixed, "mixed lengths", done)


def _run(instance: ModelInstance, requests: list[dict[str, Array]], what: str, done: WarmUp) -> int | None:
    """One warm-up execution; its page faults, or None where the pool, the node budget or the
    device refused it (noted: a config edited to a larger max_batch_size still loads, and such
    batches are refused or run as halves)."""
    with instance.execute(requests) as execution:
        failed = next((r for r in execution.results if isinstance(r, RequestError)), None)
    if failed is None:
        return execution.page_faults
    if failed.code == "RESOURCE_EXHAUSTED":
        done.notes.append(f"warm-up skipped {what}: it does not fit POOL_LIMIT_BYTES")
        return None
    if failed.code == "UNAVAILABLE":  # the node budget or the device: memory that may come back
        done.notes.append(f"warm-up skipped {what}: {failed}")
        return None
    raise ModelLoadError(f"warm-up at {what} failed: {failed}")
