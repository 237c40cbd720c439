"""How a GPU instance moves rows to and from its device and runs a forward pass there: one small
object, so that the order of that work is the instance's to state and a simulated device can run
it in tests (tests/sim_cuda.py). On a real device everything is queued on torch's current stream."""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

import numpy as np
import numpy.typing as npt
import torch

from tidepool.pool import Block

DeviceOutputs = dict[str, torch.Tensor]


class DeviceLink(Protocol):
    @property
    def stream(self) -> int:
        """The raw stream handle that copies and the forward pass are queued on."""
        ...

    def place(self, module: torch.nn.Module) -> torch.nn.Module:
        """The module on the device."""
        ...

    def to_device(self, host: torch.Tensor, block: Block | None) -> torch.Tensor:
        """Queue a copy of `host` into `block` (device memory of the instance's pool; None: memory
        of torch's own) and return the device tensor. `host` must stay unwritten until the stream
        has run the copy."""
        ...

    def run(self, compute: Callable[[], DeviceOutputs]) -> DeviceOutputs:
        """The forward pass, queued behind the copies: its outputs' shapes are known at once, their
        values once the stream gets there."""
        ...

    def to_host(self, device: torch.Tensor, host: npt.NDArray[np.generic]) -> None:
        """Queue a copy of `device` into pinned host memory; read it only after `synchronize`."""
        ...

    def synchronize(self) -> None:
        """Block the host until the stream has run everything queued so far."""
        ...

    def empty_cache(self) -> None:
        """Hand what torch's caching allocator caches, unused, back to the driver."""
        ...

    def memory_held(self) -> tuple[int, int]:
        """(reserved, allocated) bytes of torch's caching allocator on the device."""
        ...

    def describe(self) -> str: ...


class TorchLink:
    """The device link on a real GPU: torch's copies and kernels on torch's current stream."""

    def __init__(self, device: torch.device) -> None:
        # The stub's main thread serves: CUDA's current device is per thread, and a stub on GPU N
        # must not create its context, streams or DLPack exports on GPU 0.
        torch.cuda.set_device(device)
        self.device = device

    @property
    def stream(self) -> int:
        return int(torch.cuda.current_stream(self.device).cuda_stream)

    def place(self, module: torch.nn.Module) -> torch.nn.Module:
        return module.to(self.device)

    def to_device(self, host: torch.Tensor, block: Block | None) -> torch.Tensor:
        if block is None:
            return host.to(self.device, non_blocking=True)
        device = block.as_torch(host.dtype, tuple(host.shape))
        device.copy_(host, non_blocking=True)
        return device

    def run(self, compute: Callable[[], DeviceOutputs]) -> DeviceOutputs:
        return compute()  # torch queues the kernels on the current stream and returns at once

    def to_host(self, device: torch.Tensor, host: npt.NDArray[np.generic]) -> None:
        torch.from_numpy(host).copy_(device, non_blocking=True)

    def synchronize(self) -> None:
        torch.cuda.current_stream(self.device).synchronize()

    def empty_cache(self) -> None:
        torch.cuda.empty_cache()

    def memory_held(self) -> tuple[int, int]:
        return torch.cuda.memory_reserved(self.device), torch.cuda.memory_allocated(self.device)

    def describe(self) -> str:
        return f"{torch.cuda.get_device_name(self.device)} (torch's current stream)"
