"""The `tidepool` backend's TritonPythonModel, which <backends>/tidepool/model.py (backend/model.py,
laid out by `tidepool install-backend` and the launcher) imports: a thin layer that turns pb_utils
objects into numpy and back around `ModelInstance`."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

import numpy as np
import triton_python_backend_utils as pb_utils

from tidepool.runtime import gc_watch
from tidepool.runtime.cores import at_lower_priority, loading_niceness, prepare_openmp
from tidepool.runtime.metrics import InstanceMetrics, MetricSources, flush_interval_s
from tidepool.runtime.settings import Placement
from tidepool.runtime.validation import RequestError

if TYPE_CHECKING:  # torch loads in initialize, once the OpenMP environment is chosen
    from tidepool.runtime.instance import Execution, ModelInstance, Result

# Error codes this server's pb_utils may lack, and the nearest one it has.
CODE_FALLBACKS = {"RESOURCE_EXHAUSTED": "INVALID_ARG"}


def error_response(error: RequestError) -> Any:
    name = (
        error.code
        if hasattr(pb_utils.TritonError, error.code)
        else CODE_FALLBACKS.get(error.code, "INTERNAL")
    )
    return pb_utils.InferenceResponse(
        error=pb_utils.TritonError(str(error), getattr(pb_utils.TritonError, name))
    )


def output_tensor(name: str, value: Any) -> Any:
    if isinstance(value, np.ndarray):
        # A view of a pool block. The stub copies it into shared memory as the response is sent
        # (after execute returns, or at once through a response sender); the block stays reserved
        # until the next execute, so nothing overwrites it before then.
        return pb_utils.Tensor(name, value)
    # GPU: no copy back to the host. The tensor itself, not a capsule: the stub then asks for it
    # on its own stream, which waits for the forward pass, before it reads the memory.
    return pb_utils.Tensor.from_dlpack(name, value)


def response_for(result: Result) -> Any:
    if isinstance(result, RequestError):
        return error_response(result)
    return pb_utils.InferenceResponse(
        output_tensors=[output_tensor(name, value) for name, value in result.items()]
    )


def responses_for(execution: Execution) -> list[Any]:
    return [response_for(result) for result in execution.results]


class FailureLog:
    """What the server's log says of the model's own failures: the traceback the first time a
    failure (its last line, `Type: message`) is seen, then a line at its 10th, 100th, ... time, so
    that a client sending the same bad input again and again cannot flood the log."""

    def __init__(self) -> None:
        self.seen: dict[str, int] = {}

    def line(self, traceback_text: str) -> str:
        """The line to log for this failure, or "" for none."""
        key = traceback_text.strip().splitlines()[-1] if traceback_text.strip() else ""
        count = self.seen[key] = self.seen.get(key, 0) + 1
        if count == 1:
            return f"the model failed:\n{traceback_text}"
        if str(count).strip("0") == "1":  # 10, 100, 1000, ...
            return f"the model failed {count} times so far with: {key}"
        return ""


class TritonPythonModel:
    def initialize(self, args: dict[str, Any]) -> None:
        config = json.loads(args["model_config"])
        self.name = args["model_instance_name"]
        self.failures = FailureLog()
        notes = [prepare_openmp(config)]
        metrics_interval_s = flush_interval_s()  # a bad value is refused before the model loads
        placement = Placement.from_triton_args(args)

        def load() -> ModelInstance:
            from tidepool.runtime.instance import ModelInstance

            # For a model served by a named Python-based backend, model_repository is the model's
            # own directory (the one that holds config.pbtxt).
            return ModelInstance.load(config, args["model_repository"], placement)

        # A GPU instance loads in the main thread: CUDA's current device is per thread.
        niceness = loading_niceness() if placement.kind == "CPU" else 0
        self.instance = at_lower_priority(load, niceness)
        if niceness:
            notes.append(f"loaded at nice +{niceness}")
        sources = MetricSources(
            self.instance.pool,
            self.instance.ledgers,
            elastic=self.instance.core_share is not None,
            gc=gc_watch.start_watching(),
            sequences=self.instance.sequences is not None,
        )
        self.metrics, metrics_note = InstanceMetrics.create(
            pb_utils, args["model_name"], args["model_instance_name"], sources
        )
        if self.metrics is None:
            gc_watch.stop_watching()  # nobody to send its figures to
        else:
            self.metrics.set_plan_generation(self.instance.settings.plan_generation)
            self.metrics.flush()
            self.metrics.start(metrics_interval_s)
        lengths = self.instance.lengths
        self.answers_early = lengths is not None and lengths.pad
        if self.answers_early:
            notes.append("each request answered as its pass ends")
        pb_utils.Logger.log_info(
            f"tidepool {args['model_instance_name']}: {self.instance.describe()}; {metrics_note}"
            + "".join(f"; {note}" for note in notes if note)
        )

    def execute(self, requests: list[Any]) -> list[Any] | None:
        """The responses, in request order; for a model that runs requests of different lengths in
        passes of their own, None, each request answered through its response sender as soon as
        its pass ends, so that a short request does not wait for the long ones of its execution."""
        inputs = [{tensor.name(): tensor.as_numpy() for tensor in r.inputs()} for r in requests]
        if self.answers_early:
            senders = [request.get_response_sender() for request in requests]

            def answer(index: int, result: Result) -> None:
                senders[index].send(response_for(result), flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)

            execution = self.instance.execute(inputs, answer)
            responses = None
        else:
            execution = self.instance.execute(inputs)
            responses = responses_for(execution)
        for failure in execution.failures:  # its client was told the error's type and message only
            line = self.failures.line(failure)
            if line:
                pb_utils.Logger.log_error(f"tidepool {self.name}: {line}")
        if self.metrics is not None:
            share = self.instance.core_share
            waited_ns = share.last_wait_ns if share is not None else 0
            tokens = (execution.tokens, execution.padded_tokens)
            self.metrics.note(
                execution.batches, execution.page_faults, execution.torch_threads, waited_ns, tokens
            )
        return responses

    def finalize(self) -> None:
        if self.metrics is not None:
            self.metrics.close()
            gc_watch.stop_watching()
        self.instance.close()
