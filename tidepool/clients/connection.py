"""One small interface over tritonclient's HTTP and gRPC clients: read a model's config, send
numpy inputs, get numpy outputs. Errors come back as tritonclient's InferenceServerException."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import numpy as np
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tidepool.errors import TidepoolError
from tidepool.spec import ModelSpec, parse_model_config

DEFAULT_URLS = {"http": "127.0.0.1:8000", "grpc": "127.0.0.1:8001"}

# UNAVAILABLE as gRPC and HTTP say it: "try again". Nothing else from the backend is retried
# (INVALID_ARG, and a request too large for the pool, fail the same way every time).
TRANSIENT_STATUSES = ("StatusCode.UNAVAILABLE", "503")
# What Triton answers between unloading and loading a model (a restart or a reload).
RELOADING_MESSAGES = ("has no available versions", "is not ready")


def server_address(text: str, default_protocol: str = "http") -> tuple[str, str]:
    """'HOST:PORT', 'http://HOST:PORT' or 'grpc://HOST:PORT' -> (protocol, 'HOST:PORT'): the
    scheme, where given, says the protocol, and tritonclient is handed the address without it (it
    refuses a scheme). TidepoolError, in one line, for anything else."""
    scheme, separator, address = text.strip().rpartition("://")
    protocol = scheme.lower() if separator else default_protocol
    if protocol not in DEFAULT_URLS:
        raise TidepoolError(
            f"{text!r}: the scheme must be http:// or grpc:// (TLS is not supported here), or none: HOST:PORT"
        )
    address = address.rstrip("/")
    if not address or "/" in address:
        raise TidepoolError(f"{text!r}: expected HOST:PORT, e.g. {DEFAULT_URLS[protocol]}, with no path")
    return protocol, address


def addresses(urls: str | None) -> list[str | None]:
    """`--url A,B,...` -> the addresses a load tool spreads its connections over, in turn (several
    pods behind no request-level balancer); [None], the protocol's default address, when none."""
    if not urls:
        return [None]
    found = [url.strip() for url in urls.split(",") if url.strip()]
    if not found:
        raise TidepoolError(f"{urls!r}: expected HOST:PORT, or several separated by commas")
    return list(found)


def is_transient(error: Exception) -> bool:
    """Errors a retry can outlive: the server unreachable, unavailable, or reloading the model."""
    if not isinstance(error, InferenceServerException):
        return True  # connection refused or reset
    if str(error.status()) in TRANSIENT_STATUSES:
        return True
    text = str(error.message()).lower()
    return any(message in text for message in RELOADING_MESSAGES)


def wire_inputs(module: Any, spec: ModelSpec, inputs: dict[str, np.ndarray]) -> list[Any]:
    """tritonclient InferInput objects (of `module`'s protocol) holding `inputs`, in config order."""
    wired = []
    for tensor in spec.inputs:
        array = inputs[tensor.name]
        wire = module.InferInput(tensor.name, list(array.shape), tensor.wire_type)
        wire.set_data_from_numpy(array)
        wired.append(wire)
    return wired


@dataclass
class Connection:
    """A client for one server over one protocol."""

    protocol: str
    url: str
    client: Any

    @classmethod
    def open(cls, protocol: str = "http", url: str | None = None, concurrency: int = 1) -> Connection:
        if protocol not in DEFAULT_URLS:
            raise TidepoolError(f"protocol must be http or grpc, got {protocol!r}")
        if url and "://" in url:
            given, url = server_address(url, protocol)
            if given != protocol:
                raise TidepoolError(f"the address says {given}:// but the protocol is {protocol}")
        url = url or DEFAULT_URLS[protocol]
        if protocol == "http":
            client = httpclient.InferenceServerClient(url, concurrency=concurrency)
        else:
            client = grpcclient.InferenceServerClient(url)
        return cls(protocol, url, client)

    @property
    def module(self) -> Any:
        return httpclient if self.protocol == "http" else grpcclient

    def model_spec(self, model: str) -> ModelSpec:
        if self.protocol == "http":
            config = self.client.get_model_config(model)
        else:
            config = self.client.get_model_config(model, as_json=True)["config"]
        return parse_model_config(config)

    def infer_with_retries(
        self,
        model: str,
        inputs: dict[str, np.ndarray],
        spec: ModelSpec,
        retries: int = 0,
        backoff_s: float = 0.1,
    ) -> dict[str, np.ndarray]:
        """`infer`, retried with exponential backoff (capped at 2 s) while the server is
        unreachable, unavailable, or has the model unloaded (as during a restart); other errors
        (a bad request) are raised at once."""
        for attempt in range(retries + 1):
            try:
                return self.infer(model, inputs, spec)
            except (InferenceServerException, ConnectionError, OSError) as exc:
                if not is_transient(exc) or attempt == retries:
                    raise
                time.sleep(min(2.0, backoff_s * 2**attempt))
        raise AssertionError("unreachable")

    def infer(
        self, model: str, inputs: dict[str, np.ndarray], spec: ModelSpec, timeout_s: float | None = None
    ) -> dict[str, np.ndarray]:
        outputs = [self.module.InferRequestedOutput(o.name) for o in spec.outputs]
        kwargs: dict[str, Any] = {}
        if timeout_s is not None:
            key = "timeout" if self.protocol == "http" else "client_timeout"
            kwargs[key] = timeout_s if self.protocol == "grpc" else int(timeout_s * 1e6)
        result = self.client.infer(model, wire_inputs(self.module, spec, inputs), outputs=outputs, **kwargs)
        return {o.name: result.as_numpy(o.name) for o in spec.outputs}

    def is_ready(self) -> bool:
        return bool(self.client.is_server_ready())

    def statistics(self, model: str) -> dict[str, Any]:
        if self.protocol == "http":
            return self.client.get_inference_statistics(model)
        return self.client.get_inference_statistics(model, as_json=True)

    def close(self) -> None:
        self.client.close()

    def __enter__(self) -> Connection:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()
