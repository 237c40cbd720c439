"""The instance's device link (tidepool.runtime.device) over the simulated device: device tensors
are CPU tensors over its memory; copies and the forward pass are queued on one stream, the pass
behind the input copies, as torch queues its kernels."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from tests.sim_cuda import SimDevice


class SimulatedLink:
    """The instance's device seam over a SimDevice: device tensors are CPU tensors over the
    simulated device's memory; copies and the forward pass are queued on one stream."""

    def __init__(self, device: SimDevice, stream: int | None = None) -> None:
        """On `stream` (0: the legacy default stream, which torch hands a GPU instance unless
        per-thread default streams are on), else on a stream of its own."""
        self.sim = device
        device.cuCtxSetCurrent(("context", 0))  # as torch's runtime makes its context current
        self.stream = device.new_stream() if stream is None else stream
        self._addresses: dict[int, int] = {}  # a device tensor's host alias -> its device address

    def _tensor(self, ptr: int, dtype: torch.dtype, shape: tuple[int, ...]) -> torch.Tensor:
        nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
        raw = torch.from_numpy(self.sim.device_array(ptr, nbytes))
        tensor = raw.view(dtype).view(shape)
        self._addresses[tensor.data_ptr()] = ptr
        return tensor

    def place(self, module: torch.nn.Module) -> torch.nn.Module:
        return module

    def to_device(self, host: torch.Tensor, block: Any | None) -> torch.Tensor:
        host = host.contiguous()
        nbytes = host.numel() * host.element_size()
        ptr = block.ptr if block is not None else self.sim.device_scratch(nbytes)
        tensor = self._tensor(ptr, host.dtype, tuple(host.shape))
        self.sim.cuMemcpyHtoDAsync(ptr, host.data_ptr(), nbytes, self.stream)
        return tensor

    def run(self, compute: Callable[[], dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
        """The forward pass as a device runs it: queued behind the copies, its outputs in device
        memory that holds them once the stream gets there. (The shapes come from running it now on
        whatever the inputs hold; only the queued run's values count.)"""
        shapes = {name: (t.dtype, tuple(t.shape)) for name, t in compute().items()}
        outputs = {
            name: self._tensor(self.sim.device_scratch(int(np.prod(shape)) * dtype.itemsize), dtype, shape)
            for name, (dtype, shape) in shapes.items()
        }

        def kernel() -> None:
            for name, value in compute().items():
                outputs[name].copy_(value)

        self.sim.launch(self.stream, kernel)
        return outputs

    def to_host(self, device: torch.Tensor, host: np.ndarray) -> None:
        ptr = self._addresses[device.data_ptr()]
        self.sim.cuMemcpyDtoHAsync(host.ctypes.data, ptr, host.nbytes, self.stream)

    def synchronize(self) -> None:
        self.sim.cuStreamSynchronize(self.stream)

    def empty_cache(self) -> None:
        self.sim.torch_cached = 0  # what the simulated torch cached goes back to the device

    def memory_held(self) -> tuple[int, int]:
        return self.sim.torch_cached, 0

    def describe(self) -> str:
        return "simulated device"
