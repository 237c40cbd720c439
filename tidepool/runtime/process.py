"""Process-wide state, set in one place: torch's thread count, the C heap's retention of freed
memory, and the fused attention fast path (switched off around an int8 instance's forward passes
only); and torch's CUDA allocator as the process has it, which Tidepool leaves to torch (its
caching allocator holds weights and activations; the instance's pool holds its batches:
docs/pool.md). A Triton Python stub serves one instance per process; the
profiler and tests may hold several, so what is reported is always read back from the process,
never what one instance asked for."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import torch

from tidepool.pool.host_heap import HeapRetention, retain_freed_memory

# Where torch reads its CUDA allocator settings when it loads (newer releases read the first).
ALLOCATOR_VARIABLES = ("PYTORCH_ALLOC_CONF", "PYTORCH_CUDA_ALLOC_CONF")


@dataclass(frozen=True)
class ProcessRequest:
    """What one instance needs from the process."""

    torch_threads: int
    retain_heap: bool  # keep freed C-heap memory (a CPU instance with the pool on)


@dataclass(frozen=True)
class ProcessState:
    """The process's settings as they are now (read back, not remembered)."""

    torch_threads: int
    cuda_allocator: str  # torch's allocator backend, or what it will be once CUDA initialises
    heap: HeapRetention

    def describe(self) -> str:
        return (
            f"torch threads {self.torch_threads}; CUDA allocator {self.cuda_allocator}; "
            f"C heap: {self.heap.reason}"
        )


# Set only by configure_process: what retain_freed_memory answered, and whether any instance
# configured this process yet (so that changes made for a later one are said in the log).
_heap = HeapRetention(False, "freed memory not kept: no instance asked for it")
_configured = False


def configure_process(request: ProcessRequest) -> tuple[ProcessState, list[str]]:
    """Apply what the instance needs; return the process's state and notes on what it changed for
    instances that came before (or could not change). Served instances and the profiler both come
    through here, so a profile measures the process settings (the CUDA allocator too) that serve."""
    global _heap, _configured
    notes = []
    if torch.get_num_threads() != request.torch_threads:
        if _configured:
            notes.append(
                f"torch threads changed from {torch.get_num_threads()} to {request.torch_threads} "
                "for every instance of this process"
            )
        torch.set_num_threads(request.torch_threads)
    if request.retain_heap and not _heap.applied:
        _heap = retain_freed_memory()
        if not _heap.applied:
            notes.append(_heap.reason)
    _configured = True
    return process_state(), notes


def set_torch_threads(threads: int) -> None:
    """Elastic threads (runtime/cores.py) change the count before each forward pass; this is cheap
    (~0.2 us) and a no-op when the count is already right."""
    if torch.get_num_threads() != threads:
        torch.set_num_threads(threads)


@contextmanager
def attention_fast_path_off(off: bool) -> Iterator[None]:
    """Where `off`, torch's fused attention fast path is off for the block (an int8 instance's
    forward pass: quantized Linear has no float weights for the fused kernel) and back as it was
    after. Per pass, not per process: the profiler measures instances of several precisions in one
    process, and an int8 instance that turned it off for the process slowed every fp32 profile
    taken after it (the encoder's frozen trace recorded 264 nodes of separate linear and attention
    operators instead of 33 around one fused layer)."""
    if not off or not torch.backends.mha.get_fastpath_enabled():
        yield
        return
    torch.backends.mha.set_fastpath_enabled(False)
    try:
        yield
    finally:
        torch.backends.mha.set_fastpath_enabled(True)


def process_state() -> ProcessState:
    if torch.cuda.is_initialized():  # type: ignore[no-untyped-call]
        allocator = torch.cuda.get_allocator_backend()
    else:
        settings = [f"{name}={os.environ[name]}" for name in ALLOCATOR_VARIABLES if name in os.environ]
        allocator = "not initialised (" + (", ".join(settings) or "torch's native caching allocator") + ")"
    return ProcessState(
        torch_threads=torch.get_num_threads(),
        cuda_allocator=allocator,
        heap=_heap,
    )
