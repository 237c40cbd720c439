"""Asyncio request workers over tritonclient's aio HTTP and gRPC clients: each worker holds its
own connection and prepared requests (optionally one in system shared memory) and sends one at a
time, taking them in turn (text traffic: each of its own length). The sweep drives many of them
from one event loop."""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass, field

import numpy as np
import tritonclient.grpc.aio as grpc_aio
import tritonclient.http.aio as http_aio
from tritonclient.utils import InferenceServerException

from tidepool.clients.connection import DEFAULT_URLS, wire_inputs
from tidepool.sequences import Sequences
from tidepool.spec import ModelSpec


@dataclass
class Outcome:
    """What the workers saw in one window: latencies of answered requests (and beside each its
    sequence length, 0 for a model without one) and the errors."""

    latencies_ms: list[float] = field(default_factory=list)
    lengths: list[int] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)

    def add(self, other: Outcome) -> None:
        self.latencies_ms.extend(other.latencies_ms)
        self.lengths.extend(other.lengths)
        self.errors.extend(other.errors)


class SharedMemoryRegions:
    """System shared memory for one worker: a region holding its inputs and one for outputs,
    registered with the server; `close` unregisters and unlinks them."""

    def __init__(self, sync_client, spec: ModelSpec, inputs: dict[str, np.ndarray]) -> None:
        import tritonclient.utils.shared_memory as shm

        self._shm = shm
        self._client = sync_client
        tag = uuid.uuid4().hex[:12]
        self.input_name, self.output_name = f"tp_in_{tag}", f"tp_out_{tag}"
        self.input_offsets: dict[str, tuple[int, int]] = {}
        offset = 0
        for tensor in spec.inputs:
            nbytes = inputs[tensor.name].nbytes
            self.input_offsets[tensor.name] = (offset, nbytes)
            offset += nbytes
        input_size = offset
        self.input_handle = shm.create_shared_memory_region(
            self.input_name, f"/{self.input_name}", input_size
        )
        for tensor in spec.inputs:
            shm.set_shared_memory_region(
                self.input_handle, [inputs[tensor.name]], offset=self.input_offsets[tensor.name][0]
            )
        rows = next(iter(inputs.values())).shape[0] if spec.batched else 1
        self.output_offsets: dict[str, tuple[int, int]] = {}
        offset = 0
        for tensor in spec.outputs:
            shape = tensor.shape(rows if spec.batched else None)
            nbytes = int(np.prod(shape)) * tensor.dtype.itemsize
            self.output_offsets[tensor.name] = (offset, nbytes)
            offset += nbytes
        self.output_handle = shm.create_shared_memory_region(self.output_name, f"/{self.output_name}", offset)
        sync_client.register_system_shared_memory(self.input_name, f"/{self.input_name}", input_size)
        sync_client.register_system_shared_memory(self.output_name, f"/{self.output_name}", offset)

    def close(self) -> None:
        for name, handle in ((self.input_name, self.input_handle), (self.output_name, self.output_handle)):
            try:
                self._client.unregister_system_shared_memory(name)
            finally:
                self._shm.destroy_shared_memory_region(handle)


class Worker:
    """One client connection sending its prepared requests in turn, again and again (one of them
    where they live in shared memory)."""

    def __init__(
        self,
        protocol: str,
        url: str | None,
        model: str,
        spec: ModelSpec,
        requests: list[dict[str, np.ndarray]],
        shared_memory: bool = False,
        sync_client=None,
        lengths: list[int] | None = None,
    ) -> None:
        """`lengths`: the sequence length each request counts as (default: its own; a request a
        client padded counts its real length)."""
        self.protocol = protocol
        self.model = model
        url = url or DEFAULT_URLS[protocol]
        module = http_aio if protocol == "http" else grpc_aio
        self.client = module.InferenceServerClient(url)
        sequences = Sequences.of(spec)
        if lengths is None:
            lengths = [sequences.length(r, spec.batched) if sequences else 0 for r in requests]
        self.prepared = [
            (wire_inputs(module, spec, request), length)
            for request, length in list(zip(requests, lengths, strict=True))[: 1 if shared_memory else None]
        ]
        self.turn = 0
        self.regions = SharedMemoryRegions(sync_client, spec, requests[0]) if shared_memory else None
        if self.regions is not None:  # the data lives in the region: the request only points at it
            for wire, tensor in zip(self.prepared[0][0], spec.inputs, strict=True):
                offset, nbytes = self.regions.input_offsets[tensor.name]
                wire.set_shared_memory(self.regions.input_name, nbytes, offset=offset)
        self.outputs = []
        for tensor in spec.outputs:
            if self.regions is None:
                self.outputs.append(module.InferRequestedOutput(tensor.name))
            else:
                requested = module.InferRequestedOutput(tensor.name)
                offset, nbytes = self.regions.output_offsets[tensor.name]
                requested.set_shared_memory(self.regions.output_name, nbytes, offset=offset)
                self.outputs.append(requested)

    async def send(self, outcome: Outcome) -> None:
        inputs, length = self.prepared[self.turn % len(self.prepared)]
        self.turn += 1
        began = time.perf_counter()
        try:
            await self.client.infer(self.model, inputs, outputs=self.outputs)
        except InferenceServerException as exc:
            outcome.errors.append(str(exc))
            return
        outcome.latencies_ms.append((time.perf_counter() - began) * 1e3)
        outcome.lengths.append(length)

    async def close(self) -> None:
        await self.client.close()
        if self.regions is not None:
            self.regions.close()
