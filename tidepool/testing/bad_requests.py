"""The bad requests the reliability tests send, each as a function that sends it over one
protocol and returns the server's error text (or raises AssertionError if it was served). Run as a
module, it prints every case's error from a server it starts, as the table in docs/operations.md:

    .venv/bin/python -m tidepool.testing.bad_requests
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass

import grpc
import numpy as np
from tritonclient.grpc import service_pb2, service_pb2_grpc
from tritonclient.utils import InferenceServerException

from tidepool.clients.connection import Connection
from tidepool.inputs import random_inputs

MODELS = {"encoder": ("INPUT_IDS", "INT32"), "convnet": ("IMAGE", "FP32")}


@dataclass(frozen=True)
class BadCase:
    name: str
    expect: tuple[str, ...]  # substrings the error must contain (any order)
    send: Callable[[Connection, str], str]


def _send(connection: Connection, model: str, tensors: dict[str, tuple[np.ndarray, str]]) -> str:
    """Send arrays with the wire types given (not the model's), return the error text."""
    module = connection.module
    inputs = []
    for name, (array, wire) in tensors.items():
        tensor = module.InferInput(name, list(array.shape), wire)
        tensor.set_data_from_numpy(array)
        inputs.append(tensor)
    try:
        connection.client.infer(model, inputs)
    except InferenceServerException as exc:
        return str(exc)
    raise AssertionError(f"{model} served a bad request: {list(tensors)}")


def _valid(connection: Connection, model: str, batch: int = 1) -> np.ndarray:
    return random_inputs(connection.model_spec(model), batch=batch)[MODELS[model][0]]


def wrong_dtype(connection, model):
    name, wire = MODELS[model]
    other = "FP32" if wire == "INT32" else "INT32"
    array = _valid(connection, model).astype(np.float32 if other == "FP32" else np.int32)
    return _send(connection, model, {name: (array, other)})


def wrong_shape(connection, model):
    name, wire = MODELS[model]
    return _send(connection, model, {name: (_valid(connection, model)[..., :5], wire)})


def sent_wrong_shape(connection, model) -> str:
    """The shape wrong_shape sends, as Triton writes shapes in its errors: [1,3,224,5]."""
    shape = _valid(connection, model)[..., :5].shape
    return "[" + ",".join(map(str, shape)) + "]"


def batch_too_large(connection, model):
    name, wire = MODELS[model]
    rows = connection.model_spec(model).max_batch_size + 1
    return _send(connection, model, {name: (_valid(connection, model, rows), wire)})


def missing_input(connection, model):
    return _send(connection, model, {})


def unknown_input(connection, model):
    name, wire = MODELS[model]
    return _send(
        connection,
        model,
        {name: (_valid(connection, model), wire), "EXTRA": (np.zeros((1, 1), np.int32), "INT32")},
    )


def out_of_range(connection, model):
    name, wire = MODELS[model]
    array = _valid(connection, model)
    array.flat[3] = 30522 if model == "encoder" else np.inf
    return _send(connection, model, {name: (array, wire)})


def nan_value(connection, model):
    name, wire = MODELS[model]
    array = _valid(connection, model)
    if model == "encoder":
        array.flat[0] = -1  # ids have no NaN: the nearest thing is a negative id
    else:
        array.flat[0] = np.nan
    return _send(connection, model, {name: (array, wire)})


def empty_batch(connection, model):
    name, wire = MODELS[model]
    return _send(connection, model, {name: (_valid(connection, model)[:0], wire)})


def far_too_large(connection, model):
    name, wire = MODELS[model]
    sample = _valid(connection, model)
    huge = np.zeros((1, 64 * 2**20 // sample.itemsize), dtype=sample.dtype)  # 64 MiB
    return _send(connection, model, {name: (huge, wire)})


def truncated_payload(connection, model):
    """The tensor's bytes end before its declared shape does."""
    name, wire = MODELS[model]
    array = _valid(connection, model)
    payload = array.tobytes()[: array.nbytes // 2]
    if connection.protocol == "http":
        header = json.dumps(
            {
                "inputs": [
                    {
                        "name": name,
                        "shape": list(array.shape),
                        "datatype": wire,
                        "parameters": {"binary_data_size": array.nbytes},
                    }
                ]
            }  # fmt: skip
        ).encode()
        return _raw_http(
            connection.url, model, header + payload, {"Inference-Header-Content-Length": str(len(header))}
        )
    request = service_pb2.ModelInferRequest(model_name=model)
    tensor = request.inputs.add(name=name, datatype=wire)
    tensor.shape.extend(array.shape)
    request.raw_input_contents.append(payload)
    with grpc.insecure_channel(connection.url) as channel:
        try:
            service_pb2_grpc.GRPCInferenceServiceStub(channel).ModelInfer(request)
        except grpc.RpcError as exc:
            return exc.details()
    raise AssertionError("a truncated payload was served")


def malformed_body(connection, model):
    """HTTP: a body that is not JSON. gRPC: bytes that are not a ModelInferRequest."""
    if connection.protocol == "http":
        return _raw_http(connection.url, model, b'{"inputs": [ {"name": "X", ', {})
    with grpc.insecure_channel(connection.url) as channel:
        call = channel.unary_unary("/inference.GRPCInferenceService/ModelInfer")
        try:
            call(b"\xff\xff\xff\xff not a protobuf")
        except grpc.RpcError as exc:
            return exc.details() or str(exc.code())
    raise AssertionError("a malformed body was served")


def _raw_http(url: str, model: str, body: bytes, headers: dict[str, str]) -> str:
    request = urllib.request.Request(f"http://{url}/v2/models/{model}/infer", data=body, method="POST")
    for key, value in headers.items():
        request.add_header(key, value)
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            raise AssertionError(f"served with status {response.status}: {response.read()[:200]!r}")
    except urllib.error.HTTPError as exc:
        return f"HTTP {exc.code}: {exc.read().decode(errors='replace')}"


CASES = [
    BadCase("wrong dtype", ("data-type", "{input}"), wrong_dtype),
    BadCase("wrong shape", ("shape", "{input}", "{sent_shape}"), wrong_shape),
    BadCase("batch above max_batch_size", ("batch",), batch_too_large),
    BadCase("missing input", ("{input}",), missing_input),
    BadCase("unknown input", ("EXTRA",), unknown_input),
    BadCase("out-of-range value", ("{input}",), out_of_range),
    BadCase("NaN / negative id", ("{input}",), nan_value),
    BadCase("empty batch", ("{input}",), empty_batch),
    BadCase("truncated binary payload", ("{input}",), truncated_payload),
    BadCase("malformed body", ("parse",), malformed_body),  # HTTP: failed to parse; gRPC: unable to
    BadCase("far larger than any input", ("{input}",), far_too_large),
]


def print_table() -> None:
    """Every case against both example models over HTTP and gRPC: the error seen, shortened."""
    import tempfile
    from pathlib import Path

    from tidepool.launcher.server import ServerConfig, TritonServer
    from tidepool.testing import linked_repository

    with tempfile.TemporaryDirectory() as tmp:
        config = ServerConfig.on_free_ports(linked_repository(Path(tmp)))
        with TritonServer(config) as server:
            print("| case | protocol | model | error seen |\n| --- | --- | --- | --- |")
            for case in CASES:
                for protocol, url in (("http", config.http_url), ("grpc", config.grpc_url)):
                    with Connection.open(protocol, url) as connection:
                        for model in sorted(MODELS):
                            error = " ".join(case.send(connection, model).split())[:150].replace("|", "/")
                            print(f"| {case.name} | {protocol} | {model} | {error} |")
            assert server.is_ready(), "the server stopped serving after the bad requests"


if __name__ == "__main__":
    print_table()
