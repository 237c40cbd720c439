"""One model instance, free of Triton: validates the requests of an execution, gathers the valid
ones into buffers from the instance's memory pool, runs one forward pass (on a GPU through its
device link, runtime/device.py), and returns per request its outputs or its error. The pool lives
as long as the instance; its housekeeping runs between executions, in the background."""

from __future__ import annotations

import math
import threading
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import torch

from tidepool.inputs import random_inputs
from tidepool.machine import usable_cores
from tidepool.pool import Block, ExecutionScope, MemoryPool, OutOfMemory, housekeeping, torch_dtype
from tidepool.pool.host_heap import minor_page_faults
from tidepool.pool.ledger import NodeLedger
from tidepool.runtime.batching import Allocate, gather, numpy_allocate, split
from tidepool.runtime.cores import CoreShare
from tidepool.runtime.device import DeviceLink, DeviceOutputs, TorchLink
from tidepool.runtime.graph import freeze
from tidepool.runtime.lengths import pass_length, probe
from tidepool.runtime.loader import apply_precision, load_model
from tidepool.runtime.log_line import log_line
from tidepool.runtime.outputs import check_shape, name_outputs
from tidepool.runtime.pools import create_pools, make_room, memory_held, refusal
from tidepool.runtime.process import (
    ProcessRequest,
    ProcessState,
    attention_fast_path_off,
    configure_process,
    process_state,
    set_torch_threads,
)
from tidepool.runtime.settings import InstanceSettings, Placement
from tidepool.runtime.validation import RequestError, public_message, sequence_length, validate_request
from tidepool.runtime.warmup import warm_up
from tidepool.sequences import Sequences, model_at_length
from tidepool.spec import Array, DType, ModelSpec, parse_model_config

Outputs = dict[str, Any]  # numpy arrays on the host, torch tensors on a GPU
Result = Outputs | RequestError
Requests = Sequence[dict[str, Array]]
Answer = Callable[[int, Result], None]  # called once per request, as soon as its result is final


@dataclass
class Execution:
    """What one `execute` did: a result per request (its outputs or its own error), the rows of
    each forward pass, and the minor page faults it took. Outputs on the host are views of pool
    blocks that stay reserved until `release()`, the next `execute` of the instance, or the end of
    a `with` block: copy what must live longer."""

    results: list[Result]
    batches: list[int] = field(default_factory=list)
    page_faults: int = 0
    torch_threads: int = 0  # what elastic threads gave its forward passes (0: not elastic)
    scopes: list[ExecutionScope] = field(default_factory=list)
    tokens: int = 0  # the sequence positions its requests sent (models with sequence inputs)
    padded_tokens: int = 0  # positions its passes added to run requests of different lengths together
    failures: list[str] = field(default_factory=list)  # tracebacks of the model's own failures, for the log

    def release(self) -> None:
        for scope in self.scopes:
            scope.release()

    def __enter__(self) -> Execution:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.release()


class ModelInstance:
    def __init__(
        self,
        model: ModelSpec,
        module: torch.nn.Module,
        settings: InstanceSettings,
        placement: Placement | None = None,
        link: DeviceLink | None = None,
    ):
        self.model = model
        self.settings = settings
        self.sequences = Sequences.of(model)
        self.device = torch.device(settings.device)
        # A GPU instance moves rows and runs its passes through its link (tests pass a simulated one).
        if settings.on_gpu and link is None:
            link = TorchLink(self.device)
        self.link = link if settings.on_gpu else None
        _, self.process_notes = configure_process(
            ProcessRequest(
                torch_threads=settings.torch_threads,
                retain_heap=settings.why_heap_not_kept() is None,
            )
        )
        # Elastic threads: a forward pass takes the cores that no other busy instance uses.
        self.core_share = (
            CoreShare.join(usable_cores(), settings.torch_threads, settings.elastic_hold_us)
            if settings.elastic_threads
            else None
        )
        self.placement = placement or Placement()
        self.budget_notes: list[str] = []  # the node budget, where this instance's pool chose it
        self.pool: MemoryPool | None = None
        self.staging: MemoryPool | None = None  # where batches are gathered (pinned on a GPU)
        self.pools: list[MemoryPool] = []  # each pool once, for scopes and closing
        # One execution at a time, or the housekeeping's release of the last one (`housekeep`).
        self._lock = threading.Lock()
        if settings.pool_enabled:
            self.pool, self.staging, self.budget_notes = create_pools(settings, self.placement)
            self.pools = [self.pool] if self.staging is self.pool else [self.pool, self.staging]
            if self.link is not None and self.pool.kind == "cuda":  # one device, two caches
                self.pool.reclaim = self.link.empty_cache
            housekeeping.watch(self.housekeep)
        self.compute_dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(settings.precision)
        self.output_dtypes = {spec.name: torch_dtype(spec.dtype) for spec in model.outputs}
        module = apply_precision(module, settings.precision)
        self.module = self.link.place(module) if self.link is not None else module
        self.graph_notes: list[str] = []
        if settings.graph == "frozen":
            self.module = self._frozen(self.module)
        # How requests of different lengths share passes (Triton sends them only to a ragged model).
        self.lengths = probe(self.forward, model, self.sequences) if self.sequences else None
        self.warmup_rounds: dict[int, int] = {}  # batch size -> dummy executions warm-up ran (warmup.py)
        self.warmup_notes: list[str] = []
        self._held: Execution | None = None  # the last execution, whose blocks its outputs use

    def _frozen(self, module: torch.nn.Module) -> torch.nn.Module:
        """The module traced at batch 2 (1 where that is all it takes) and frozen, checked at batch 1 and
        at the largest warm-up size; the eager module is dropped, so its weights are held once."""
        trace_batch = min(2, max(self.model.max_batch_size, 1))
        largest = max(self.settings.warmup_batch_sizes, default=1)
        checks = [random_inputs(self.model, batch, seed=2)
                  for batch in sorted({1, largest} - {trace_batch}) or [trace_batch]]  # fmt: skip
        if self.sequences is not None:  # and at another length, which a trace may have fixed
            other = model_at_length(self.model, self.sequences, self.sequences.two_lengths()[1])
            checks.append(random_inputs(other, trace_batch, seed=2))
        with attention_fast_path_off(self.settings.attention_fast_path_off):  # trace what forward runs
            frozen, self.graph_notes = freeze(
                module,
                self._arguments(random_inputs(self.model, trace_batch, seed=1)),
                [self._arguments(inputs) for inputs in checks],
            )
        return frozen

    @classmethod
    def load(
        cls,
        model_config: dict[str, Any] | str,
        model_dir: Path | str,
        placement: Placement | None = None,
        cuda_available: Callable[[], bool] | None = None,
        link: DeviceLink | None = None,
    ) -> ModelInstance:
        model = parse_model_config(model_config)
        settings = InstanceSettings.from_spec(model, placement or Placement(), cuda_available)
        instance = cls(model, load_model(model_dir, model), settings, placement, link)
        instance.warm_up()
        return instance

    @property
    def ledgers(self) -> list[NodeLedger]:
        """The node ledgers this instance's pools reserve from (none outside a server)."""
        return [pool.budget.ledger for pool in self.pools if pool.budget is not None]

    @property
    def process(self) -> ProcessState:
        """The process's settings as they are now: another instance may have changed them."""
        return process_state()

    def describe(self) -> str:
        """One line for the log (runtime/log_line.py)."""
        return log_line(self)

    def warm_up(self) -> None:
        """runtime/warmup.py: the pool reserves what traffic needs before the first request."""
        done = warm_up(self)
        self.warmup_rounds, self.warmup_notes = done.rounds, done.notes

    def release(self) -> None:
        """Give back the blocks of the last execution (its outputs become invalid)."""
        if self._held is not None:
            self._held.release()
            self._held = None

    def housekeep(self) -> None:
        """From the background thread, kicked as an execution ends (and every few tens of ms): each
        pool's deferred maintenance, and answers to other pools' trim requests. Where one is asked
        and this instance is idle, its last execution's blocks go back first (views the stub may
        still read keep theirs). Nothing here runs while an execution waits for the instance."""
        wanted = any(pool.budget is not None and pool.budget.trim_wanted() for pool in self.pools)
        if wanted and self._lock.acquire(blocking=False):
            try:
                self.release()
            finally:
                self._lock.release()
        for pool in self.pools:
            pool.housekeep()

    def close(self) -> None:
        housekeeping.unwatch(self.housekeep)
        self.release()
        if self.core_share is not None:
            self.core_share.leave()
        for pool in self.pools:
            pool.close()
            if pool.budget is not None:
                pool.budget.ledger.close()

    # -- execution ---------------------------------------------------------------------------

    def execute(self, requests: Requests, answer: Answer | None = None) -> Execution:
        """Answer every request, in order: its outputs, or the RequestError that it alone gets.
        The previous execution's blocks go back first: one execution at a time per instance. With
        `answer`, each request's result is also handed to it as soon as it is final: a bad request
        before any pass, each pass's requests as that pass ends (requests of different lengths)."""
        with self._lock:
            return self._execute_locked(requests, answer)

    def _execute_locked(self, requests: Requests, answer: Answer | None) -> Execution:
        self.release()
        faults_before = minor_page_faults()
        scopes = [pool.begin_execution() for pool in self.pools]
        execution = Execution(results=[], scopes=scopes)
        if self.core_share is not None:
            execution.torch_threads = self.core_share.start()
            set_torch_threads(execution.torch_threads)
        try:
            execution.results = self._execute(requests, execution, answer)
        except BaseException:
            execution.release()
            raise
        finally:
            if self.core_share is not None:
                self.core_share.stop()
            for scope in scopes:
                scope.stop_collecting()
        execution.page_faults = minor_page_faults() - faults_before
        for pool in self.pools:
            if pool.budget is not None:
                pool.budget.set_in_use(pool.allocated_bytes)
        if any(pool.housekeeping_due for pool in self.pools):
            housekeeping.kick()  # it runs as this execution's responses go out
        self._held = execution
        return execution

    def _execute(self, requests: Requests, execution: Execution, answer: Answer | None) -> list[Result]:
        results: list[Result | None] = [None] * len(requests)

        def settle(index: int, result: Result) -> None:
            results[index] = result
            if answer is not None:
                answer(index, result)

        valid: list[int] = []
        batch_sizes: list[int] = []
        lengths: list[int] = []
        for index, inputs in enumerate(requests):
            try:
                rows = validate_request(inputs, self.model, self.settings.allow_nonfinite)
                if self.sequences is not None:
                    lengths.append(sequence_length(inputs, self.model, self.sequences))
                batch_sizes.append(rows)
                valid.append(index)
            except RequestError as error:
                # Kept without its traceback: that holds this frame, whose `results` holds the
                # error, a cycle that would keep the batch's pool blocks until garbage collection.
                settle(index, error.with_traceback(None))
        if self.lengths is not None and self.model.batched and valid:
            by_length = [requests[i] for i in valid]
            self._run_by_length(
                by_length, batch_sizes, lengths, execution, lambda at, out: settle(valid[at], out)
            )
        elif valid:
            outcomes = (
                self._run_batch([requests[i] for i in valid], batch_sizes, execution)
                if self.model.batched
                else [self._run_batch([requests[i]], [1], execution)[0] for i in valid]
            )
            for index, outcome in zip(valid, outcomes, strict=True):
                settle(index, outcome)
        assert all(result is not None for result in results)
        return cast(list[Result], results)

    def _run_by_length(self, requests: Requests, batch_sizes: list[int], lengths: list[int],
                       execution: Execution, settle: Answer) -> None:  # fmt: skip
        """The passes that serve requests of these lengths (runtime/lengths.py), each run in turn,
        each request settled (by its position here) as its pass ends."""
        assert self.lengths is not None
        for planned in self.lengths.passes(requests, batch_sizes, lengths):
            members = planned.members
            ran = self._run_batch(
                [requests[m] for m in members], [batch_sizes[m] for m in members], execution,
                [lengths[m] for m in members],
            )  # fmt: skip
            for member, outcome in zip(members, ran, strict=True):
                settle(member, outcome)

    def _run_batch(
        self,
        requests: Requests,
        batch_sizes: list[int],
        execution: Execution,
        lengths: list[int] | None = None,
    ) -> list[Result]:
        """One forward pass for these requests. A batch that runs out of memory (the pool's limit
        or the device's) is retried as two halves, on a GPU after the pool gave torch back what it
        caches (runtime/pools.make_room); only a request that cannot fit alone fails."""
        marks = [scope.mark() for scope in execution.scopes]
        try:
            return self._forward_split(requests, batch_sizes, execution, lengths)
        except (OutOfMemory, torch.OutOfMemoryError) as error:
            # Kept without its traceback, whose frames hold views of the batch's blocks: those
            # blocks must come back (below, once this clause has let the frames go) before the
            # halves are tried.
            out_of_memory = error.with_traceback(None)
        except RequestError as error:
            return [error.with_traceback(None)] * len(requests)  # see _execute
        except Exception as exc:  # the model's own failure must not take the instance down
            # The client learns what failed, the server's log where (never a path to a client).
            execution.failures.append("".join(traceback.format_exception(exc)))
            failure = RequestError(f"the model failed: {public_message(exc)}", code="INTERNAL")
            return [failure] * len(requests)
        for scope, mark in zip(execution.scopes, marks, strict=True):
            scope.release_from(mark)
        if isinstance(out_of_memory, torch.OutOfMemoryError):
            make_room(self.pool)
        if len(requests) > 1:
            half = len(requests) // 2
            halves = (slice(0, half), slice(half, None))
            return [
                result
                for part in halves
                for result in self._run_batch(
                    requests[part], batch_sizes[part], execution, lengths[part] if lengths else None
                )
            ]
        return [refusal(out_of_memory, batch_sizes[0], memory_held(self.pool, self.link))]

    def _forward_split(
        self, requests: Requests, batch_sizes: list[int], execution: Execution, lengths: list[int] | None
    ) -> list[Result]:
        allocate = self._pool_allocate if self.pools else numpy_allocate
        if not self.model.batched:
            outputs = self.forward(requests[0], None, allocate)
            execution.batches.append(1)
            return [outputs]
        rows = sum(batch_sizes)
        length = pass_length(lengths, self.sequences) if lengths and self.sequences else 0
        if len(requests) == 1 and self.link is None:
            batch = requests[0]  # one request is already a batch: no copy at all
        elif lengths and self.lengths is not None and min(lengths) < length:
            batch = self.lengths.gather(requests, batch_sizes, lengths, length, self.model, allocate)
        else:
            batch = gather(requests, batch_sizes, self.model, allocate)
        outputs = self.forward(batch, rows, allocate)
        execution.batches.append(rows)
        if not lengths or self.lengths is None:
            return list(split(outputs, batch_sizes))
        real = sum(r * n for r, n in zip(batch_sizes, lengths, strict=True))
        execution.tokens += real
        execution.padded_tokens += rows * length - real
        return list(self.lengths.cut(outputs, batch_sizes, lengths, allocate))

    def _pool_allocate(self, shape: tuple[int, ...], dtype: DType) -> Array:
        """Host memory from the staging pool; on a GPU, pinned and tied to the link's stream, so
        that once freed it is written again only after the copies queued on it have run."""
        assert self.staging is not None
        stream = self.link.stream if self.link is not None else None
        block = self.staging.allocate(math.prod(shape) * dtype.itemsize, stream=stream)
        return block.as_numpy(dtype, shape)

    def forward(
        self, batch: dict[str, Array], rows: int | None, allocate: Allocate = numpy_allocate
    ) -> Outputs:
        """One forward pass on numpy inputs; outputs checked against the config. On the host the
        outputs are copied into buffers from `allocate` (the pool's, when it is on)."""
        if self.link is not None:
            return self._forward_on_device(self.link, batch, rows, allocate)
        produced = self._compute([torch.from_numpy(batch[spec.name]) for spec in self.model.inputs])
        outputs: Outputs = {}
        for spec in self.model.outputs:
            tensor = produced[spec.name]
            check_shape(spec, tuple(tensor.shape), rows)
            if allocate is numpy_allocate:
                outputs[spec.name] = tensor.contiguous().numpy()
            else:
                out = allocate(tuple(tensor.shape), spec.dtype)
                torch.from_numpy(out).copy_(tensor)
                outputs[spec.name] = out
        return outputs

    def _forward_on_device(
        self, link: DeviceLink, batch: dict[str, Array], rows: int | None, allocate: Allocate
    ) -> Outputs:
        """The inputs copied into device blocks of the instance's pool, the pass queued behind them,
        and (GPU_OUTPUTS=host) the outputs copied into pinned blocks that the host reads only once
        the stream has run: all on the link's stream, in that order."""
        inputs = [
            link.to_device(torch.from_numpy(batch[spec.name]), self._device_block(batch[spec.name], link))
            for spec in self.model.inputs
        ]
        produced = link.run(lambda: {name: t.contiguous() for name, t in self._compute(inputs).items()})
        for spec in self.model.outputs:
            check_shape(spec, tuple(produced[spec.name].shape), rows)
        if self.settings.gpu_outputs == "device":
            return dict(produced)  # sent with from_dlpack: the stub's stream waits for this one
        outputs: Outputs = {}
        for spec in self.model.outputs:
            out = allocate(tuple(produced[spec.name].shape), spec.dtype)
            link.to_host(produced[spec.name], out)
            outputs[spec.name] = out
        link.synchronize()  # the stub copies them into its shared memory as execute returns
        return outputs

    def _device_block(self, host: Array, link: DeviceLink) -> Block | None:
        """A block of the instance's CUDA pool for one input, on the link's stream (None: torch's)."""
        if self.pool is None or self.pool.kind != "cuda":
            return None
        return self.pool.allocate(host.nbytes, stream=link.stream)

    def _compute(self, tensors: list[torch.Tensor]) -> DeviceOutputs:
        """The module on its arguments in the compute precision; each output named, in its config dtype."""
        with torch.inference_mode(), attention_fast_path_off(self.settings.attention_fast_path_off):
            produced = name_outputs(self.module(*self._in_compute_dtype(tensors)), self.model.outputs)
            return {spec.name: produced[spec.name].to(self.output_dtypes[spec.name])
                    for spec in self.model.outputs}  # fmt: skip

    def _arguments(self, batch: dict[str, Array]) -> list[torch.Tensor]:
        """The module's arguments for tracing it: in config order, on the device, in the compute precision."""
        tensors = [torch.from_numpy(batch[spec.name]) for spec in self.model.inputs]
        if self.link is not None:
            tensors = [self.link.to_device(t, None) for t in tensors]
            self.link.synchronize()
        return self._in_compute_dtype(tensors)

    def _in_compute_dtype(self, tensors: list[torch.Tensor]) -> list[torch.Tensor]:
        if self.compute_dtype is None:
            return tensors
        return [t.to(self.compute_dtype) if t.is_floating_point() else t for t in tensors]
